//! Cluster time: this host's wall clock corrected by its measured offset to the Redis nodes' clocks.
//!
//! Ticks are instants on one time line, but each worker reads that line from its own wall clock. A worker
//! whose clock runs ahead races ticks early and, by claiming a tick before the earlier ones were claimed,
//! makes them unclaimable; a worker whose clock runs behind comes late. The Redis nodes are the one thing
//! every worker talks to, so their clocks are the shared reference: a worker asks each node for `TIME`,
//! estimates its offset to each ([`Sample::offset_us`], corrected for the round trip as NTP does), and
//! takes the median over at least a majority of the configured nodes ([`estimate`]). A [`ClusterClock`]
//! then tells *cluster time*: the nodes' time as last measured (this host's wall clock plus that offset,
//! at the measurement), carried forward on the boot clock — the same instant on every worker to within the
//! measurement's error, whatever the hosts' own clocks say, and whatever they do between measurements.
//!
//! Carried forward on the boot clock, not re-read from the wall clock: a wall clock that steps (an
//! operator's `date -s`, NTP stepping a clock it found far off, a VM resumed with a stale clock) would
//! otherwise move cluster time by the step until the next measurement, and a worker stepped 3 s ahead
//! raced the next ticks 3 s early (claiming a later tick first makes the earlier ones unclaimable for
//! every worker) and passed over the ticks in between. The boot clock
//! never steps; it is slewed at the same rate as the wall clock, so over a measurement interval the two
//! part by parts per million. The next measurement takes the stepped wall clock into account: it
//! measures the offset anew, and cluster time goes on where the nodes' clocks say.
//!
//! The median cannot be moved outside the range of the correct nodes' clocks by wrong ones as long as
//! they are fewer than half of the samples: with every node answering, by any minority of the nodes.
//! Fewer samples than a majority of the configured nodes give no measurement at all, so a worker on the
//! minority side of a partition keeps its last offset rather than adopting a minority's clocks.
//!
//! Only *when* a worker wakes for a tick depends on this; safety never does (`docs/protocol.md`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::boot::BootInstant;

/// The latest `TIME` a node may answer and be believed: 9999-12-31T23:59:59Z, in seconds.
const LATEST_SECONDS: i64 = 253_402_300_799;

/// One `TIME` exchange with one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// The node's index among the configured nodes.
    pub node: usize,
    /// This host's wall clock (µs since the epoch) just before the request was sent. The wall clock,
    /// because the offset is between wall clocks: the node's `TIME` is its wall clock, and cluster time
    /// is this host's wall clock plus the offset.
    pub sent_us: i64,
    /// The round trip, measured on the monotonic clock: a wall-clock step (NTP) during the exchange
    /// would make a round trip measured on the wall clock wrong, even negative.
    pub rtt: Duration,
    /// The node's `TIME` (µs since the epoch), taken somewhere within the round trip.
    pub node_us: i64,
}

impl Sample {
    /// The node's clock minus this host's, assuming the node read its clock at the middle of the round
    /// trip; off by at most [`Sample::error_us`] either way.
    pub fn offset_us(&self) -> i64 {
        self.node_us - self.sent_us.saturating_add(self.rtt_us() / 2)
    }

    /// Half the round trip, rounded up: the node read its clock between sending and receiving, so the
    /// true offset is within this of [`Sample::offset_us`].
    pub fn error_us(&self) -> i64 {
        self.rtt_us().saturating_add(1) / 2
    }

    fn rtt_us(&self) -> i64 {
        i64::try_from(self.rtt.as_micros()).unwrap_or(i64::MAX)
    }
}

/// What one round of `TIME` to every node returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Readings {
    /// How many nodes are configured (a majority of them must answer).
    pub configured: usize,
    /// The good answers.
    pub samples: Vec<Sample>,
    /// `(node address without password, what went wrong)` for every node that gave no good answer.
    pub failures: Vec<(String, String)>,
}

/// A measured offset of this host's clock to the nodes' clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// Cluster time minus this host's wall clock, in µs: negative when this host's clock is ahead.
    pub offset_us: i64,
    /// Every sampled node's offset is known within this many µs (half the slowest round trip used).
    pub error_us: i64,
    /// How many distinct nodes were sampled.
    pub sampled: usize,
    /// How many nodes are configured.
    pub configured: usize,
}

