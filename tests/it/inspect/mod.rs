//! `status`, `history` and `explain`: the built binary reading real `redis-server` nodes.
//!
//! `seeded` and `faults` seed members and history entries through the library's `Store` (`announce`,
//! `record`) on nodes with a password, which must never show — some ticks as current workers write them (the
//! winner's run names the racers, routine losers write nothing), some as earlier versions did (an entry
//! per loser) — and check the commands' tables and JSON — and
//! what they do when a node is down, when no majority answers, and when a node holds garbage. `workers`
//! reads what three real worker processes recorded.

mod faults;
mod seeded;
pub(crate) mod workers;

use std::path::{Path, PathBuf};

use chrono::Utc;
use redcron::history::{Entry, Kind};
use redcron::lock::LockSettings;
use redcron::membership::{Member, Running};
use redcron::schedule::Tick;
use redcron::store::redis::RedisStore;
use redcron::store::Store;
use serde_json::Value;

use crate::cli::{output, redcron};
use crate::support::{RedisCluster, TestDir};

const PASSWORD: &str = "s3cret-pw";

/// Three jobs: `archive` has a history, `hourly` has none at its newest tick (overdue), `idle` is disabled.
const JOBS: &str = r#"
jobs:
  - name: archive
    schedule: "@yearly"
    command: ["/bin/true"]
  - name: hourly
    schedule: "0 * * * *"
    command: ["/bin/true"]
  - name: idle
    schedule: "0 * * * *"
    command: ["/bin/true"]
    enabled: false
"#;

/// The fingerprint a worker on another version of the file announces.
const OTHER_CONFIG: &str = "0123456789abcdef";

/// Three nodes, a `jobs.yaml` naming them, and a store to seed them through.
pub(crate) struct Fixture {
    cluster: RedisCluster,
    dir: TestDir,
    config: PathBuf,
    runtime: tokio::runtime::Runtime,
    store: Store,
}

impl Fixture {
    fn new() -> Fixture {
        let cluster = RedisCluster::builder().password(PASSWORD).start();
        let dir = TestDir::new();
        let config = dir.write_config(&format!(
            "redis:\n  nodes: {}\n{JOBS}",
            cluster.nodes_yaml()
        ));
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        let store = {
            let _inside = runtime.enter();
            Store::Redis(
                RedisStore::new(&cluster.urls(), LockSettings::default()).expect("valid URLs"),
            )
        };
        Fixture {
            cluster,
            dir,
            config,
            runtime,
            store,
        }
    }

    fn record(&self, entries: &[Entry]) {
        self.runtime
            .block_on(self.store.record(entries))
            .expect("recorded on every node");
    }

    fn announce(&self, member: &Member) {
        self.runtime
            .block_on(self.store.announce(member))
            .expect("announced on every node");
    }

    /// The fingerprint of the test's `jobs.yaml`, as the library computes it.
    fn fingerprint(&self) -> String {
        redcron::config::load(&self.config)
            .expect("the test config is valid")
            .fingerprint()
    }

