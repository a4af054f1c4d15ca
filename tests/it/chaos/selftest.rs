//! The checker on made-up runs: it must pass a clean one and catch each kind of broken promise, or the
//! chaos test would prove nothing.

use serde_json::{json, Value};

use super::checker::{check, Input, JobSpec};
use super::claims::ClaimWrite;
use super::facts::InstanceLog;
use super::ledger::{Attempt, Phase};
use super::plan::WORKERS;
use super::report::Report;
use super::store::StoreKind;
use super::timeline::{Happening, Timeline};

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
    claims: Vec<ClaimWrite>,
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
                    config: 0,
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
            claims: Vec::new(),
            runs: 0,
        }
    }

    /// Puts `instance` on config version `config` (version 1 runs `quick` with `overlap: allow`).
    fn set_config(&mut self, instance: usize, config: usize) {
        for (_, happening) in &mut self.timeline.entries {
            if let Happening::WorkerSpawned {
                instance: i,
                config: c,
                ..
            } = happening
            {
                if *i == instance {
                    *c = config;
                }
            }
        }
    }

    /// Nodes `nodes` leased `tick` of `quick` to `claimant` right at the tick and confirmed it, as their
    /// AOF would show.
    fn confirm(&mut self, tick: i64, claimant: &str, nodes: &[usize]) {
        let holder = Some(format!("{claimant}|1|{tick}|0123456789abcdef"));
        for &node in nodes {
            for lease_expires in [Some(tick + 1 + TTL), None] {
                self.claims.push(ClaimWrite {
                    node,
                    job: "quick".into(),
                    tick,
                    holder: holder.clone(),
                    lease_expires,
                });
            }
        }
    }

    /// Every worker logs, for `tick` of `quick`, a no-quorum attempt ending at each of `attempts` (ms
    /// after the tick), the last one giving up.
    fn no_quorum(&mut self, tick: i64, attempts: &[i64]) {
        for instance in 0..WORKERS {
            for (n, &after) in attempts.iter().enumerate() {
                let event = if n + 1 == attempts.len() {
                    "tick.skipped"
                } else {
                    "tick.retrying"
                };
                let logged = json!({"event": event, "job": "quick", "tick": rfc3339(tick), "reason": "no_quorum"});
                self.log(instance, tick + after, logged);
            }
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

    /// A ledger attempt; [`Scenario::check`] judges them all in time order.
    #[allow(clippy::too_many_arguments)]
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
        self.ledger.push(Attempt {
            resource: job.to_string(),
            job: job.to_string(),
            tick: rfc3339(tick),
            token,
            worker: format!("w{}", self.logs[instance].worker),
            run_id: run_id.to_string(),
            phase,
            accepted: false,
            previous: None,
            at_ms: at,
        });
    }

    /// The ledger in time order, each attempt judged as the ledger's script would.
    fn judged_ledger(&self) -> Vec<Attempt> {
        let mut ledger = self.ledger.clone();
        ledger.sort_by_key(|a| a.at_ms);
        let mut last: std::collections::HashMap<String, u64> = Default::default();
        for attempt in &mut ledger {
            attempt.previous = last.get(&attempt.resource).copied();
            attempt.accepted = match (attempt.previous, attempt.phase) {
                (None, _) => true,
                (Some(last), Phase::Start) => attempt.token > last,
                (Some(last), Phase::End) => attempt.token >= last,
            };
            if attempt.accepted {
                last.insert(attempt.resource.clone(), attempt.token);
            }
        }
        ledger
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
        self.check_on(StoreKind::Redis)
    }

    fn check_on(&self, store: StoreKind) -> Report {
        let jobs = [JobSpec {
            name: "quick".into(),
            skip: [true, false],
            period_ms: 1_000,
            grace_ms: 5_000,
            long: false,
        }];
        check(&Input {
            store,
            jobs: &jobs,
            ttl_ms: TTL,
            window: (T0, T0 + 9_000),
            timeline: &self.timeline,
            logs: &self.logs,
            ledger: &self.judged_ledger(),
            claims: &self.claims,
            planned_cases: &[],
        })
    }
}

impl Scenario {
    /// A copy in which `instance` logged no `store.entry_skipped`.
    fn clone_without_skips(&self, instance: usize) -> Scenario {
        let mut logs = self.logs.clone();
        logs[instance]
            .events
            .retain(|(_, e)| e["event"] != "store.entry_skipped");
        Scenario {
            timeline: self.timeline.clone(),
            logs,
            ledger: self.ledger.clone(),
            claims: self.claims.clone(),
            runs: self.runs,
        }
    }
}

fn token(tick: i64) -> u64 {
    tick as u64 * 1_000
}