/// Why no offset could be measured: too few nodes answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{sampled} of {configured} nodes answered TIME, {needed} needed")]
pub struct TooFewSamples {
    pub sampled: usize,
    pub configured: usize,
    pub needed: usize,
}

/// The cluster offset from `samples` (of any number of rounds) against `configured` nodes, of which
/// `needed` (a majority: the store decides) must have answered.
///
/// Of several samples of one node only the one with the shortest round trip counts (the least
/// uncertain, as in NTP); samples naming a node that is not configured are ignored. The offset is the
/// median of the nodes' offsets (the mean of the middle two for an even count).
pub fn estimate(
    samples: &[Sample],
    configured: usize,
    needed: usize,
) -> Result<Estimate, TooFewSamples> {
    let mut best: Vec<Option<&Sample>> = vec![None; configured];
    for sample in samples.iter().filter(|sample| sample.node < configured) {
        let slot = &mut best[sample.node];
        if slot.is_none_or(|kept| sample.rtt < kept.rtt) {
            *slot = Some(sample);
        }
    }
    let best: Vec<&Sample> = best.into_iter().flatten().collect();
    if best.len() < needed {
        return Err(TooFewSamples {
            sampled: best.len(),
            configured,
            needed,
        });
    }
    let mut offsets: Vec<i64> = best.iter().map(|sample| sample.offset_us()).collect();
    offsets.sort_unstable();
    let middle = offsets.len() / 2;
    let offset_us = if offsets.len() % 2 == 1 {
        offsets[middle]
    } else {
        offsets[middle - 1] + (offsets[middle] - offsets[middle - 1]) / 2
    };
    Ok(Estimate {
        offset_us,
        error_us: best.iter().map(|s| s.error_us()).max().unwrap_or(0),
        sampled: best.len(),
        configured,
    })
}

/// A node's `TIME` reply (seconds and microseconds, as decimal text) in µs since the epoch.
///
/// The reply is data from the network: anything but two whole numbers with the microseconds below one
/// million and the seconds between the epoch and the year 9999 is refused, with what was wrong.
pub fn node_time_us(seconds: &str, micros: &str) -> Result<i64, String> {
    let bad = || format!("bad TIME reply [{seconds:?}, {micros:?}]");
    let seconds: i64 = seconds.parse().map_err(|_| bad())?;
    let micros: i64 = micros.parse().map_err(|_| bad())?;
    if !(1..=LATEST_SECONDS).contains(&seconds) || !(0..1_000_000).contains(&micros) {
        return Err(bad());
    }
    Ok(seconds * 1_000_000 + micros)
}

/// Cluster time: the nodes' time as last measured, carried forward on the boot clock (see the module's
/// doc). Cheap to clone; clones share the measurement.
///
/// Starts as this host's own wall clock (not measured): the embedded store has no other clock, and a
/// worker that cannot reach the nodes keeps it until it can — but, once the store is known to have clocks
/// ([`ClusterClock::require_measurement`]), schedules no tick before the first measurement
/// ([`ClusterClock::is_known`]): a host clock seconds ahead would claim ticks that early.
#[derive(Debug, Clone, Default)]
pub struct ClusterClock {
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The latest measurement: cluster time at a point of the boot clock.
    anchor: Mutex<Option<Anchor>>,
    /// Woken when cluster time moves (a measurement that disagrees with the one before), so that a sleep
    /// until a tick can be recomputed.
    moved: tokio::sync::Notify,
    /// Whether cluster time is the store's clocks, and so unknown until measured.
    required: AtomicBool,
}

/// Cluster time `cluster_us` (µs since the epoch) read at `boot` on the boot clock.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    cluster_us: i64,
    boot: BootInstant,
}

impl Anchor {
    /// Cluster time at `boot`, µs since the epoch.
    fn at(&self, boot: BootInstant) -> i64 {
        let since = i64::try_from(boot.saturating_duration_since(self.boot).as_micros());
        self.cluster_us.saturating_add(since.unwrap_or(i64::MAX))
    }
}

/// A new measurement moves cluster time (wakes [`ClusterClock::moved`]) only if it disagrees with the
/// previous one by more than this: each measurement differs from the last by its error, microseconds.
const MOVED_US: i64 = 1_000;

