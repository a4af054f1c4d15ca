//! The worker's clock task: measures this host's offset to the store's clocks (the Redis nodes', the SQL
//! server's) at start and every `worker.clock_check_every`, keeps the worker's [`ClusterClock`] on it,
//! and logs what it finds.
//!
//! The tick loop only reads the clock, so a slow or failed measurement never delays the loop. Until the
//! first measurement succeeds the worker schedules no tick and claims no trigger request
//! ([`ClusterClock::is_known`]; a host clock seconds ahead would claim ticks that early, and by claiming
//! a later tick first make the earlier ones unclaimable), and measures again every second; after a
//! failed measurement it keeps the last offset. What is logged, and when, is decided by [`Reporter`],
//! which is pure so that its rules are tested without a store: the offset when first measured, then only
//! when it moved by more than 50 ms or an hour passed; a warning whenever it is above
//! `worker.max_clock_offset`; one warning per stretch of failed measurements, and a note when they
//! succeed again.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use super::Context;
use crate::clock::cluster::Estimate;
use crate::config::WorkerConfig;
use crate::lock::QuorumFailure;
use crate::logging::events;

/// How long the start waits, at most, for a first measurement before the first tick is scheduled.
const START_BUDGET: Duration = Duration::from_secs(1);
const START_RETRY: Duration = Duration::from_millis(100);
/// While measurements fail, the next one comes at least this soon.
const UNMEASURED_RETRY: Duration = Duration::from_secs(5);
/// Until the first measurement succeeds (no tick is scheduled), the next one comes this soon.
const NEVER_MEASURED_RETRY: Duration = Duration::from_secs(1);
/// A change of the offset larger than this is logged.
const REPORT_CHANGE_US: i64 = 50_000;
/// An unchanged offset is logged again after this long.
const REPORT_EVERY: Duration = Duration::from_secs(3600);

/// Measures the offset once (within about a second, also when the nodes are down), then checks it every
/// `worker.clock_check_every` in a task of its own until shutdown. `None` for a store without clocks
/// ([`crate::store::Health::read_clocks`]: etcd; the embedded store, whose only clock is this host's):
/// nothing to measure.
pub(super) async fn start(context: Arc<Context>, worker: &WorkerConfig) -> Option<JoinHandle<()>> {
    let mut task = ClockTask {
        reporter: Reporter::new(worker.max_clock_offset),
        every: worker.clock_check_every,
        context,
    };
    let started = Instant::now();
    loop {
        let result = task.context.store.measure_offset().await?;
        task.context.clock.require_measurement();
        if result.is_ok() || started.elapsed() + START_RETRY >= START_BUDGET {
            task.apply(result);
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(START_RETRY) => {}
            _ = task.context.shutdown.graceful() => return None,
        }
    }
    // Supervised ([`super::background`]): a task started again measures afresh, its reporter too.
    let (context, max_offset, every) = (
        Arc::clone(&task.context),
        worker.max_clock_offset,
        task.every,
    );
    let mut first = Some(task);
    let shutdown = context.shutdown.clone();
    Some(super::background::spawn("clock", shutdown, move || {
        let task = first.take().unwrap_or_else(|| ClockTask {
            reporter: Reporter::new(max_offset),
            every,
            context: Arc::clone(&context),
        });
        task.run()
    }))
}

struct ClockTask {
    context: Arc<Context>,
    reporter: Reporter,
    every: Duration,
}

impl ClockTask {
    async fn run(mut self) {
        loop {
            let wait = if !self.context.clock.is_measured() {
                self.every.min(NEVER_MEASURED_RETRY)
            } else if self.reporter.failing() {
                self.every.min(UNMEASURED_RETRY)
            } else {
                self.every
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.context.shutdown.graceful() => return,
            }
            if let Some(result) = self.context.store.measure_offset().await {
                self.apply(result);
            }
        }
    }

    /// Puts a measurement into effect (a failed one leaves the clock as it is) and logs it.
    fn apply(&mut self, result: Result<Estimate, QuorumFailure>) {
        let clock = &self.context.clock;
        let estimate = match result {
            Ok(estimate) => estimate,
            Err(failure) => {
                self.context.metrics.clock_unmeasured(&failure);
                if self.reporter.failed() {
                    let fallback = if clock.is_measured() {
                        "last_offset"
                    } else {
                        "local_clock"
                    };
                    let offset_ms = clock.offset().num_milliseconds();
                    if clock.is_measured() {
                        warn!(event = events::clock::UNMEASURED, error = %failure, fallback, offset_ms,
                              "Cannot measure the offset to the store's clocks; scheduling on the last known offset");
                    } else {
                        warn!(event = events::clock::UNMEASURED, error = %failure, fallback, offset_ms,
                              "Cannot measure the offset to the store's clocks; no tick is scheduled and no \
                               trigger claimed until it is measured, since this host's clock may be off");
                    }
                }
                return;
            }
        };
        clock.set(&estimate);
        self.context.metrics.clock_measured(&estimate);
        let notes = self.reporter.measured(&estimate, Instant::now());
        let (offset_ms, error_ms) = (millis(estimate.offset_us), millis_up(estimate.error_us));
        if let Some(failed_checks) = notes.recovered {
            info!(
                event = events::clock::RECOVERED,
                failed_checks, "Measured the offset to the store's clocks again"
            );
        }
        if notes.offset {
            info!(event = events::clock::OFFSET, offset_ms, error_ms, sampled = estimate.sampled,
                  configured = estimate.configured,
                  "Measured this host's clock offset to the store's clocks; ticks are scheduled on their time");
        }
        if notes.high {
            let max_offset_ms = millis(self.reporter.max_offset_us);
            warn!(event = events::clock::OFFSET_HIGH, offset_ms, error_ms, max_offset_ms,
                  "This host's clock is further off the store's clocks than worker.max_clock_offset; \
                   ticks still run on time, but check its time synchronisation (NTP)");
        }
    }
}

