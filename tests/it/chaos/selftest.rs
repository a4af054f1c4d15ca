//! The checker on made-up runs: it must pass a clean one and catch each kind of broken promise, or the
//! chaos test would prove nothing.

use serde_json::{json, Value};

use super::checker::{check, Input, JobSpec};
use super::facts::InstanceLog;
use super::ledger::{Attempt, Phase};
use super::plan::{Happening, Timeline, WORKERS};
use super::report::Report;

/// An arbitrary whole second, as Unix ms.
const T0: i64 = 1_800_000_000_000;
const TTL: i64 = 2_000;

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .expect("in range")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Four workers up from `T0 - 10 s` with true clocks, and the checker's other inputs.
struct Scenario {
    timeline: Timeline,
    logs: Vec<InstanceLog>,
    ledger: Vec<Attempt>,
    runs: u64,
}

impl Scenario {
    fn new() -> Scenario {
        let mut timeline = Timeline::default();
        let mut logs = Vec::new();
        for worker in 0..WORKERS {
            timeline.push(
                T0 - 10_000,
                Happening::Clock {
                    worker,
                    offset_ms: 0,
                },
            );
            timeline.push(
                T0 - 10_000,
                Happening::WorkerSpawned {
                    worker,
                    instance: worker,
                },
            );
            logs.push(InstanceLog {
                instance: worker,
                worker,
                events: vec![(T0 - 9_900, json!({"event": "worker.started"}))],
                bad_lines: Vec::new(),
            });
        }
        Scenario {
            timeline,
            logs,
            ledger: Vec::new(),
            runs: 0,
        }
    }

    fn log(&mut self, instance: usize, at: i64, event: Value) {
        self.logs[instance].events.push((at, event));
    }

    /// `instance` wins `tick` of `job` at the tick and runs it for `ms`; returns the run id.
    fn run(&mut self, instance: usize, job: &str, tick: i64, token: u64, ms: i64) -> String {
        self.runs += 1;
        let run_id = format!("run-{}", self.runs);
        let base = json!({"job": job, "tick": rfc3339(tick), "token": token});
        let with = |fields: Value| {
            let mut event = base.clone();
            event
                .as_object_mut()
                .expect("object")
                .extend(fields.as_object().expect("object").clone());
            event
        };
        self.log(instance, tick + 5, with(json!({"event": "tick.won"})));
        self.log(
            instance,
            tick + 8,
            with(json!({"event": "run.started", "run_id": run_id, "pid": 1})),
        );
        self.write(instance, job, tick, token, &run_id, Phase::Start, tick + 10);
        let outcome = json!({"event": "run.finished", "run_id": run_id, "outcome": "success", "duration_ms": ms});
        self.log(instance, tick + 8 + ms, with(outcome));
        run_id
    }

    /// A ledger attempt, judged by the ledger's rule.
    fn write(
        &mut self,
        instance: usize,
        job: &str,
        tick: i64,
        token: u64,
        run_id: &str,
        phase: Phase,
        at: i64,
    ) {
        let previous = self
            .ledger
            .iter()
            .filter(|a| a.job == job && a.accepted)
            .map(|a| a.token)
            .next_back();
        let accepted = match (previous, phase) {
            (None, _) => true,
            (Some(last), Phase::Start) => token > last,
            (Some(last), Phase::End) => token >= last,
        };
        self.ledger.push(Attempt {
            resource: job.to_string(),
            job: job.to_string(),
            tick: rfc3339(tick),
            token,
            worker: format!("w{}", self.logs[instance].worker),
            run_id: run_id.to_string(),
            phase,
            accepted,
            previous,
            at_ms: at,
        });
    }

    /// Runs every tick of `quick` from `T0` to `T0 + 9 s` on w0, except `skip`.
    fn quick_ticks(&mut self, skip: &[i64]) {
        for k in 0..10 {
            if !skip.contains(&k) {
                let tick = T0 + k * 1_000;
                self.run(0, "quick", tick, token(tick), 20);
            }
        }
    }

    fn check(&self) -> Report {
        let jobs = [JobSpec {
            name: "quick".into(),
            skip: true,
            period_ms: 1_000,
            long: false,
        }];
        check(&Input {
            jobs: &jobs,
            ttl_ms: TTL,
            window: (T0, T0 + 9_000),
            timeline: &self.timeline,
            logs: &self.logs,
            ledger: &self.ledger,
            planned_cases: &[],
        })
    }
}