/// Asserts that the run passed and that some explained miss names `reason`.
fn passed_explaining(report: &Report, reason: &str) {
    assert!(report.passed(), "{report}");
    assert!(
        report.reasons.keys().any(|r| r.contains(reason)),
        "no miss explained by {reason:?}: {report}"
    );
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
/// while three nodes were down for the whole grace, every attempt failing, is explained.
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
            .push(T0 + 8_000, Happening::NodeUp { node });
    }
    scenario.no_quorum(T0 + 4_000, &[200, 700, 1_700, 3_700]);
    let report = scenario.check();
    passed_explaining(&report, "no quorum");
    assert_eq!(report.rows[0].explained, 1);
}

/// On a Sentinel group (one node of the majority) a miss while a replica was down is unexplained — the
/// other replica acknowledges — and the same miss is explained while the group failed over: from a
/// fault of its master until it served again, every attempt failing.
#[test]
fn checker_counts_a_groups_failover_and_not_a_replicas_fault_as_out_of_reach() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[4]);
    scenario.no_quorum(T0 + 4_000, &[200, 700, 1_700, 3_700]);
    let mut replica = Scenario {
        timeline: scenario.timeline.clone(),
        logs: scenario.logs.clone(),
        ledger: scenario.ledger.clone(),
        claims: scenario.claims.clone(),
        runs: scenario.runs,
    };
    let down = |data: usize, master: bool| Happening::DataNodeDown {
        data,
        hung: false,
        master,
    };
    replica.timeline.push(T0 + 3_500, down(2, false));
    replica
        .timeline
        .push(T0 + 8_000, Happening::DataNodeUp { data: 2 });
    assert!(failed_with(
        &replica.check_on(StoreKind::RedisSentinel),
        "UNEXPLAINED MISS"
    ));

    scenario.timeline.push(T0 + 3_500, down(0, true));
    scenario.timeline.push(
        T0 + 3_500,
        Happening::NodeDown {
            node: 0,
            hung: false,
        },
    );
    scenario
        .timeline
        .push(T0 + 5_000, Happening::DataNodeUp { data: 0 });
    scenario.timeline.push(
        T0 + 6_000,
        Happening::GroupServes {
            shards: vec![(1, vec![2])],
        },
    );
    scenario
        .timeline
        .push(T0 + 6_000, Happening::NodeUp { node: 0 });
    let report = scenario.check_on(StoreKind::RedisSentinel);
    passed_explaining(&report, "Sentinel group was out of reach");
    assert_eq!(report.rows[0].explained, 1);
}

/// On ZooKeeper a session talks to one member: a worker whose session's member stalled had no member
/// in reach until its client moved the session, though the other two answered all along. Once its
/// session is on a member that answers, their answers are no excuse.
#[test]
fn checker_counts_a_stalled_session_member_out_of_reach_for_its_worker_only() {
    let tick = T0 + 4_000;
    // Every worker's session rides member 0 from its start; worker `moved`'s moves to member 1 at `at`.
    let scenario = |moved: Option<(usize, i64)>| {
        let mut scenario = Scenario::new();
        scenario.quick_ticks(&[4]);
        for node in 0..3 {
            let port = 2181 + node as u16;
            scenario
                .timeline
                .push(T0 - 10_000, Happening::NodePort { node, port });
        }
        let session = |port: u16| {
            let message = format!("succeeds to establish session to tcp://127.0.0.1:{port}");
            json!({"event": "zookeeper_client::session", "message": message})
        };
        for instance in 0..WORKERS {
            scenario.log(instance, T0 - 9_800, session(2181));
        }
        if let Some((instance, at)) = moved {
            scenario.log(instance, at, session(2182));
        }
        let until = tick + 2_000;
        scenario
            .timeline
            .push(tick - 100, Happening::NodeStalled { node: 0, until });
        scenario.no_quorum(tick, &[400, 900]);
        scenario.check_on(StoreKind::Zookeeper)
    };
    passed_explaining(&scenario(None), "session rode a member");
    // Moved during the stall, after its attempts: they were made cut off.
    passed_explaining(&scenario(Some((2, tick + 1_000))), "session rode a member");
    // Moved before member 0 stalled: member 1 answered it, and so did member 2.
    let report = scenario(Some((2, tick - 600)));
    assert!(failed_with(&report, "UNEXPLAINED MISS"), "{report}");
    assert!(failed_with(&report, "w2 (process #2"), "{report}");
    // The same lines on a store whose nodes are counted by majority alone excuse nothing.
    let mut redis = Scenario::new();
    redis.quick_ticks(&[4]);
    redis.timeline.push(
        tick - 100,
        Happening::NodeStalled {
            node: 0,
            until: tick + 2_000,
        },
    );
    redis.no_quorum(tick, &[400, 900]);
    assert!(failed_with(&redis.check(), "UNEXPLAINED MISS"));
}