impl ClusterClock {
    /// This host's own clock: not measured.
    pub fn local() -> ClusterClock {
        ClusterClock::default()
    }

    /// Now in cluster time.
    pub fn now(&self) -> DateTime<Utc> {
        match self.anchor() {
            Some(anchor) => {
                let us = anchor.at(BootInstant::now());
                DateTime::from_timestamp_micros(us).unwrap_or(DateTime::<Utc>::MAX_UTC)
            }
            None => Utc::now(),
        }
    }

    /// Cluster time minus this host's wall clock now (zero until measured; after a step of the wall
    /// clock, the step until the next measurement).
    pub fn offset(&self) -> chrono::Duration {
        match self.anchor() {
            Some(anchor) => {
                let wall = wall_now_us();
                chrono::Duration::microseconds(anchor.at(BootInstant::now()).saturating_sub(wall))
            }
            None => chrono::Duration::zero(),
        }
    }

    /// Whether cluster time came from a measurement (the latest, or an earlier one carried forward while
    /// the nodes cannot be measured).
    pub fn is_measured(&self) -> bool {
        self.anchor().is_some()
    }

    /// Says that cluster time is the store's clocks: until the first measurement, [`ClusterClock::now`]
    /// is only this host's guess, and [`ClusterClock::is_known`] is `false`.
    pub fn require_measurement(&self) {
        self.state.required.store(true, Ordering::Release);
    }

    /// Whether [`ClusterClock::now`] is cluster time: measured at least once, or this host's own clock
    /// where the store has no other ([`ClusterClock::require_measurement`] never called). Ticks are
    /// scheduled, and windows judged ended, only on a known cluster time.
    pub fn is_known(&self) -> bool {
        !self.state.required.load(Ordering::Acquire) || self.is_measured()
    }

    /// Uses `estimate` (an offset to this host's wall clock, measured just now) from now on, and wakes
    /// [`ClusterClock::moved`] if cluster time moved by it.
    pub fn set(&self, estimate: &Estimate) {
        let boot = BootInstant::now();
        let anchor = Anchor {
            cluster_us: wall_now_us().saturating_add(estimate.offset_us),
            boot,
        };
        let before = self.lock().replace(anchor);
        let moved =
            before.is_none_or(|before| (before.at(boot) - anchor.cluster_us).abs() > MOVED_US);
        if moved {
            self.state.moved.notify_waiters();
        }
    }

