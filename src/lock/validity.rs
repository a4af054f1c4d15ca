//! The validity arithmetic of a lease, free of I/O so it can be tested exhaustively.

use std::time::Duration;

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

#[cfg(test)]
mod tests {
    use super::*;

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
