//! The validity arithmetic of a lease, free of I/O so it can be tested exhaustively.

use std::time::Duration;

use super::LockSettings;

/// The longest default stop grace: a job that ignores SIGTERM is killed at most this long after it.
pub const MAX_DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);

/// Allowed clock drift for a lease of `ttl`: `ttl × drift_factor + 2 ms` (the Redlock paper's rule; the
/// 2 ms cover the granularity of Redis's expiry).
pub fn drift(ttl: Duration, drift_factor: f64) -> Duration {
    let factor = if drift_factor.is_finite() && drift_factor > 0.0 {
        drift_factor
    } else {
        0.0
    };
    ttl.mul_f64(factor) + Duration::from_millis(2)
}

/// The validity left after an acquisition that took `elapsed`: `ttl − elapsed − drift`, or `None` when that
/// is not positive.
///
/// Checked arithmetic on purpose: two peers compute this with unchecked subtraction and report a lock as
/// valid after it expired when the acquisition was slow or the TTL tiny.
pub fn validity(ttl: Duration, elapsed: Duration, drift_factor: f64) -> Option<Duration> {
    ttl.checked_sub(elapsed)?
        .checked_sub(drift(ttl, drift_factor))
        .filter(|left| !left.is_zero())
}

/// How much validity a running job's lease has left when its watchdog renews it: `ttl − drift −
/// renew_every`, so that renewals come `renew_every` apart, counted from the start of the last
/// successful one (or of the claim).
pub fn renew_when_left(settings: &LockSettings) -> Duration {
    settings
        .ttl
        .saturating_sub(drift(settings.ttl, settings.drift_factor))
        .saturating_sub(settings.renew_every)
}

/// The lease's slack: `ttl − drift − renew_every − node_timeout`, the validity that is still left, at
/// the least, when a renewal sent on schedule is confirmed (its round takes up to `node_timeout`);
/// `None` when that is not positive, i.e. a renewal on schedule may be confirmed too late to keep the
/// lease.
///
/// A job is stopped once its lease has only its `stop_grace` left without a renewal, so `stop_grace`
/// must be below the slack, or a healthy run would be stopped while its renewal is on its way.
pub fn renewal_slack(settings: &LockSettings) -> Option<Duration> {
    renew_when_left(settings)
        .checked_sub(settings.node_timeout)
        .filter(|slack| !slack.is_zero())
}

/// The default stop grace: half the slack (the other half is the margin for a late renewal), at most
/// [`MAX_DEFAULT_STOP_GRACE`], to the millisecond; zero when there is no slack.
pub fn default_stop_grace(settings: &LockSettings) -> Duration {
    let half = renewal_slack(settings).unwrap_or_default() / 2;
    let millis = u64::try_from(half.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(millis).min(MAX_DEFAULT_STOP_GRACE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(ttl: u64, renew_every: u64, node_timeout: u64) -> LockSettings {
        LockSettings {
            ttl: ms(ttl),
            renew_every: ms(renew_every),
            node_timeout: ms(node_timeout),
            ..LockSettings::default()
        }
    }

    #[test]
    fn slack_is_what_is_left_after_a_renewal_on_schedule() {
        // 2 s TTL: drift = 20 ms + 2 ms; 2000 − 22 − 500 − 100.
        let lock = settings(2_000, 500, 100);
        assert_eq!(renew_when_left(&lock), ms(2_000 - 22 - 500));
        assert_eq!(renewal_slack(&lock), Some(ms(1_378)));
        assert_eq!(default_stop_grace(&lock), ms(689));
    }

    #[test]
    fn default_stop_grace_is_at_most_ten_seconds() {
        // The defaults: 30 s − 302 ms − 10 s − 50 ms = 19.648 s of slack; half is 9.824 s.
        assert_eq!(default_stop_grace(&LockSettings::default()), ms(9_824));
        assert_eq!(
            default_stop_grace(&settings(300_000, 100_000, 50)),
            ms(10_000)
        );
    }

    #[test]
    fn no_slack_when_a_renewal_on_schedule_may_come_too_late() {
        // 1000 − 12 − 888 − 100 = 0.
        assert_eq!(renewal_slack(&settings(1_000, 888, 100)), None);
        assert_eq!(renewal_slack(&settings(1_000, 900, 100)), None);
        assert_eq!(renewal_slack(&settings(1_000, 887, 100)), Some(ms(1)));
        assert_eq!(
            default_stop_grace(&settings(1_000, 900, 100)),
            Duration::ZERO
        );
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        // 10 s TTL: drift = 100 ms + 2 ms.
        assert_eq!(
            validity(ms(10_000), ms(5), 0.01),
            Some(ms(10_000 - 5 - 102))
        );
    }

    #[test]
    fn tiny_ttl_has_no_validity_instead_of_underflowing() {
        assert_eq!(validity(ms(1), Duration::ZERO, 0.01), None);
        assert_eq!(validity(ms(2), Duration::ZERO, 0.0), None);
        assert_eq!(validity(Duration::ZERO, Duration::ZERO, 0.01), None);
    }

    #[test]
    fn slow_acquisition_has_no_validity_instead_of_underflowing() {
        assert_eq!(validity(ms(100), ms(99), 0.01), None);
        assert_eq!(validity(ms(100), ms(100), 0.01), None);
        assert_eq!(validity(ms(100), ms(10_000), 0.01), None);
        assert_eq!(validity(ms(100), Duration::MAX, 0.01), None);
    }

    #[test]
    fn validity_is_strictly_below_ttl() {
        for ttl in [3, 10, 100, 1_000, 30_000] {
            if let Some(left) = validity(ms(ttl), Duration::ZERO, 0.01) {
                assert!(left < ms(ttl));
            }
        }
    }

    #[test]
    fn nonsensical_drift_factor_counts_as_zero() {
        assert_eq!(drift(ms(1000), f64::NAN), ms(2));
        assert_eq!(drift(ms(1000), -1.0), ms(2));
    }
}
