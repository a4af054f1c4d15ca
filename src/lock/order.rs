//! Who claims a `(job, tick)` first: a rendezvous order over the live workers, so that one worker claims
//! each tick alone and the others find it claimed, instead of all of them splitting the nodes' votes.
//!
//! Every worker ranks the live workers it knows of (read from the store's membership after each heartbeat)
//! by a hash of (worker, job, tick) and waits `rank × spread` before its first claim: the first in the
//! order claims at once, the next backs it up one [`spread`] later (and finds the tick claimed, one round
//! trip, unless the first is gone or slow), and so on. The spread is a quarter of `retry_delay` plus the
//! nodes' time for the claimant's whole batch ([`NODE_TIME_PER_CLAIM`] per claim and round): in a herd the
//! first claimant's two rounds of thousands of claims take seconds, and backups that came 50 ms in
//! contended with claims on their way — one of three workers won none of a 10,000-job herd, its claims
//! overtaken by the backups of the others, and every backup cost the nodes a round. The order changes
//! from job to job and from tick to tick, so runs spread evenly over the workers. Views of the membership
//! may differ for a while (a worker joining or dying): two workers may then both rank first and contend,
//! which the protocol settles as it always did. No guarantee depends on the order; it only makes
//! contention rare.
//!
//! Without a view yet (the first heartbeat has not been read back), a worker waits a stable fraction of
//! one spread. The worker cuts the spread to the claim's window divided by the places, so that every
//! place claims within the window (`worker::race`). The embedded store has no contenders: no wait.

use std::time::Duration;

use crate::schedule::Tick;

/// A node's time to run one claim of a batch, at most, when every worker's batch reaches it at once on a
/// loaded host: the per-claim part of a claim round's budget, and of the order's spread.
pub const NODE_TIME_PER_CLAIM: Duration = Duration::from_micros(400);

/// How long each place in the order waits after the one before it, for a batch of `batch` claims due at
/// one instant: `retry_delay / 4`, plus [`NODE_TIME_PER_CLAIM`] per claim for each of the two rounds.
pub fn spread(retry_delay: Duration, batch: usize) -> Duration {
    let batch = u32::try_from(batch).unwrap_or(u32::MAX);
    retry_delay / 4 + NODE_TIME_PER_CLAIM.saturating_mul(2).saturating_mul(batch)
}

/// A worker's place in the order for `(job, tick)` among `members` (live worker ids; `me` counts even if
/// the view does not list it yet): 0 claims first.
pub fn rank(members: &[String], me: &str, job: &str, tick: Tick) -> usize {
    let mine = score(me, job, tick);
    members
        .iter()
        .filter(|member| member.as_str() != me)
        .filter(|member| {
            let theirs = score(member, job, tick);
            // Ties (never in practice) go to the smaller id, the same way on every worker.
            theirs > mine || (theirs == mine && member.as_str() < me)
        })
        .count()
}

/// How long a worker waits before its first claim of `(job, tick)`: `rank × spread` with a view of the
/// live workers, else a stable fraction of `spread` drawn from (worker, tick).
pub fn delay(
    members: Option<&[String]>,
    me: &str,
    job: &str,
    tick: Tick,
    spread: Duration,
) -> Duration {
    match members {
        Some(members) => spread * u32::try_from(rank(members, me, job, tick)).unwrap_or(u32::MAX),
        None => {
            let key = format!("{me}\n{}", tick.as_millis());
            let fraction = (fnv1a(key.as_bytes()) % 1_000_000) as f64 / 1_000_000.0;
            spread.mul_f64(fraction)
        }
    }
}

/// The rendezvous score of `member` for `(job, tick)`: FNV-1a, then a 64-bit finalizer so that the last
/// bytes (the tick) move the high bits too, which decide the order.
fn score(member: &str, job: &str, tick: Tick) -> u64 {
    let key = format!("{member}\n{job}\n{}", tick.as_millis());
    let mut h = fnv1a(key.as_bytes());
    // MurmurHash3's fmix64.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// FNV-1a, 64 bits: stable across platforms and releases, which a hash that workers compare (or derive
/// agreed timings from) must be.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members() -> Vec<String> {
        ["w0", "w1", "w2"].map(String::from).to_vec()
    }

    #[test]
    fn every_tick_has_exactly_one_first_and_distinct_ranks() {
        let members = members();
        for tick in 0..200 {
            let mut ranks: Vec<usize> = members
                .iter()
                .map(|me| rank(&members, me, "job", Tick(tick * 1000)))
                .collect();
            ranks.sort_unstable();
            assert_eq!(ranks, vec![0, 1, 2], "tick {tick}");
        }
    }

    #[test]
    fn the_first_place_spreads_evenly_over_workers_and_jobs() {
        let members = members();
        let mut firsts = [0usize; 3];
        for job in 0..100 {
            for tick in 0..30 {
                let job = format!("j{job}");
                for (index, me) in members.iter().enumerate() {
                    if rank(&members, me, &job, Tick(tick * 1000)) == 0 {
                        firsts[index] += 1;
                    }
                }
            }
        }
        // 3,000 (job, tick) pairs: about 1,000 each; a skewed hash would put one worker far off.
        for count in firsts {
            assert!((850..=1150).contains(&count), "{firsts:?}");
        }
    }

    #[test]
    fn a_worker_missing_from_the_view_still_takes_its_place() {
        let view: Vec<String> = ["w0", "w1"].map(String::from).to_vec();
        let all = members();
        for tick in 0..50 {
            let tick = Tick(tick * 1000);
            assert_eq!(
                rank(&view, "w2", "job", tick),
                rank(&all, "w2", "job", tick)
            );
        }
    }

    #[test]
    fn the_spread_grows_with_the_batch() {
        let retry_delay = Duration::from_millis(200);
        assert_eq!(spread(retry_delay, 1), Duration::from_micros(50_800));
        assert_eq!(spread(retry_delay, 10_000), Duration::from_millis(8_050));
    }

    #[test]
    fn the_delay_is_rank_quarters_with_a_view_and_a_fraction_without() {
        let spread = Duration::from_millis(50);
        let members = members();
        let tick = Tick(7_000);
        for me in &members {
            let expected = spread * rank(&members, me, "job", tick) as u32;
            assert_eq!(delay(Some(&members), me, "job", tick, spread), expected);
        }
        assert!(delay(None, "w0", "job", tick, spread) < spread);
    }
}