/// On ZooKeeper a disconnected session rides no member until its client establishes it on one: a worker
/// whose client gave its (live) member up — as on its resume from a pause longer than the connection
/// timeout — and then tried a hung member had no member in reach for that try, though two answered
/// (chaos run of seed 20261271: w1 resumed, its client tried a hung member for 1.5 s, the whole window
/// of a tick). A try on a live member, or one over before the tick's attempts, is no excuse.
#[test]
fn checker_counts_a_session_being_established_on_a_hung_member_out_of_reach() {
    let tick = T0 + 4_000;
    // Every worker's session rides member 0, which answers throughout; member 1 is hung around the
    // tick. Each client gives member 0 up at `gave_up` and fails to establish the session on the
    // member of port `tried` at `failed`, then establishes it on member 2 right after.
    let scenario = |gave_up: i64, tried: u16, failed: i64| {
        let mut scenario = Scenario::new();
        scenario.quick_ticks(&[4]);
        for node in 0..3 {
            let port = 2181 + node as u16;
            scenario
                .timeline
                .push(T0 - 10_000, Happening::NodePort { node, port });
        }
        scenario.timeline.push(
            tick - 3_500,
            Happening::NodeDown {
                node: 1,
                hung: true,
            },
        );
        scenario
            .timeline
            .push(tick + 1_500, Happening::NodeUp { node: 1 });
        let line =
            |message: String| json!({"event": "zookeeper_client::session", "message": message});
        for instance in 0..WORKERS {
            let established = |port: u16| {
                line(format!(
                    "succeeds to establish session to tcp://127.0.0.1:{port}"
                ))
            };
            scenario.log(instance, T0 - 9_800, established(2181));
            let disconnected =
                "enter state Disconnected due to no response from connection in 1600ms";
            scenario.log(instance, gave_up, line(disconnected.into()));
            let why = "connection to server has lost";
            let message =
                format!("fails to establish session to tcp://127.0.0.1:{tried} due to {why}");
            scenario.log(instance, failed, line(message));
            scenario.log(instance, failed + 5, established(2183));
        }
        scenario.no_quorum(tick, &[400, 900]);
        scenario.check_on(StoreKind::Zookeeper)
    };
    passed_explaining(
        &scenario(tick - 500, 2182, tick + 1_000),
        "session rode a member",
    );
    // The try was on member 2, which answered: no excuse.
    let report = scenario(tick - 500, 2183, tick + 1_000);
    assert!(failed_with(&report, "UNEXPLAINED MISS"), "{report}");
    // The try on the hung member was over before the tick's attempts (member 2 took the session).
    let report = scenario(tick - 3_000, 2182, tick - 1_400);
    assert!(failed_with(&report, "UNEXPLAINED MISS"), "{report}");
}

/// A worker whose last attempt at a tick was still in flight when the tick's window ended, and that was
/// killed before the attempt came back, logged no end of its race: no majority within the window still
/// explains its miss, the in-flight attempt counted up to the window's end — but only once it was
/// killed (a live worker must end its race), and only while a majority was out of reach.
#[test]
fn checker_ends_a_race_in_flight_at_its_window_when_the_worker_was_killed() {
    let tick = T0 + 4_000;
    let scenario_with = |kill: Option<i64>, hung_until: i64| {
        let mut scenario = Scenario::new();
        scenario.quick_ticks(&[4]);
        for instance in 0..WORKERS {
            let retrying = json!({"event": "tick.retrying", "job": "quick", "tick": rfc3339(tick), "reason": "no_quorum"});
            scenario.log(instance, tick + 300, retrying);
            if instance != 1 {
                let skipped = json!({"event": "tick.skipped", "job": "quick", "tick": rfc3339(tick), "reason": "no_quorum"});
                scenario.log(instance, tick + 900, skipped);
            }
        }
        for node in 0..5 {
            scenario
                .timeline
                .push(tick - 100, Happening::NodeDown { node, hung: true });
            scenario
                .timeline
                .push(hung_until, Happening::NodeUp { node });
        }
        if let Some(at) = kill {
            scenario
                .timeline
                .push(at, Happening::WorkerKilled { instance: 1 });
        }
        scenario
    };
    assert!(
        failed_with(&scenario_with(None, tick + 950).check(), "UNEXPLAINED MISS"),
        "a live worker ends its race"
    );
    let report = scenario_with(Some(tick + 2_000), tick + 950).check();
    assert!(report.passed(), "{report}");
    assert!(
        failed_with(
            &scenario_with(Some(tick + 9_000), tick + 950).check(),
            "UNEXPLAINED MISS"
        ),
        "killed long after: no attempt is in flight that long"
    );
}

