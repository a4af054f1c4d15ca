//! The clock that leases are measured on: `CLOCK_BOOTTIME`, which keeps counting while the host is
//! suspended.
//!
//! A lease's validity is a span of real time on the nodes' clocks. `CLOCK_MONOTONIC` (tokio's `Instant`)
//! stops while the host sleeps, so a worker resumed after a suspend would still believe in a lease whose
//! keys expired on the nodes long ago and could start a job on it. `CLOCK_BOOTTIME` is the same clock
//! plus the time spent suspended, so a deadline measured on it has passed when it should.
//!
//! [`sleep_until`] waits on a `timerfd` armed on `CLOCK_BOOTTIME` (one for the whole process, see
//! [`super::alarm`]), which fires as soon as the host resumes past the deadline — a tokio timer would fire
//! only after the monotonic clock caught up.

use std::time::Duration;

/// A point on `CLOCK_BOOTTIME`: the time since boot, suspend included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BootInstant(Duration);

impl BootInstant {
    /// Now on `CLOCK_BOOTTIME`.
    pub fn now() -> BootInstant {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on every Linux since 2.6.39,
        // and clock_gettime cannot fail with a valid clock id and pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        BootInstant(Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        ))
    }

    /// How long after `earlier` this instant is; zero if it is not after it.
    pub fn saturating_duration_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// How long ago this instant was; zero if it is in the future.
    pub fn elapsed(self) -> Duration {
        BootInstant::now().saturating_duration_since(self)
    }

    /// How long until this instant; zero if it has passed.
    pub fn remaining(self) -> Duration {
        self.saturating_duration_since(BootInstant::now())
    }

    /// This instant plus `duration`, saturating at the end of time.
    pub fn saturating_add(self, duration: Duration) -> BootInstant {
        BootInstant(self.0.saturating_add(duration))
    }

    /// This instant minus `duration`, saturating at boot.
    pub fn saturating_sub(self, duration: Duration) -> BootInstant {
        BootInstant(self.0.saturating_sub(duration))
    }

    /// The time from boot to this instant: the same number in every process of this host (until it
    /// reboots, see [`boot_id`]), so it can be stored where other processes read it.
    pub fn since_boot(self) -> Duration {
        self.0
    }

    /// The instant `since_boot` after this host's boot; the inverse of [`BootInstant::since_boot`].
    pub fn from_since_boot(since_boot: Duration) -> BootInstant {
        BootInstant(since_boot)
    }
}

/// Where Linux keeps a random id of the current boot.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// This host's boot id: the same in every process until the host reboots, then new. A point on the boot
/// clock means something only together with the boot it was read in.
pub fn boot_id() -> std::io::Result<String> {
    let id = std::fs::read_to_string(BOOT_ID_PATH)?;
    Ok(id.trim().to_string())
}

impl std::ops::Add<Duration> for BootInstant {
    type Output = BootInstant;

    fn add(self, duration: Duration) -> BootInstant {
        self.saturating_add(duration)
    }
}

/// Starts the process's alarm (one timerfd and its thread, [`super::alarm`]) now rather than at the first
/// wait, which may come in the middle of a herd; the error if it cannot be made, and waits then check the
/// boot clock once a second.
pub fn start_alarm() -> Result<(), &'static std::io::Error> {
    super::alarm::shared().map(drop)
}

/// Waits until `deadline` on `CLOCK_BOOTTIME`; returns at once if it has passed. Cancel-safe.
///
/// Waits on the process's one timerfd ([`super::alarm`]). Falls back to tokio timers (re-checking the boot
/// clock at least once a second) if that cannot be made, so a deadline is never missed by more than a
/// second after a resume even then.
pub async fn sleep_until(deadline: BootInstant) {
    if deadline <= BootInstant::now() {
        return;
    }
    if let Ok(alarm) = super::alarm::shared() {
        return alarm.sleep_until(deadline).await;
    }
    loop {
        let left = deadline.remaining();
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(Duration::from_secs(1))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_advances() {
        let a = BootInstant::now();
        std::thread::sleep(Duration::from_millis(5));
        let b = BootInstant::now();
        assert!(b > a);
        assert!(b.saturating_duration_since(a) >= Duration::from_millis(5));
        assert_eq!(a.saturating_duration_since(b), Duration::ZERO);
    }

    #[test]
    fn the_boot_id_is_stable_within_a_boot() {
        let id = boot_id().expect("a Linux host has a boot id");
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(boot_id().expect("read again"), id);
        let now = BootInstant::now();
        assert_eq!(BootInstant::from_since_boot(now.since_boot()), now);
    }

    #[tokio::test]
    async fn sleep_until_waits_for_the_deadline_and_not_much_longer() {
        let start = BootInstant::now();
        sleep_until(start + Duration::from_millis(50)).await;
        let slept = start.elapsed();
        assert!(slept >= Duration::from_millis(50), "woke after {slept:?}");
        // A passed deadline returns at once.
        let again = BootInstant::now();
        sleep_until(start).await;
        assert!(again.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn sleep_until_is_cancel_safe() {
        let far = BootInstant::now() + Duration::from_secs(3600);
        let woke = tokio::time::timeout(Duration::from_millis(20), sleep_until(far)).await;
        assert!(woke.is_err());
    }
}