/// µs to ms, rounded to the nearest.
fn millis(us: i64) -> i64 {
    (us as f64 / 1000.0).round() as i64
}

/// µs to ms, rounded up (for error bounds).
fn millis_up(us: i64) -> i64 {
    us.saturating_add(999).div_euclid(1000)
}

/// Decides which clock events a measurement deserves, so the log shows every change that matters
/// without a line per check.
#[derive(Debug)]
struct Reporter {
    max_offset_us: i64,
    /// The offset last logged, and when.
    logged: Option<(i64, Instant)>,
    /// Whether the offset was above the maximum at the last measurement (and so already warned about).
    high: bool,
    /// Failed measurements since the last good one.
    failed: u32,
}

/// What to log for one good measurement.
#[derive(Debug, PartialEq, Eq)]
struct Notes {
    /// `clock.recovered`, with the number of failed measurements before this one.
    recovered: Option<u32>,
    /// `clock.offset`.
    offset: bool,
    /// `clock.offset_high`.
    high: bool,
}

impl Reporter {
    fn new(max_offset: Duration) -> Reporter {
        Reporter {
            max_offset_us: i64::try_from(max_offset.as_micros()).unwrap_or(i64::MAX),
            logged: None,
            high: false,
            failed: 0,
        }
    }

    /// A good measurement: the offset is logged the first time, after failures, when it moved by more
    /// than [`REPORT_CHANGE_US`] since last logged, and after [`REPORT_EVERY`]; an offset above the
    /// maximum is warned about when it gets there and whenever the offset is logged.
    fn measured(&mut self, estimate: &Estimate, now: Instant) -> Notes {
        let recovered = (self.failed > 0).then_some(self.failed);
        self.failed = 0;
        let offset = recovered.is_some()
            || self.logged.is_none_or(|(last, at)| {
                (estimate.offset_us - last).abs() > REPORT_CHANGE_US
                    || now.saturating_duration_since(at) >= REPORT_EVERY
            });
        if offset {
            self.logged = Some((estimate.offset_us, now));
        }
        let above = estimate.offset_us.abs() > self.max_offset_us;
        let high = above && (offset || !self.high);
        self.high = above;
        Notes {
            recovered,
            offset,
            high,
        }
    }

    /// A failed measurement; `true` for the first of a stretch (the one to warn about).
    fn failed(&mut self) -> bool {
        self.failed = self.failed.saturating_add(1);
        self.failed == 1
    }

    fn failing(&self) -> bool {
        self.failed > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset_ms: i64) -> Estimate {
        Estimate {
            offset_us: offset_ms * 1000,
            error_us: 300,
            sampled: 3,
            configured: 3,
        }
    }

    fn notes(recovered: Option<u32>, offset: bool, high: bool) -> Notes {
        Notes {
            recovered,
            offset,
            high,
        }
    }

    #[test]
    fn the_offset_is_logged_when_first_measured_then_on_changes_and_hourly() {
        let mut reporter = Reporter::new(Duration::from_millis(500));
        let t = Instant::now();
        assert_eq!(reporter.measured(&at(10), t), notes(None, true, false));
        assert_eq!(reporter.measured(&at(40), t), notes(None, false, false));
        assert_eq!(reporter.measured(&at(-41), t), notes(None, true, false));
        assert_eq!(
            reporter.measured(&at(-41), t + REPORT_EVERY / 2),
            notes(None, false, false)
        );
        assert_eq!(
            reporter.measured(&at(-41), t + REPORT_EVERY),
            notes(None, true, false)
        );
    }

    #[test]
    fn a_high_offset_is_warned_when_reached_and_with_each_logged_offset() {
        let mut reporter = Reporter::new(Duration::from_millis(500));
        let t = Instant::now();
        assert_eq!(reporter.measured(&at(480), t), notes(None, true, false));
        // Past the maximum by less than a logged change: warned all the same, once.
        assert_eq!(reporter.measured(&at(-510), t), notes(None, true, true));
        assert_eq!(reporter.measured(&at(-520), t), notes(None, false, false));
        assert_eq!(reporter.measured(&at(-2000), t), notes(None, true, true));
        assert_eq!(reporter.measured(&at(0), t), notes(None, true, false));
        assert_eq!(reporter.measured(&at(-501), t), notes(None, true, true));
    }

    #[test]
    fn failures_warn_once_per_stretch_and_the_recovery_is_noted() {
        let mut reporter = Reporter::new(Duration::from_millis(500));
        let t = Instant::now();
        assert!(reporter.failed());
        assert!(!reporter.failed());
        assert!(reporter.failing());
        assert_eq!(reporter.measured(&at(5), t), notes(Some(2), true, false));
        assert!(!reporter.failing());
        assert_eq!(reporter.measured(&at(5), t), notes(None, false, false));
        assert!(reporter.failed());
        // After a failure the offset is logged again, even unchanged.
        assert_eq!(reporter.measured(&at(5), t), notes(Some(1), true, false));
    }

    #[test]
    fn milliseconds_round_to_nearest_and_error_bounds_up() {
        assert_eq!(millis(-4_999_600), -5000);
        assert_eq!(millis(1_499), 1);
        assert_eq!(millis_up(1), 1);
        assert_eq!(millis_up(2000), 2);
    }
}