/// A worker paused after its tick's window ended, its race still undecided (held by a retry inside the
/// store), gives the tick up at its resume: that give-up counts as made when the pause began, the last
/// moment it could act — not when it was logged, with the nodes back by then (Redis chaos run of seed
/// 20261291: w2 paused 1 s after the window of 21:01:00 ended, its three skips logged at its resume 5.7 s
/// later). But only a give-up logged at the resume, and only with a majority out of reach before the
/// pause began: a worker that had a majority back while it ran had to use it.
#[test]
fn checker_counts_a_give_up_logged_at_a_resume_as_made_when_the_pause_began() {
    let tick = T0 + 4_000;
    // Nodes 0..3 hung over the tick's window until `back`; every worker fails at tick + 200; w0, w1 and w3
    // give up at tick + 900; w2 is paused at `paused` until tick + 6 s and logs its give-up at `skipped`.
    let scenario = |back: i64, paused: i64, skipped: i64| {
        let mut scenario = Scenario::new();
        scenario.quick_ticks(&[4]);
        for node in 0..3 {
            scenario
                .timeline
                .push(tick - 100, Happening::NodeDown { node, hung: true });
            scenario.timeline.push(back, Happening::NodeUp { node });
        }
        let logged = |event: &str| json!({"event": event, "job": "quick", "tick": rfc3339(tick), "reason": "no_quorum"});
        for instance in 0..WORKERS {
            scenario.log(instance, tick + 200, logged("tick.retrying"));
            let gave_up = if instance == 2 { skipped } else { tick + 900 };
            scenario.log(instance, gave_up, logged("tick.skipped"));
        }
        scenario
            .timeline
            .push(paused, Happening::WorkerStopped { instance: 2 });
        scenario
            .timeline
            .push(tick + 6_000, Happening::WorkerContinued { instance: 2 });
        scenario.check()
    };
    // Hung until after the pause began: every attempt up to it met no majority.
    passed_explaining(
        &scenario(tick + 1_800, tick + 1_700, tick + 6_005),
        "no quorum",
    );
    // The nodes were back (and recovered) well before the pause began: no excuse.
    let report = scenario(tick + 300, tick + 4_000, tick + 6_005);
    assert!(failed_with(&report, "UNEXPLAINED MISS"), "{report}");
    // A give-up logged long after the resume is not the resume's.
    let report = scenario(tick + 1_800, tick + 1_700, tick + 8_000);
    assert!(failed_with(&report, "UNEXPLAINED MISS"), "{report}");
}

/// Giving up for want of a majority explains a miss only if every failed attempt within the tick's window
/// met a majority of nodes out of reach: hung or stalled, confirmed for another claimant, or leased to a
/// contender of the tick that was dead by then. A live contender's lease is no excuse.
#[test]
fn checker_requires_no_majority_at_every_attempt_within_the_window() {
    let hung = |scenario: &mut Scenario, nodes: &[usize], from: i64, to: i64| {
        for &node in nodes {
            scenario
                .timeline
                .push(from, Happening::NodeDown { node, hung: true });
            scenario.timeline.push(to, Happening::NodeUp { node });
        }
    };
    let tick = T0 + 4_000;
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[4]);
    scenario.no_quorum(tick, &[200, 700]);
    let report = scenario.check();
    assert!(
        failed_with(&report, "tick.retrying:no_quorum, tick.skipped:no_quorum"),
        "nodes were fine: {report}"
    );

    hung(&mut scenario, &[0, 1, 2, 3, 4], tick - 100, tick + 400);
    let report = scenario.check();
    assert!(report.passed(), "every node stalled: {report}");

    // Two nodes hung, and a third confirmed the tick for another claimant (a ghost's partial claim).
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[4]);
    hung(&mut scenario, &[0, 1], T0 + 3_500, T0 + 9_500);
    scenario.no_quorum(tick, &[200, 700]);
    let report = scenario.check();
    assert!(failed_with(&report, "UNEXPLAINED MISS"), "{report}");
    scenario.confirm(tick, "ghost-1/x", &[2]);
    passed_explaining(&scenario.check(), "dead contender");

    // Two nodes hung, and w1's lease of the tick on a third: an excuse only once w1 is dead (killed, or
    // shut down with the lease kept for a retry).
    for gone in [
        Happening::WorkerKilled { instance: 1 },
        Happening::WorkerShutdown { instance: 1 },
    ] {
        let mut scenario = Scenario::new();
        scenario.quick_ticks(&[4]);
        hung(&mut scenario, &[0, 1], T0 + 3_500, T0 + 9_500);
        scenario.claims.push(ClaimWrite {
            node: 2,
            job: "quick".into(),
            tick,
            holder: Some(format!("w1/x|1|{tick}|0123456789abcdef")),
            lease_expires: Some(tick + 1_995),
        });
        for instance in [0, 2, 3] {
            let contended = json!({"event": "tick.skipped", "job": "quick", "tick": rfc3339(tick), "reason": "contended"});
            scenario.log(instance, tick + 950, contended);
        }
        let lost = json!({"event": "tick.lost", "job": "quick", "tick": rfc3339(tick), "reason": "already_claimed"});
        scenario.log(1, tick + 990, lost);
        let report = scenario.check();
        assert!(failed_with(&report, "UNEXPLAINED MISS"), "{report}");
        scenario.timeline.push(tick + 5, gone);
        let report = scenario.check();
        assert!(report.passed(), "{report}");
    }
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
    passed_explaining(&scenario.check(), "another run held");
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