    /// `redcron <args> -c jobs.yaml`: exit code, stdout, stderr; never a password in either.
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let (code, stdout, stderr) = inspect(&self.dir, &self.config, args);
        assert!(
            !stdout.contains(PASSWORD) && !stderr.contains(PASSWORD),
            "a password leaked:\n{stdout}\n{stderr}"
        );
        (code, stdout, stderr)
    }

    /// `redcron <args> --json`, expecting success and no warnings.
    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        let (code, stdout, stderr) = self.run(&args);
        assert_eq!(code, 0, "{stderr}");
        parse(&stdout)
    }

    /// The ticks of `archive` (`@yearly`), newest first: the last 4 before now.
    fn archive_ticks() -> Vec<Tick> {
        let schedule =
            redcron::schedule::Schedule::parse("@yearly", chrono_tz::UTC).expect("yearly");
        let mut ticks = Vec::new();
        let mut at = Utc::now();
        for _ in 0..4 {
            let tick = schedule.last_at_or_before(at).expect("an earlier year");
            ticks.push(tick);
            at = tick.to_utc() - chrono::Duration::seconds(1);
        }
        ticks
    }

    /// The history and members every test starts from; returns the ticks of `archive`, newest first.
    ///
    /// `archive`: 4 yearly ticks — success by w1; failure by w2, written as current workers write it (its
    /// run names the racers, w2 then w1, and keeps the end of its stderr; w1, a routine loser, wrote
    /// nothing); timeout by w1 (w3 skipped: overlap); failure by w2, written as earlier versions wrote it
    /// (w1 and w3 each wrote its loss): three failures in a row since the last success. `hourly`:
    /// one old tick that nobody ran (w1 no quorum, w2 missed), and before it a run by w4 that never ended.
    /// Workers: w1, w2 on this config (w2 running `hourly`), w3 on another, w4 stopped.
    fn seed(&self) -> Vec<Tick> {
        let ticks = Fixture::archive_ticks();
        let run = |tick: Tick, worker: &str, token: u64, outcome: &str| {
            let start = tick.to_utc() + chrono::Duration::milliseconds(15);
            let mut entry = Entry::new("archive", tick, worker, Kind::Run, start);
            entry.token = Some(token);
            entry.run_id = Some(format!("run-{token}"));
            entry.started_at = Some(start);
            entry.ended_at = Some(start + chrono::Duration::milliseconds(1250));
            entry.outcome = Some(outcome.to_string());
            entry.duration_ms = Some(1250);
            match outcome {
                "success" => entry.exit_code = Some(0),
                "timeout" => entry.signal = Some(15),
                _ => entry.exit_code = Some(3),
            }
            entry
        };
        let other =
            |job: &str, tick: Tick, worker: &str, kind: Kind, reason: &str, by: Option<&str>| {
                let mut entry = Entry::new(job, tick, worker, kind, tick.to_utc());
                entry.reason = Some(reason.to_string());
                entry.by = by.map(str::to_string);
                entry
            };
        let mut named = run(ticks[2], "w2", 2, "failure");
        named.raced = Some(vec!["w2".to_string(), "w1".to_string()]);
        named.tail_err = Some("copying\ndisk full\n".to_string());
        let hourly_tick = hourly_tick();
        let mut unfinished = Entry::new("hourly", hourly_tick_at(-1), "w4", Kind::Run, Utc::now());
        unfinished.token = Some(8);
        self.record(&[
            run(ticks[3], "w1", 1, "success"),
            named,
            run(ticks[1], "w1", 3, "timeout"),
            other("archive", ticks[1], "w3", Kind::Skipped, "overlap", None),
            run(ticks[0], "w2", 4, "failure"),
            other(
                "archive",
                ticks[0],
                "w1",
                Kind::Lost,
                "already_claimed",
                Some("w2"),
            ),
            other(
                "archive",
                ticks[0],
                "w3",
                Kind::Lost,
                "already_claimed",
                Some("w2"),
            ),
            other(
                "hourly",
                hourly_tick,
                "w1",
                Kind::Skipped,
                "no_quorum",
                None,
            ),
            other("hourly", hourly_tick, "w2", Kind::Missed, "unclaimed", None),
            unfinished,
        ]);
        let ours = self.fingerprint();
        let member = |id: &str, fingerprint: &str| Member {
            id: id.to_string(),
            host: format!("host-{id}"),
            pid: 4000,
            version: "0.1.0".to_string(),
            config_fingerprint: fingerprint.to_string(),
            clock_offset_ms: Some(-3),
            started_at: Utc::now(),
            running: Vec::new(),
            heartbeat_ms: 5000,
            honours: Some(vec!["pause".to_string(), "trigger".to_string()]),
            state: "running".to_string(),
            seen_at: None,
            alive: false,
            shared_with: Vec::new(),
        };
        self.announce(&member("w1", &ours));
        let mut w2 = member("w2", &ours);
        w2.running = vec![Running {
            job: "hourly".to_string(),
            tick: hourly_tick.as_millis(),
            token: 9,
        }];
        self.announce(&w2);
        self.announce(&member("w3", OTHER_CONFIG));
        let mut w4 = member("w4", &ours);
        w4.state = "stopped".to_string();
        self.announce(&w4);
        ticks
    }
}

/// An old tick of `hourly`, far from its newest one: `hours` after the newest tick of `archive`.
fn hourly_tick_at(hours: i64) -> Tick {
    Tick(Fixture::archive_ticks()[0].as_millis() + hours * 3_600_000)
}

/// The tick of `hourly` that has entries.
fn hourly_tick() -> Tick {
    hourly_tick_at(5)
}

/// A tick as the commands print it.
fn show(tick: Tick) -> String {
    tick.to_utc()
        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// The line of `table` whose first column is `first`.
fn line<'a>(table: &'a str, first: &str) -> &'a str {
    table
        .lines()
        .find(|line| line.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("no line for {first} in:\n{table}"))
}

/// `redcron <args> -c <config>`, run in `dir`: exit code, stdout, stderr.
pub(crate) fn inspect(dir: &TestDir, config: &Path, args: &[&str]) -> (i32, String, String) {
    output(redcron(dir.path()).args(args).arg("-c").arg(config))
}

/// A command's `--json` output.
pub(crate) fn parse(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}"))
}

/// How many of `history --json`'s controls are `action` (`paused`, `resumed`) of `job`.
pub(crate) fn controls_of(history: &Value, job: &str, action: &str) -> usize {
    let controls = history["controls"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    controls
        .iter()
        .filter(|c| c["job"] == job && c["action"] == action)
        .count()
}
