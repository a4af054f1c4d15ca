//! How many job processes this worker may have running at once, so that a herd of won ticks waits for
//! file descriptors instead of failing to start.
//!
//! Each running child holds [`FDS_PER_CHILD`] descriptors of this process (its stdout and stderr pipes
//! and the pidfd the runtime reaps it with); its watchdog's timers, and those of runs still waiting for a
//! slot, share the process's one timerfd ([`crate::clock::alarm`]). A herd of 10,000 jobs due at one
//! instant, all won here, needs 30,000 of them: with the common soft limit of 1,024 — or even 20,000 —
//! the spawns past the limit failed with `Too many open files` and their ticks, claimed and never run,
//! were lost (3,700 of 10,000 in the herd benchmark). So the worker raises its soft limit to the hard
//! one at start, and a won run waits for a slot before it spawns; a slot frees when a run's child has
//! exited and its output is read.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Descriptors a running child holds in the worker: two pipes' read ends and a pidfd.
pub(crate) const FDS_PER_CHILD: u64 = 3;
/// Descriptors kept for everything else: store connections, the listening socket, the log, the config.
const RESERVED_FDS: u64 = 256;

/// The worker's open-file limit, before and after raising the soft limit to the hard one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FdLimit {
    pub(crate) before: u64,
    pub(crate) after: u64,
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (what Go's runtime and most servers do
/// at start); returns the limits, or `None` if they cannot be read. A limit that cannot be raised stays
/// as it was: the slots are computed from what is in force.
pub(crate) fn raise_fd_limit() -> Option<FdLimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads one `rlimit` we own; lowering nothing, it only fails harmlessly.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = raised.rlim_cur;
        }
    }
    Some(FdLimit {
        before,
        after: limit.rlim_cur,
    })
}

/// How many connections the HTTP listener serves at once in `fd_limit` descriptors: a sixteenth of them,
/// at least 4 and at most 256 (64 with the common limit of 1,024). Prometheus and a prober need two.
pub(crate) fn listener_connections(fd_limit: u64) -> usize {
    usize::try_from((fd_limit / 16).clamp(4, 256)).unwrap_or(256)
}

/// The descriptors a listener serving `connections` at once may hold: one per connection and one to
/// accept and close each connection past them.
pub(crate) fn listener_fds(connections: usize) -> u64 {
    u64::try_from(connections)
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}

/// How many children fit in `fd_limit` descriptors beside the reserve and the `listener`'s descriptors
/// (at least one).
pub(crate) fn slots_for(fd_limit: u64, listener: u64) -> usize {
    let slots = fd_limit
        .saturating_sub(RESERVED_FDS)
        .saturating_sub(listener)
        / FDS_PER_CHILD;
    usize::try_from(slots.max(1)).unwrap_or(usize::MAX)
}

/// The slots for running children: a run takes one before it spawns and gives it back when its child
/// has exited and its output is read.
#[derive(Debug, Clone)]
pub(crate) struct ChildSlots {
    semaphore: Arc<Semaphore>,
    capacity: usize,
}

/// A slot held by one run.
pub(crate) type Slot = OwnedSemaphorePermit;

impl ChildSlots {
    /// `capacity` children at once.
    pub(crate) fn new(capacity: usize) -> ChildSlots {
        let capacity = capacity.clamp(1, Semaphore::MAX_PERMITS);
        ChildSlots {
            semaphore: Arc::new(Semaphore::new(capacity)),
            capacity,
        }
    }

    /// How many children may run at once.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// A slot, waiting at most `within` for one to free; `None` if none freed in time.
    pub(crate) async fn take(&self, within: Duration) -> Option<Slot> {
        let acquire = Arc::clone(&self.semaphore).acquire_owned();
        match tokio::time::timeout(within, acquire).await {
            Ok(Ok(slot)) => Some(slot),
            // The semaphore is never closed; a timeout means no slot freed in time.
            Ok(Err(_)) | Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_leave_the_reserve_and_never_reach_zero() {
        assert_eq!(slots_for(1_024, 0), (1_024 - 256) / 3);
        assert_eq!(slots_for(20_000, 0), (20_000 - 256) / 3);
        assert_eq!(slots_for(100, 0), 1);
        assert_eq!(slots_for(0, 0), 1);
    }

    #[test]
    fn the_listener_has_its_own_share_beside_the_slots() {
        assert_eq!(listener_connections(1_024), 64);
        assert_eq!(listener_connections(400), 25);
        assert_eq!(listener_connections(20), 4);
        assert_eq!(listener_connections(1 << 20), 256);
        let listener = listener_fds(listener_connections(1_024));
        assert_eq!(listener, 65);
        assert_eq!(slots_for(1_024, listener), (1_024 - 256 - 65) / 3);
        assert_eq!(slots_for(300, listener), 1);
    }

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let limit = raise_fd_limit().expect("getrlimit works on Linux");
        assert!(limit.after >= limit.before);
        let mut now = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in `raise_fd_limit`.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) }, 0);
        assert_eq!(now.rlim_cur, now.rlim_max);
    }

    #[tokio::test]
    async fn a_run_waits_for_a_slot_and_gets_it_when_one_frees() {
        let slots = ChildSlots::new(1);
        let first = slots
            .take(Duration::from_secs(1))
            .await
            .expect("a free slot");
        assert!(slots.take(Duration::from_millis(20)).await.is_none());
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.take(Duration::from_secs(30)).await.is_some() }
        });
        drop(first);
        assert!(waiting.await.expect("the waiting task ends"));
    }
}