/// A tick won before the winner's clock reached it fails the run.
#[test]
fn checker_catches_an_early_claim() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[]);
    let tick = rfc3339(T0 + 5_000);
    let won = scenario.logs[0]
        .events
        .iter_mut()
        .find(|(_, e)| e["event"] == "tick.won" && e["tick"] == tick.as_str())
        .expect("tick 5 was won");
    won.0 = T0 + 4_000;
    assert!(failed_with(&scenario.check(), "EARLY CLAIM"));
}

/// A worker skips a tick for overlap only while its own run of the job is under way: a skip while it was
/// still racing for the previous tick is no excuse, with or without a fault slowing that claim down (a
/// worker races the next tick and the nodes decide; it used to hold the job for the whole race).
#[test]
fn checker_does_not_excuse_a_skip_while_still_racing() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[4, 5]);
    scenario.run(1, "quick", T0 + 4_000, token(T0 + 4_000), 20);
    // The others are down at tick 5: two long before, w1 just after w0's slow claim ended.
    for (instance, at) in [(2, T0 - 8_000), (3, T0 - 8_000), (1, T0 + 5_060)] {
        scenario
            .timeline
            .push(at, Happening::WorkerKilled { instance });
    }
    let lost = json!({"event": "tick.lost", "job": "quick", "tick": rfc3339(T0 + 4_000), "reason": "already_claimed"});
    let skipped = json!({"event": "tick.skipped", "job": "quick", "tick": rfc3339(T0 + 5_000), "reason": "overlap"});
    scenario.log(0, T0 + 5_001, skipped);
    scenario.log(0, T0 + 5_050, lost);
    // w1 had lost tick 5 before it died (so it was not killed mid-claim).
    let busy = json!({"event": "tick.lost", "job": "quick", "tick": rfc3339(T0 + 5_000), "reason": "busy"});
    scenario.log(1, T0 + 5_010, busy);
    let report = scenario.check();
    assert!(failed_with(&report, "UNEXPLAINED MISS"), "{report}");

    scenario.timeline.push(
        T0 + 4_100,
        Happening::NodeDown {
            node: 0,
            hung: true,
        },
    );
    scenario
        .timeline
        .push(T0 + 4_600, Happening::NodeUp { node: 0 });
    let report = scenario.check();
    assert!(failed_with(&report, "UNEXPLAINED MISS"), "{report}");
}

/// A write from a run whose worker died between `tick.won` and `run.started` is matched to the win and
/// counts as the tick's run; the same write from a worker that did not die is a ghost.
#[test]
fn checker_matches_a_run_whose_worker_died_before_logging_it() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[4]);
    let tick = T0 + 4_000;
    let won =
        json!({"event": "tick.won", "job": "quick", "tick": rfc3339(tick), "token": token(tick)});
    scenario.log(1, tick + 5, won);
    scenario.write(
        1,
        "quick",
        tick,
        token(tick),
        "unlogged",
        Phase::Start,
        tick + 9,
    );
    assert!(failed_with(&scenario.check(), "no worker logged"));

    scenario
        .timeline
        .push(tick + 7, Happening::WorkerKilled { instance: 1 });
    let report = scenario.check();
    assert!(report.passed(), "{report}");
    assert_eq!(report.rows[0].run, 10, "{report}");
}