    fn anchor(&self) -> Option<Anchor> {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Anchor>> {
        // Every use is one read or one write of a `Copy` value: a panic elsewhere leaves it whole.
        self.state
            .anchor
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Resolves when the offset next changes: a sleep until an instant of cluster time, computed with the
    /// old offset, is then off by the change and must be recomputed.
    pub async fn moved(&self) {
        self.state.moved.notified().await;
    }
}

/// This host's wall clock in µs since the epoch (the clock [`ClusterClock::now`] corrects).
pub fn wall_now_us() -> i64 {
    Utc::now().timestamp_micros()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_800_000_000_000_000;

    /// A sample of `node` whose clock is `offset_ms` off ours, with a round trip of `rtt_ms`.
    fn sample(node: usize, offset_ms: i64, rtt_ms: u64) -> Sample {
        let rtt = Duration::from_millis(rtt_ms);
        Sample {
            node,
            sent_us: T,
            rtt,
            node_us: T + (rtt_ms as i64) * 500 + offset_ms * 1000,
        }
    }

    /// [`sample`] of each `(node, offset_ms, rtt_ms)`.
    fn samples(spec: &[(usize, i64, u64)]) -> Vec<Sample> {
        spec.iter()
            .map(|&(node, offset_ms, rtt_ms)| sample(node, offset_ms, rtt_ms))
            .collect()
    }

    #[test]
    fn offset_is_corrected_for_half_the_round_trip() {
        // Sent at T, answered 40 ms later, the node said T + 25 ms: it read its clock at T + 20 ms (ours)
        // under the midpoint assumption, so it is 5 ms ahead, give or take 20 ms.
        let s = Sample {
            node: 0,
            sent_us: T,
            rtt: Duration::from_millis(40),
            node_us: T + 25_000,
        };
        assert_eq!(s.offset_us(), 5_000);
        assert_eq!(s.error_us(), 20_000);
        // An odd µs of round trip rounds the error up, never down.
        let odd = Sample {
            rtt: Duration::from_micros(3),
            ..s
        };
        assert_eq!(odd.error_us(), 2);
    }

    #[test]
    fn the_median_ignores_a_minority_of_wrong_clocks() {
        let samples = samples(&[
            (0, -5000, 2),
            (1, 3, 2),
            (2, 1, 2),
            (3, 2, 2),
            (4, 90_000, 2),
        ]);
        let e = estimate(&samples, 5, 3).unwrap();
        assert_eq!(e.offset_us, 2_000);
        assert_eq!(e.error_us, 1_000);
        assert_eq!((e.sampled, e.configured), (5, 5));
    }

    #[test]
    fn an_even_count_takes_the_middle_of_the_two_middle_offsets() {
        let samples = samples(&[(0, 10, 0), (1, 20, 0), (2, 40, 0), (3, 900, 0)]);
        assert_eq!(estimate(&samples, 5, 3).unwrap().offset_us, 30_000);
    }

    #[test]
    fn a_majority_of_the_configured_nodes_must_answer() {
        let two = [sample(0, 1, 1), sample(1, 1, 1)];
        assert_eq!(
            estimate(&two, 5, 3),
            Err(TooFewSamples {
                sampled: 2,
                configured: 5,
                needed: 3
            })
        );
        assert!(estimate(&two, 3, 2).is_ok());
        // Two samples of one node count once.
        let same = [sample(0, 1, 1), sample(0, 1, 2)];
        assert_eq!(estimate(&same, 3, 2).unwrap_err().sampled, 1);
        // A node that is not configured does not count.
        let stray = [sample(0, 1, 1), sample(7, 1, 1)];
        assert_eq!(estimate(&stray, 3, 2).unwrap_err().sampled, 1);
        assert!(estimate(&[], 0, 1).is_err());
    }

    #[test]
    fn the_shortest_round_trip_of_each_node_counts() {
        // Node 0's first exchange waited for the connection (300 ms) and is 100 ms off; its second is exact.
        let samples = samples(&[(0, 100, 300), (1, 0, 2), (0, 0, 2), (2, 0, 4)]);
        let e = estimate(&samples, 3, 2).unwrap();
        assert_eq!(e.offset_us, 0);
        assert_eq!(e.error_us, 2_000);
    }

    #[test]
    fn bad_time_replies_are_refused() {
        assert_eq!(
            node_time_us("1800000000", "123456"),
            Ok(1_800_000_000_123_456)
        );
        for (seconds, micros) in [
            ("1800000000", "1000000"),
            ("1800000000", "-1"),
            ("0", "5"),
            ("-3", "5"),
            ("253402300800", "0"),
            ("18e8", "0"),
            ("", "0"),
            ("1800000000", "x"),
        ] {
            let refused = node_time_us(seconds, micros);
            assert!(refused.is_err(), "{seconds:?} {micros:?} gave {refused:?}");
        }
    }

    #[test]
    fn the_clock_adds_the_offset_and_clones_share_it() {
        let clock = ClusterClock::local();
        assert!(!clock.is_measured());
        assert_eq!(clock.offset(), chrono::Duration::zero());
        let shared = clock.clone();
        clock.set(&Estimate {
            offset_us: -5_000_000,
            error_us: 100,
            sampled: 3,
            configured: 3,
        });
        assert!(shared.is_measured());
        let cluster_now = shared.now();
        let skew = Utc::now() - cluster_now;
        assert!(skew >= chrono::Duration::seconds(5) && skew < chrono::Duration::seconds(6));
    }

    #[test]
    fn a_clock_that_must_be_measured_is_unknown_until_it_is() {
        let local = ClusterClock::local();
        assert!(
            local.is_known(),
            "the host's own clock is the embedded store's"
        );
        let clock = ClusterClock::local();
        let shared = clock.clone();
        clock.require_measurement();
        assert!(!shared.is_known());
        shared.set(&Estimate {
            offset_us: 0,
            error_us: 100,
            sampled: 3,
            configured: 3,
        });
        assert!(clock.is_known());
    }
}
