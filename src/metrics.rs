//! The worker's metrics: one registry, and one named function per fact the worker records.
//!
//! The worker calls one line where it logs a fact (`metrics.run_finished(job, outcome, duration, at)`
//! next to `run.finished`), and `/metrics` ([`crate::worker`]'s listener) serves [`Metrics::encode`].
//! Built on `prometheus-client`, the official Rust client of the Prometheus project: a registry owned by
//! the worker rather than a process-global one (so tests build their own), typed label sets (a label
//! per job, outcome or reason — never per tick or run id, which would grow without bound), and the
//! OpenMetrics text format, which Prometheus reads. Counters and gauges are atomics. A family finds an
//! existing series under a shared read lock, and a histogram adds an observation under a mutex held for
//! a few additions; nothing here waits for I/O or is held across an `.await`, so recording never
//! delays a tick.
//!
//! Names follow Prometheus' conventions: `redcron_<what>_<unit>`, `_total` for counters (added by the
//! encoder), seconds as the unit of time.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::clock::cluster::Estimate;
use crate::lock::QuorumFailure;
use crate::schedule::Tick;
use crate::store::GroupState;

/// The outcomes of a run (`run.finished`), each counted from zero for every job.
const OUTCOMES: [&str; 5] = ["success", "failure", "timeout", "lease_lost", "shutdown"];

/// Buckets of a run's duration: from 10 ms to 2 h.
const RUN_BUCKETS: [f64; 14] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0,
];
/// Buckets of the lag from a tick to its run's start: 1 ms to 30 s (a job's default misfire grace).
const LAG_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Buckets of a claim: 0.5 ms (one loopback round trip) to 2.5 s (retries after split votes).
const CLAIM_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