fn token(tick: i64) -> u64 {
    tick as u64 * 1_000
}

fn failed_with(report: &Report, needle: &str) -> bool {
    report.failures.iter().any(|f| f.contains(needle))
}

/// Every tick once, in order: a pass, and the table counts them.
#[test]
fn checker_passes_a_clean_run() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[]);
    let report = scenario.check();
    assert!(report.passed(), "{report}");
    assert_eq!((report.rows[0].ticks, report.rows[0].run), (10, 10));
}

/// Two runs of one tick (two grants, two accepted first writes) fail the run.
#[test]
fn checker_catches_a_duplicate() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[]);
    scenario.run(1, "quick", T0 + 3_000, token(T0 + 9_000) + 1, 20);
    let report = scenario.check();
    assert!(failed_with(&report, "DUPLICATE"), "{report}");
    assert!(
        failed_with(&report, "TOKEN ORDER"),
        "a later grant of an earlier tick: {report}"
    );
}

/// A tick that nobody ran while every worker and node was fine is an unexplained miss; the same miss
/// while three nodes were down is explained.
#[test]
fn checker_explains_misses_only_by_faults() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[4]);
    assert!(failed_with(&scenario.check(), "UNEXPLAINED MISS"));

    for node in 0..3 {
        scenario.timeline.push(
            T0 + 3_500,
            Happening::NodeDown {
                node,
                hung: node == 1,
            },
        );
        scenario
            .timeline
            .push(T0 + 4_500, Happening::NodeUp { node });
    }
    let report = scenario.check();
    assert!(report.passed(), "{report}");
    assert_eq!(report.rows[0].explained, 1);
    assert!(
        report.reasons.keys().any(|r| r.contains("no quorum")),
        "{report}"
    );
}

/// A miss while the previous run held the job is explained; a tick.lost while nothing held it is not.
#[test]
fn checker_explains_a_miss_by_the_previous_run_only_while_it_runs() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[3, 4, 5, 6, 7, 8, 9]);
    scenario.run(2, "quick", T0 + 3_000, token(T0 + 3_000), 1_500);
    // Tick 4 is held by tick 3's run; ticks 5.. are not.
    scenario.run(2, "quick", T0 + 5_000, token(T0 + 5_000), 10);
    for k in 6..10 {
        scenario.run(3, "quick", T0 + k * 1_000, token(T0 + k * 1_000), 10);
    }
    let report = scenario.check();
    assert!(report.passed(), "{report}");
    assert!(
        report.reasons.keys().any(|r| r.contains("previous run")),
        "{report}"
    );
}

/// A stale write rejected while its worker was paused is expected; the same write from a worker that had
/// been running all along means the lease-loss kill did not act.
#[test]
fn checker_blames_stale_writes_on_live_holders_only() {
    let mut scenario = Scenario::new();
    // A run from before the window, still going when its late write comes (after the tick 5 run's).
    let stale = scenario.run(3, "quick", T0 - 2_000, token(T0 - 2_000), 7_600);
    scenario.quick_ticks(&[]);
    scenario.write(
        3,
        "quick",
        T0 - 2_000,
        token(T0 - 2_000),
        &stale,
        Phase::End,
        T0 + 5_500,
    );
    let report = scenario.check();
    assert!(
        failed_with(&report, "STALE WRITE FROM A LIVE HOLDER"),
        "{report}"
    );

    scenario
        .timeline
        .push(T0 + 4_000, Happening::WorkerStopped { instance: 3 });
    scenario
        .timeline
        .push(T0 + 5_400, Happening::WorkerContinued { instance: 3 });
    let report = scenario.check();
    assert!(report.passed(), "{report}");
    assert_eq!(report.rows[0].stale_rejected, 1);
}

/// A non-JSON line, a ledger write from an unknown run, and a run with no ledger write all fail.
#[test]
fn checker_requires_json_logs_and_a_ledger_entry_per_run() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[]);
    scenario.logs[1]
        .bad_lines
        .push("thread 'main' panicked".into());
    scenario.ledger[2].run_id = "nobody".into();
    let report = scenario.check();
    assert!(failed_with(&report, "not JSON"), "{report}");
    assert!(failed_with(&report, "no worker logged"), "{report}");
    assert!(failed_with(&report, "0 start writes"), "{report}");
}