/// A worker killed so soon after its win that no line of it reached the log leaves only the store's
/// grant and its job's write: that write counts as the tick's run when the nodes confirmed the tick on a
/// majority for that worker and it was killed then; without the grant, or without the kill, it is a
/// ghost.
#[test]
fn checker_counts_a_run_whose_worker_died_before_logging_its_win() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[4]);
    let tick = T0 + 4_000;
    scenario.write(
        1,
        "quick",
        tick,
        token(tick),
        "orphaned",
        Phase::Start,
        tick + 25,
    );
    scenario
        .timeline
        .push(tick + 13, Happening::WorkerKilled { instance: 1 });
    assert!(failed_with(&scenario.check(), "no worker logged"));

    scenario.confirm(tick, "w1/orphaned", &[0, 1]);
    assert!(
        failed_with(&scenario.check(), "no worker logged"),
        "a minority of confirms"
    );
    scenario.confirm(tick, "w1/orphaned", &[4]);
    let report = scenario.check();
    assert!(report.passed(), "{report}");
    assert_eq!(report.rows[0].run, 10, "{report}");
    assert!(
        report.notes.iter().any(|n| n.contains("run orphaned")),
        "{report}"
    );
}

/// A worker killed in the middle of its claim (no outcome logged) no longer explains a miss by itself;
/// it does when the nodes' AOF shows that claim confirmed on a majority: it was granted, and died.
#[test]
fn checker_excuses_a_claim_killed_mid_claim_only_if_it_was_granted() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[4]);
    scenario
        .timeline
        .push(T0 + 4_005, Happening::WorkerKilled { instance: 1 });
    assert!(failed_with(&scenario.check(), "UNEXPLAINED MISS"));

    scenario.confirm(T0 + 4_000, "w1/dead", &[0, 1]);
    assert!(
        failed_with(&scenario.check(), "UNEXPLAINED MISS"),
        "a minority of confirms"
    );

    scenario.confirm(T0 + 4_000, "w1/dead", &[4]);
    passed_explaining(&scenario.check(), "granted to a claimant of w1");
}

/// In a rollout, the previous run holding the job's single lease key excuses only the workers that
/// run the job with `overlap: skip`: one on `overlap: allow` takes a key per tick and had no excuse.
#[test]
fn checker_excuses_a_busy_skip_only_on_skip_configured_workers() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[3, 4]);
    scenario.run(0, "quick", T0 + 3_000, token(T0 + 3_000), 1_500);
    scenario.set_config(3, 1);
    let report = scenario.check();
    assert!(
        failed_with(&report, "w3 (process #3, config v1) could have run it"),
        "{report}"
    );

    scenario
        .timeline
        .push(T0 + 1_000, Happening::WorkerKilled { instance: 3 });
    passed_explaining(&scenario.check(), "another run held");
}

/// A ghost contender's tick must run all the same; its lease on a majority of the job's single key
/// excuses the ticks raced meanwhile.
#[test]
fn checker_expects_a_ghost_tick_to_run() {
    let ghost = |tick: i64| Happening::Ghost {
        job: "quick".into(),
        tick,
        key: "redcron:{quick}:lease".into(),
        value: format!("ghost-1/x|1|{tick}|0123456789abcdef"),
        ttl_ms: 2_000,
        leased: vec![0, 1, 2],
        confirmed: vec![0],
    };
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[5]);
    scenario.timeline.push(T0 + 4_800, ghost(T0 + 5_000));
    let report = scenario.check();
    assert!(failed_with(&report, "UNEXPLAINED MISS"), "{report}");

    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[4]);
    scenario.timeline.push(T0 + 3_900, ghost(T0 + 5_000));
    passed_explaining(&scenario.check(), "ghost contender");
}

/// A ghost's claim of a later tick (its partial claim, on a minority) makes its nodes refuse every
/// earlier tick from its write on, whatever lease key a worker takes: with one node hung besides, a
/// worker on `overlap: allow` (which never meets the ghost's lease of the job's single key) that gave up
/// for want of a majority is excused — but not by a ghost written after its attempts, nor by one that
/// claimed an earlier tick.
#[test]
fn checker_counts_a_ghosts_claim_of_a_later_tick_as_out_of_reach() {
    let tick = T0 + 4_000;
    let with_ghost = |ghost: Option<(i64, i64)>| {
        let mut scenario = Scenario::new();
        scenario.quick_ticks(&[4]);
        for instance in 0..WORKERS {
            scenario.set_config(instance, 1);
        }
        for instance in [2, 3] {
            scenario
                .timeline
                .push(T0 - 8_000, Happening::WorkerKilled { instance });
        }
        scenario.timeline.push(
            tick - 1_276,
            Happening::NodeDown {
                node: 0,
                hung: true,
            },
        );
        scenario
            .timeline
            .push(tick + 2_370, Happening::NodeUp { node: 0 });
        for instance in [0, 1] {
            for (event, after) in [("tick.retrying", 215), ("tick.skipped", 792)] {
                let logged = json!({"event": event, "job": "quick", "tick": rfc3339(tick), "reason": "no_quorum"});
                scenario.log(instance, tick + after, logged);
            }
        }
        if let Some((ghost_tick, written)) = ghost {
            // What the saved run showed: lease (skip key) on 1, 3, 4, claim on 1, 3; the AOF has the
            // ghost's tick but not when it was written.
            scenario.confirm(ghost_tick, "ghost-1/x", &[1, 3]);
            scenario.timeline.push(
                tick + written,
                Happening::Ghost {
                    job: "quick".into(),
                    tick: ghost_tick,
                    key: "redcron:{quick}:lease".into(),
                    value: format!("ghost-1/x|1|{ghost_tick}|0123456789abcdef"),
                    ttl_ms: 1_484,
                    leased: vec![1, 3, 4],
                    confirmed: vec![1, 3],
                },
            );
        }
        scenario.check()
    };
    let report = with_ghost(None);
    assert!(
        failed_with(&report, "w1 (process #1, config v1) could have run it"),
        "only node 0 hung: {report}"
    );
    let report = with_ghost(Some((tick + 3_000, 300)));
    assert!(
        failed_with(&report, "UNEXPLAINED MISS"),
        "the ghost was written after the first attempt: {report}"
    );
    let report = with_ghost(Some((tick - 1_000, -462)));
    assert!(
        failed_with(&report, "UNEXPLAINED MISS"),
        "the ghost claimed an earlier tick: {report}"
    );
    let report = with_ghost(Some((tick + 3_000, -462)));
    passed_explaining(&report, "a ghost's claim of a later one");
    assert_eq!(report.rows[0].explained, 1, "{report}");
}