// A label value is one shared copy of its text (see [`Names`]): a job's name is in 8–11 series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabel {
    job: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    job: Arc<str>,
    outcome: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SkipLabels {
    job: Arc<str>,
    reason: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabel {
    group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupMasterLabels {
    group: String,
    master: String,
}

type Histograms = Family<JobLabel, Histogram, fn() -> Histogram>;
type Seconds = Gauge<f64, AtomicU64>;

/// The label values in use (jobs' names, outcomes, reasons), each held once and shared by every series
/// that carries it: with a copy per series, a worker of 1,000 jobs held ~1 MB of names. A value stays as
/// long as the metrics, as its series do.
#[derive(Default)]
struct Names(RwLock<HashSet<Arc<str>>>);

impl Names {
    /// The shared copy of `text`, made on its first use.
    fn get(&self, text: &str) -> Arc<str> {
        // The set is never left half-changed by a panic (an insert is one call), so a poisoned lock's
        // set is as good as any.
        let known = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(text)
            .cloned();
        known.unwrap_or_else(|| {
            let mut names = self.0.write().unwrap_or_else(PoisonError::into_inner);
            match names.get(text) {
                Some(name) => Arc::clone(name),
                None => {
                    let name: Arc<str> = Arc::from(text);
                    names.insert(Arc::clone(&name));
                    name
                }
            }
        })
    }
}

/// The worker's metrics: every series it exports, and the functions that record them.
pub struct Metrics {
    registry: Registry,
    names: Names,
    runs: Family<RunLabels, Counter>,
    run_duration: Histograms,
    schedule_lag: Histograms,
    ticks_skipped: Family<SkipLabels, Counter>,
    ticks_missed: Family<JobLabel, Counter>,
    lease_renew_failures: Family<JobLabel, Counter>,
    lease_lost: Family<JobLabel, Counter>,
    claim_duration: Histogram,
    store_nodes_up: Gauge,
    store_nodes_configured: Gauge,
    clock_offset: Seconds,
    last_success: Family<JobLabel, Seconds>,
    config_reloads: Family<ResultLabel, Counter>,
    history_write_failures: Counter,
    connections_refused: Counter,
    group_masters: Family<GroupMasterLabels, Gauge>,
    group_failovers: Family<GroupLabel, Counter>,
    /// The master each group's series names now, so that a move removes the old series.
    group_masters_shown: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

impl Metrics {
    /// The `Content-Type` of [`Metrics::encode`]'s text.
    pub const CONTENT_TYPE: &'static str =
        "application/openmetrics-text; version=1.0.0; charset=utf-8";

    /// Every series registered; the counters of each of `jobs` (runs by outcome, misses, lease
    /// failures) and the config reloads start at zero, so that an alert on their increase sees the
    /// first one.
    pub fn new<'a>(jobs: impl IntoIterator<Item = &'a str>) -> Metrics {
        let mut metrics = Metrics {
            registry: Registry::default(),
            names: Names::default(),
            runs: Family::default(),
            run_duration: Family::new_with_constructor(|| Histogram::new(RUN_BUCKETS)),
            schedule_lag: Family::new_with_constructor(|| Histogram::new(LAG_BUCKETS)),
            ticks_skipped: Family::default(),
            ticks_missed: Family::default(),
            lease_renew_failures: Family::default(),
            lease_lost: Family::default(),
            claim_duration: Histogram::new(CLAIM_BUCKETS),
            store_nodes_up: Gauge::default(),
            store_nodes_configured: Gauge::default(),
            clock_offset: Seconds::default(),
            last_success: Family::default(),
            config_reloads: Family::default(),
            history_write_failures: Counter::default(),
            connections_refused: Counter::default(),
            group_masters: Family::default(),
            group_failovers: Family::default(),
            group_masters_shown: Default::default(),
        };
        let (m, seconds) = (&mut metrics, Unit::Seconds);
        let r = &mut m.registry;
        r.register(
            "redcron_runs",
            "Runs this worker ran, by job and outcome",
            m.runs.clone(),
        );
        let help = "How long runs took, from the child's start to its end";
        r.register_with_unit(
            "redcron_run_duration",
            help,
            seconds.clone(),
            m.run_duration.clone(),
        );
        let help = "From a tick (cluster time) to the start of its run on this worker";
        r.register_with_unit(
            "redcron_schedule_lag",
            help,
            seconds.clone(),
            m.schedule_lag.clone(),
        );
        let help =
            "Ticks this worker recorded as skipped, by job and reason (as in the run history)";
        r.register("redcron_ticks_skipped", help, m.ticks_skipped.clone());
        let help = "Ticks nobody ran, counted by the one worker that raised tick.missed";
        r.register("redcron_ticks_missed", help, m.ticks_missed.clone());
        let help = "Lease renewals that a majority did not confirm (retried until the deadline)";
        r.register(
            "redcron_lease_renew_failures",
            help,
            m.lease_renew_failures.clone(),
        );
        let help =
            "Leases lost: a run stopped, or not started, because its lease was gone or expiring";
        r.register("redcron_lease_lost", help, m.lease_lost.clone());
        let help =
            "How long one claim of the ticks due at one instant took (both rounds, every node)";
        r.register_with_unit(
            "redcron_claim_duration",
            help,
            seconds.clone(),
            m.claim_duration.clone(),
        );
        let help = "Store nodes that answered the last clock check (0 with the embedded store)";
        r.register("redcron_store_nodes_up", help, m.store_nodes_up.clone());
        let help = "Store nodes configured (0 with the embedded store)";
        r.register(
            "redcron_store_nodes_configured",
            help,
            m.store_nodes_configured.clone(),
        );
        let help = "The store nodes' clock minus this host's, at the last good clock check";
        r.register_with_unit(
            "redcron_clock_offset",
            help,
            seconds.clone(),
            m.clock_offset.clone(),
        );
        let help = "When this worker last ended a run of the job successfully (Unix time, this host's clock)";
        r.register_with_unit(
            "redcron_last_success_timestamp",
            help,
            seconds,
            m.last_success.clone(),
        );
        let help = "Config reloads, by result (success, failure)";
        r.register("redcron_config_reloads", help, m.config_reloads.clone());
        let help = "History writes that a majority of the nodes did not take, after a retry";
        r.register(
            "redcron_history_write_failures",
            help,
            m.history_write_failures.clone(),
        );
        let help = "Log lines dropped because stdout did not take them in time (a stalled reader)";
        r.register("redcron_log_lines_dropped", help, LogLinesDropped);
        let help = "Connections to worker.listen closed unanswered: as many as it serves at once were open";
        r.register(
            "redcron_http_connections_refused",
            help,
            m.connections_refused.clone(),
        );
        let help = "1 for the master a Redis Sentinel group of the store has, as this worker last connected to it";
        r.register("redcron_store_group_master", help, m.group_masters.clone());
        let help = "Times this worker found a Redis Sentinel group's master at a new address (failovers seen)";
        r.register(
            "redcron_store_group_failovers",
            help,
            m.group_failovers.clone(),
        );
        for result in ["success", "failure"] {
            let _ = metrics.config_reloads.get_or_create(&ResultLabel {
                result: result.to_string(),
            });
        }
        jobs.into_iter().for_each(|job| metrics.add_job(job));
        metrics
    }

    /// Starts the counters of `job` at zero (runs by outcome, misses, lease failures); for the jobs of
    /// the config at start and of each reload.
    pub fn add_job(&self, job: &str) {
        for outcome in OUTCOMES {
            let _ = self.runs.get_or_create(&self.run(job, outcome));
        }
        let job = self.label(job);
        for family in [
            &self.ticks_missed,
            &self.lease_renew_failures,
            &self.lease_lost,
        ] {
            let _ = family.get_or_create(&job);
        }
    }

    /// A run of `job` for `tick` started at `started_at`, cluster time (`run.started`).
    pub fn run_started(&self, job: &str, tick: Tick, started_at: DateTime<Utc>) {
        let lag = (started_at - tick.to_utc()).to_std().unwrap_or_default();
        self.schedule_lag
            .get_or_create(&self.label(job))
            .observe(lag.as_secs_f64());
    }

    /// A run of `job` ended with `outcome` after `duration` (`run.finished`); a success is stamped with
    /// this host's clock, which Prometheus compares with its own.
    pub fn run_finished(&self, job: &str, outcome: &str, duration: Duration) {
        self.runs.get_or_create(&self.run(job, outcome)).inc();
        self.run_duration
            .get_or_create(&self.label(job))
            .observe(duration.as_secs_f64());
        if outcome == "success" {
            let seconds = Utc::now().timestamp_micros() as f64 / 1e6;
            self.last_success
                .get_or_create(&self.label(job))
                .set(seconds);
        }
    }

    /// This worker recorded a tick of `job` as skipped, for `reason` (`tick.skipped`).
    pub fn tick_skipped(&self, job: &str, reason: &str) {
        let labels = SkipLabels {
            job: self.names.get(job),
            reason: self.names.get(reason),
        };
        self.ticks_skipped.get_or_create(&labels).inc();
    }

    /// This worker raised `tick.missed` for a tick of `job`.
    pub fn tick_missed(&self, job: &str) {
        self.ticks_missed.get_or_create(&self.label(job)).inc();
    }

    /// A renewal of a lease of `job` was not confirmed (`lease.renew_failed`).
    pub fn lease_renew_failed(&self, job: &str) {
        self.lease_renew_failures
            .get_or_create(&self.label(job))
            .inc();
    }

    /// A lease of `job` was lost (`lease.lost`, `lease.expiring`).
    pub fn lease_lost(&self, job: &str) {
        self.lease_lost.get_or_create(&self.label(job)).inc();
    }

    /// One claim of a batch of due ticks took `duration`.
    pub fn claimed(&self, duration: Duration) {
        self.claim_duration.observe(duration.as_secs_f64());
    }

    /// A clock check that a majority answered: the nodes that did, and the offset now in use.
    pub fn clock_measured(&self, estimate: &Estimate) {
        self.store_nodes(estimate.sampled, estimate.configured);
        self.clock_offset.set(estimate.offset_us as f64 / 1e6);
    }

    /// A clock check that too few nodes answered: the nodes that did (the offset in use is kept).
    pub fn clock_unmeasured(&self, failure: &QuorumFailure) {
        self.store_nodes(failure.granted, failure.configured);
    }

    fn store_nodes(&self, up: usize, configured: usize) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.store_nodes_up.set(count(up));
        self.store_nodes_configured.set(count(configured));
    }

    /// A config reload was applied (`ok`) or refused.
    pub fn config_reloaded(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        let labels = ResultLabel {
            result: result.to_string(),
        };
        self.config_reloads.get_or_create(&labels).inc();
    }

    /// History entries were not written to a majority, after the retry (`history.write_failed`).
    pub fn history_write_failed(&self) {
        self.history_write_failures.inc();
    }

    /// A connection to the listener was closed unanswered: as many as it serves were open.
    pub fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    /// The store's Sentinel groups as the store sees them now ([`crate::store::Health::groups`]): each
    /// group's master series (the one it replaced removed) and its failovers seen. Called before each
    /// scrape; a group's counter only grows, as the store's count does.
    pub fn store_groups(&self, groups: &[GroupState]) {
        let mut shown = self
            .group_masters_shown
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for group in groups {
            let failovers = self.group_failovers.get_or_create(&GroupLabel {
                group: group.group.clone(),
            });
            failovers.inc_by(group.failovers.saturating_sub(failovers.get()));
            let Some(master) = &group.master else {
                continue;
            };
            let before = shown.insert(group.group.clone(), master.clone());
            if let Some(before) = before.filter(|before| before != master) {
                self.group_masters.remove(&GroupMasterLabels {
                    group: group.group.clone(),
                    master: before,
                });
            }
            let labels = GroupMasterLabels {
                group: group.group.clone(),
                master: master.clone(),
            };
            self.group_masters.get_or_create(&labels).set(1);
        }
    }

    fn label(&self, job: &str) -> JobLabel {
        JobLabel {
            job: self.names.get(job),
        }
    }

    fn run(&self, job: &str, outcome: &str) -> RunLabels {
        RunLabels {
            job: self.names.get(job),
            outcome: self.names.get(outcome),
        }
    }

    /// Every series in the OpenMetrics text format ([`Metrics::CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail; an encoder error would leave a truncated text, never a panic.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// The counter of log lines dropped ([`crate::logging::dropped_lines`]): the log's writer keeps the count,
/// since it runs before any worker and its metrics.
#[derive(Debug)]
struct LogLinesDropped;

impl prometheus_client::encoding::EncodeMetric for LogLinesDropped {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(
            &crate::logging::dropped_lines(),
            None,
        )
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Counter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample named `name` whose labels include `labels`.
    fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
        let sample = scrape
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .unwrap_or_else(|| panic!("no {name}{labels:?}"));
        match &sample.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            other => panic!("{name} is not a number: {other:?}"),
        }
    }

    fn parse(metrics: &Metrics) -> prometheus_parse::Scrape {
        let text = metrics.encode();
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parses")
    }

    #[test]
    fn each_fact_lands_in_its_series() {
        let metrics = Metrics::new(["a", "b"]);
        let tick = Tick(1_700_000_000_000);
        metrics.run_started("a", tick, tick.to_utc() + chrono::Duration::milliseconds(3));
        metrics.run_finished("a", "success", Duration::from_millis(20));
        metrics.run_finished("a", "failure", Duration::from_secs(2));
        metrics.tick_skipped("b", "overlap");
        metrics.tick_skipped("b", "overlap");
        metrics.tick_missed("b");
        metrics.lease_renew_failed("a");
        metrics.lease_lost("a");
        metrics.history_write_failed();
        metrics.config_reloaded(false);
        metrics.claimed(Duration::from_millis(2));
        let estimate = Estimate {
            offset_us: -250_000,
            error_us: 100,
            sampled: 2,
            configured: 3,
        };
        metrics.clock_measured(&estimate);
        metrics.clock_unmeasured(&QuorumFailure {
            unheard: Vec::new(),
            refused: Vec::new(),
            configured: 3,
            needed: 2,
            granted: 1,
            failures: Vec::new(),
        });

        // The dropped log lines are the process's: other tests may drop some while this one scrapes.
        let dropped_before = crate::logging::dropped_lines() as f64;
        let scrape = parse(&metrics);
        let dropped_after = crate::logging::dropped_lines() as f64;
        let a = [("job", "a")];
        let b = [("job", "b")];
        let runs = |outcome| {
            let labels = [("job", "a"), ("outcome", outcome)];
            value(&scrape, "redcron_runs_total", &labels)
        };
        assert_eq!(
            (runs("success"), runs("failure"), runs("timeout")),
            (1.0, 1.0, 0.0)
        );
        let skipped = [("job", "b"), ("reason", "overlap")];
        assert_eq!(value(&scrape, "redcron_ticks_skipped_total", &skipped), 2.0);
        assert_eq!(value(&scrape, "redcron_ticks_missed_total", &b), 1.0);
        assert_eq!(
            value(&scrape, "redcron_ticks_missed_total", &a),
            0.0,
            "from zero"
        );
        assert_eq!(
            value(&scrape, "redcron_lease_renew_failures_total", &a),
            1.0
        );
        assert_eq!(value(&scrape, "redcron_lease_lost_total", &a), 1.0);
        assert_eq!(
            value(&scrape, "redcron_history_write_failures_total", &[]),
            1.0
        );
        let dropped = value(&scrape, "redcron_log_lines_dropped_total", &[]);
        assert!(
            (dropped_before..=dropped_after).contains(&dropped),
            "{dropped} dropped lines scraped, {dropped_before}..={dropped_after} counted"
        );
        let reloads = |result| {
            value(
                &scrape,
                "redcron_config_reloads_total",
                &[("result", result)],
            )
        };
        assert_eq!((reloads("success"), reloads("failure")), (0.0, 1.0));
        assert_eq!(value(&scrape, "redcron_store_nodes_up", &[]), 1.0);
        assert_eq!(value(&scrape, "redcron_store_nodes_configured", &[]), 3.0);
        // A failed check keeps the offset of the last good one.
        assert_eq!(value(&scrape, "redcron_clock_offset_seconds", &[]), -0.25);
        let last = value(&scrape, "redcron_last_success_timestamp_seconds", &a);
        assert!(
            (last - Utc::now().timestamp() as f64).abs() < 60.0,
            "{last}"
        );
        assert_eq!(
            value(&scrape, "redcron_claim_duration_seconds_count", &[]),
            1.0
        );

        let histogram = |name: &str| -> Vec<(f64, f64)> {
            let sample = scrape
                .samples
                .iter()
                .find(|s| s.metric == name && s.labels.get("job") == Some("a"));
            match sample.map(|s| &s.value) {
                Some(prometheus_parse::Value::Histogram(buckets)) => {
                    buckets.iter().map(|b| (b.less_than, b.count)).collect()
                }
                other => panic!("{name} is not a histogram: {other:?}"),
            }
        };
        let durations = histogram("redcron_run_duration_seconds");
        let count = |le: f64| {
            durations
                .iter()
                .find(|(bound, _)| *bound == le)
                .map(|(_, n)| *n)
        };
        assert_eq!(
            (count(0.05), count(5.0), count(f64::INFINITY)),
            (Some(1.0), Some(2.0), Some(2.0))
        );
        let lag = histogram("redcron_schedule_lag_seconds");
        assert!(
            lag.contains(&(0.0025, 0.0)) && lag.contains(&(0.005, 1.0)),
            "{lag:?}"
        );
    }
}
