//! How long a store waits for its nodes: the configured budget, stretched while the nodes as a whole
//! answer slowly. Shared by the Redis store (a round's wait for a majority, `redis/round.rs`) and the
//! etcd store (a request's wait for a member, and when to ask the next one, `etcd/cluster.rs`).
//!
//! A round is decided as soon as a majority has answered (on etcd: as soon as one member answered for
//! the cluster), so its budget only bounds the wait for nodes that do not answer; one hung node costs
//! nothing. But when the nodes *all* answer late — the host is saturated (a burst of spawns, other
//! tenants) and the nodes share its cores — a fixed budget gives up on answers that are on their way. The
//! nodes did the work anyway (a claim's writes must then be undone or read back), the claim is retried
//! with more work for them, and throughput collapses: at 1,000 jobs per second on two cores, two Redis
//! rounds in three missed their budget and most ticks were skipped as `no_quorum` while every node was
//! alive; a herd of 2,000 jobs on three etcd members sharing two cores with its spawns had every request
//! of a few hundred jobs time out, and race again, for the jobs' whole 30 s window.
//!
//! So each round reports when its majority had answered, as a fraction of its configured budget — a round
//! that gave up first keeps listening in the background for the late answers — and later rounds wait up to
//! [`MARGIN`] times the recent worst of that fraction (decaying slowly), never less than configured, never
//! more than [`MAX_STRETCH`] times it. Nodes that do not answer at all (hung, down, cut off) report
//! nothing, so they stretch nothing: a hung majority beside a node that answered is given up after the
//! configured budget, as before. Nor does a majority that came later than `MAX_STRETCH` budgets: that is
//! this process stopped, not the nodes slow. (A Redis round that has heard from no node at all when its
//! budget passes waits on to its longest wait instead: the first batches of a herd, sent before any answer
//! could stretch the pace, find every node busy; see `redis/round.rs`.)
//!
//! Safety does not depend on the budget: a claim's validity is the TTL less the time it took, and the
//! confirming round and a renewal are still bounded by the lease's deadline.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// How much longer than the recent worst majority a round waits.
pub(crate) const MARGIN: f64 = 3.0;
/// The longest stretch of a configured budget.
pub(crate) const MAX_STRETCH: f64 = 10.0;
/// One observation below the current stretch takes back 1 / `DECAY_STEPS` of the distance.
const DECAY_STEPS: u32 = 16;

/// The stretch applied to round budgets, shared by every round of one store.
#[derive(Debug)]
pub(crate) struct Pace {
    /// The stretch in thousandths (1,000: the configured budget).
    stretch_milli: AtomicU32,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            stretch_milli: AtomicU32::new(1_000),
        }
    }
}

impl Pace {
    /// The current stretch (≥ 1).
    pub(crate) fn stretch(&self) -> f64 {
        f64::from(self.stretch_milli.load(Ordering::Relaxed)) / 1_000.0
    }

    /// `configured` stretched.
    pub(crate) fn budget(&self, configured: Duration) -> Duration {
        configured.mul_f64(self.stretch())
    }

    /// A round whose configured budget was `configured` heard from a majority of nodes after `elapsed`.
    pub(crate) fn majority_after(&self, elapsed: Duration, configured: Duration) {
        // Later than the longest wait: this process was more likely stopped (SIGSTOP, a VM freeze) than
        // the nodes slow, and the next rounds need no more time for that.
        if configured.is_zero() || elapsed > configured.mul_f64(MAX_STRETCH) {
            return;
        }
        let target = to_milli(MARGIN * elapsed.as_secs_f64() / configured.as_secs_f64());
        // Rounds finish on several threads at once: one update must not overwrite another's.
        let _ = self
            .stretch_milli
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(if target >= now {
                    target
                } else {
                    // Down by a sixteenth of the distance, at least one thousandth, so it reaches the
                    // target.
                    now - (now - target).div_ceil(DECAY_STEPS)
                })
            });
    }
}

/// A stretch in thousandths, within its bounds.
fn to_milli(stretch: f64) -> u32 {
    (stretch.clamp(1.0, MAX_STRETCH) * 1_000.0).round() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn fast_majorities_keep_the_configured_budget() {
        let pace = Pace::default();
        for _ in 0..100 {
            pace.majority_after(ms(2), ms(50));
        }
        assert_eq!(pace.budget(ms(50)), ms(50));
    }

    #[test]
    fn slow_majorities_stretch_at_once_and_relax_slowly() {
        let pace = Pace::default();
        pace.majority_after(ms(100), ms(50));
        assert_eq!(pace.budget(ms(50)), ms(300));
        pace.majority_after(ms(1), ms(50));
        let relaxed = pace.budget(ms(50));
        assert!(relaxed < ms(300) && relaxed > ms(250), "{relaxed:?}");
        for _ in 0..200 {
            pace.majority_after(ms(1), ms(50));
        }
        assert_eq!(pace.budget(ms(50)), ms(50));
    }

    #[test]
    fn the_stretch_is_bounded_and_a_stopped_process_stretches_nothing() {
        let pace = Pace::default();
        pace.majority_after(ms(10), ms(1));
        assert_eq!(pace.stretch(), MAX_STRETCH);
        assert_eq!(pace.budget(ms(100)), ms(1_000));
        let pace = Pace::default();
        pace.majority_after(ms(5_000), ms(50));
        assert_eq!(pace.budget(ms(50)), ms(50));
    }
}