/// One tick confirmed on a majority for two claimants (seen in the nodes' AOF) is a duplicate grant,
/// even if only one of them ran it.
#[test]
fn checker_catches_a_double_grant_on_the_nodes() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[]);
    scenario.confirm(T0 + 3_000, "w0/a", &[0, 1, 2]);
    scenario.confirm(T0 + 3_000, "w3/b", &[2, 3, 4]);
    let report = scenario.check();
    assert!(
        failed_with(&report, "DUPLICATE GRANT ON THE NODES"),
        "{report}"
    );
}

/// A later tick granted to a claimant that died before logging `tick.won` (its clock ran ahead after a
/// step) takes the earlier ticks with it, as a logged win would: claims only grow.
#[test]
fn checker_counts_a_later_tick_granted_to_the_dead_as_claimed() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[4, 5, 6]);
    let (early, granted) = (T0 + 4_000, T0 + 6_000);
    let holder = Some(format!("w3/ahead|1|{granted}|0123456789abcdef"));
    for node in 0..3 {
        for lease_expires in [Some(early + 1 + TTL), None] {
            scenario.claims.push(ClaimWrite {
                node,
                job: "quick".into(),
                tick: granted,
                holder: holder.clone(),
                lease_expires,
            });
        }
    }
    for tick in [early, early + 1_000] {
        for instance in 0..3 {
            let lost = json!({"event": "tick.lost", "job": "quick", "tick": rfc3339(tick), "reason": "already_claimed", "by": "w3"});
            scenario.log(instance, tick + 5, lost);
        }
    }
    assert!(failed_with(&scenario.check(), "UNEXPLAINED MISS"));

    scenario
        .timeline
        .push(early + 20, Happening::WorkerKilled { instance: 3 });
    let report = scenario.check();
    passed_explaining(&report, "granted to a claimant of w3");
    passed_explaining(&report, "claimed a later tick first");
}

/// A worker told to shut down skips a tick it wins: a tick the nodes granted to it is explained by that
/// grant, as for a worker killed mid-claim.
#[test]
fn checker_excuses_a_tick_granted_to_a_worker_shutting_down() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[4]);
    scenario.confirm(T0 + 4_000, "w1/stopping", &[0, 1, 4]);
    assert!(failed_with(&scenario.check(), "UNEXPLAINED MISS"));
    scenario
        .timeline
        .push(T0 + 4_005, Happening::WorkerShutdown { instance: 1 });
    passed_explaining(&scenario.check(), "granted to a claimant of w1");
}

/// A worker whose one claim of a tick was refused because a later tick had been claimed meanwhile
/// (`tick.lost: later_tick_claimed`, its retries inside the store unlogged) is excused only if a majority
/// of the nodes was out of its reach during that claim.
#[test]
fn checker_excuses_a_claim_overtaken_by_a_later_tick_only_under_faults() {
    let tick = T0 + 4_000;
    let overtaken = |hung: bool| {
        let mut scenario = Scenario::new();
        scenario.quick_ticks(&[4]);
        for instance in [1, 2, 3] {
            scenario
                .timeline
                .push(T0 - 8_000, Happening::WorkerKilled { instance });
        }
        if hung {
            for node in [0, 1, 2] {
                scenario
                    .timeline
                    .push(tick - 100, Happening::NodeDown { node, hung: true });
                scenario
                    .timeline
                    .push(tick + 1_500, Happening::NodeUp { node });
            }
        }
        let lost = json!({"event": "tick.lost", "job": "quick", "tick": rfc3339(tick),
                          "reason": "later_tick_claimed", "by": "w0", "by_tick": rfc3339(tick + 1_000)});
        scenario.log(0, tick + 1_160, lost);
        scenario.check()
    };
    let report = overtaken(false);
    assert!(
        failed_with(&report, "w0 (process #0, config v0) could have run it"),
        "nothing kept w0 from a majority: {report}"
    );
    passed_explaining(&overtaken(true), "no quorum");
}

/// A run that no scheduled tick explains fails the run, whatever its token: one for a tick off the
/// schedule (as a trigger request's tick is: its `requested_at`, to the millisecond), and one on a
/// scheduled tick that nobody else ran but that carries a trigger request's id. Planted garbage in the
/// store must never make a job run; without this rule such a run matched its ledger write and passed.
#[test]
fn checker_catches_a_run_off_the_schedule() {
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[]);
    scenario.run(1, "quick", T0 + 3_417, token(T0 + 3_417), 20);
    let report = scenario.check();
    assert!(failed_with(&report, "OFF THE SCHEDULE"), "{report}");
    assert_eq!(
        report
            .failures
            .iter()
            .filter(|f| f.contains("OFF THE SCHEDULE"))
            .count(),
        2,
        "the win and the ledger write: {report}"
    );

    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[7]);
    scenario.run(1, "quick", T0 + 7_000, token(T0 + 7_000), 20);
    for (_, event) in &mut scenario.logs[1].events {
        event["trigger"] = json!("01000000000000000000000000000001");
    }
    let report = scenario.check();
    assert!(failed_with(&report, "OFF THE SCHEDULE"), "{report}");
}

/// Garbage planted while every worker runs: each must log `store.entry_skipped` naming every planted
/// request and member; one that logged nothing fails the run, one paused meanwhile is not asked; a skip
/// that names nothing planted fails the run too.
#[test]
fn checker_requires_every_running_worker_to_skip_the_garbage() {
    let plant = |scenario: &mut Scenario| {
        scenario.timeline.push(
            T0 + 1_000,
            Happening::Garbage {
                tag: 1,
                nodes: vec![0, 3],
                requests: vec!["04000000000000000000000000000001".into()],
                members: vec!["mallory1-1".into()],
                history: Some("quick".into()),
                failed: Vec::new(),
            },
        );
        scenario.timeline.entries.sort_by_key(|(at, _)| *at);
    };
    let skip = |scenario: &mut Scenario, instance: usize, what: &str| {
        scenario.log(
            instance,
            T0 + 2_000,
            json!({"event": "store.entry_skipped", "error": format!("redis://127.0.0.1:1: {what} skipped: bad")}),
        );
    };
    let mut scenario = Scenario::new();
    scenario.quick_ticks(&[]);
    plant(&mut scenario);
    for instance in 0..WORKERS {
        skip(
            &mut scenario,
            instance,
            "trigger request \"04000000000000000000000000000001\"",
        );
        skip(&mut scenario, instance, "member \"mallory1-1\"");
    }
    skip(&mut scenario, 2, "history entry");
    let report = scenario.check();
    assert!(report.passed(), "{report}");
    assert!(
        report.notes.iter().any(|n| n.contains("1 plants")),
        "{report}"
    );

    let mut lazy = scenario.clone_without_skips(1);
    let report = lazy.check();
    assert!(failed_with(&report, "GARBAGE UNNOTICED: w1"), "{report}");
    lazy.timeline
        .push(T0 + 5_000, Happening::WorkerStopped { instance: 1 });
    lazy.timeline
        .push(T0 + 7_000, Happening::WorkerContinued { instance: 1 });
    lazy.timeline.entries.sort_by_key(|(at, _)| *at);
    assert!(lazy.check().passed(), "a paused worker is not asked");
    // A majority of the nodes taken down within the window can keep a worker's reads from the plant.
    let mut hidden = scenario.clone_without_skips(1);
    for node in 0..3 {
        hidden
            .timeline
            .push(T0 + 1_300, Happening::NodeDown { node, hung: false });
        hidden.timeline.push(T0 + 9_000, Happening::NodeUp { node });
    }
    hidden.timeline.entries.sort_by_key(|(at, _)| *at);
    let report = hidden.check();
    assert!(!failed_with(&report, "GARBAGE UNNOTICED"), "{report}");
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("1 plants not checked")),
        "{report}"
    );

    skip(&mut scenario, 3, "member \"w2\"");
    assert!(failed_with(&scenario.check(), "NOBODY PLANTED"));
}
