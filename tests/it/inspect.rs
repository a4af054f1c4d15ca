//! `status`, `history` and `explain`: the built binary reading what was written through the library's
//! `Store` to real `redis-server` nodes (with a password, which must never show).
//!
//! Each test seeds members and history entries with `Store::announce` and `Store::record`, then checks the
//! commands' tables and JSON — and what they do when a node is down, when no majority answers, and when a
//! node holds garbage.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

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
struct Fixture {
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
        let (code, stdout, stderr) = output(
            redcron(self.dir.path())
                .args(args)
                .arg("-c")
                .arg(&self.config),
        );
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
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}"))
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
    /// `archive`: 4 yearly ticks — success by w1; failure by w2 (w1 lost to it); timeout by w1 (w3 skipped:
    /// overlap); failure by w2 (w1 and w3 lost): three failures in a row since the last success. `hourly`:
    /// one old tick that nobody ran (w1 no quorum, w2 missed). Workers: w1, w2 on this config (w2 running
    /// `hourly`), w3 on another, w4 stopped.
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
        let hourly_tick = hourly_tick();
        self.record(&[
            run(ticks[3], "w1", 1, "success"),
            run(ticks[2], "w2", 2, "failure"),
            other(
                "archive",
                ticks[2],
                "w1",
                Kind::Lost,
                "already_claimed",
                Some("w2"),
            ),
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
            state: "running".to_string(),
            seen_at: None,
            alive: false,
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

/// `status`: alive, stopped and other-config workers marked; each job's last run, failures in a row, last
/// success; a job whose newest ended tick has no entry is overdue, a disabled one is not.
#[test]
fn status_shows_workers_and_jobs() {
    let fixture = Fixture::new();
    let ticks = fixture.seed();
    let ours = fixture.fingerprint();
    let (code, stdout, stderr) = fixture.run(&["status"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert!(stdout.contains(&format!("fingerprint {ours}")), "{stdout}");
    let w1 = line(&stdout, "w1");
    assert!(
        w1.contains("alive") && w1.contains(&format!("{ours} (this config)")),
        "{w1}"
    );
    assert!(line(&stdout, "w2").contains(&format!("hourly@{}#9", show(hourly_tick()))));
    assert!(line(&stdout, "w3").contains(&format!("{OTHER_CONFIG} DIFFERS")));
    assert!(line(&stdout, "w4").contains("stopped"));
    let archive = line(&stdout, "archive");
    for part in [
        show(ticks[0]).as_str(),
        " w2 ",
        " 4 ",
        "failure",
        "1.250s",
        " 3 ",
        show(ticks[3]).as_str(),
    ] {
        assert!(archive.contains(part), "{part:?} not in {archive}");
    }
    assert!(
        line(&stdout, "hourly").contains("OVERDUE: no entry for"),
        "{stdout}"
    );
    let idle = line(&stdout, "idle");
    assert!(
        idle.contains("disabled") && !idle.contains("OVERDUE"),
        "{idle}"
    );

    let json = fixture.json(&["status"]);
    assert_eq!(json["config"]["fingerprint"], ours.as_str());
    assert_eq!(json["config_majority"], ours.as_str());
    assert_eq!(json["missing_nodes"], serde_json::json!([]));
    let workers = json["workers"].as_array().expect("workers");
    let flags: Vec<(&str, bool, bool, bool)> = workers
        .iter()
        .map(|w| {
            let flag = |name: &str| w[name].as_bool().expect("a bool");
            (
                w["id"].as_str().expect("id"),
                flag("alive"),
                flag("config_differs"),
                flag("runs_this_config"),
            )
        })
        .collect();
    assert_eq!(
        flags,
        [
            ("w1", true, false, true),
            ("w2", true, false, true),
            ("w3", true, true, false),
            ("w4", false, false, true)
        ]
    );
    assert_eq!(workers[0]["host"], "host-w1");
    assert_eq!(workers[0]["clock_offset_ms"], -3);
    let jobs = json["jobs"].as_array().expect("jobs");
    let archive = &jobs[0];
    assert_eq!(archive["last_run"]["token"], 4);
    assert_eq!(archive["last_run"]["tick"], ticks[0].as_millis());
    assert_eq!(archive["failures_in_a_row"], 3);
    assert_eq!(archive["last_success"]["tick"], ticks[3].as_millis());
    assert!(archive["overdue"].is_null());
    assert!(jobs[1]["overdue"]["tick"].is_string(), "{}", jobs[1]);
    assert_eq!(jobs[1]["running"][0]["worker"], "w2");
    assert!(jobs[2]["overdue"].is_null());
}

/// `history`: every job's entries merged newest first, `--job`, `--limit`, `--since` (an instant or a
/// duration back); an unknown job or a limit out of range is a usage error.
#[test]
fn history_lists_entries_newest_first() {
    let fixture = Fixture::new();
    let ticks = fixture.seed();
    let (code, stdout, stderr) = fixture.run(&["history", "--limit", "5"]);
    assert_eq!(code, 0, "{stderr}");
    let rows: Vec<&str> = stdout.lines().skip(1).collect();
    assert_eq!(rows.len(), 5, "{stdout}");
    assert!(rows[0].starts_with(&show(hourly_tick())), "{stdout}");
    assert!(
        rows[2].starts_with(&format!("{}  archive  lost     w1", show(ticks[0]))),
        "{stdout}"
    );
    assert!(
        rows[3].contains("run") && rows[3].contains("failure") && rows[3].contains("run-4"),
        "{stdout}"
    );

    let json = fixture.json(&["history", "--job", "archive"]);
    let entries = json["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 8);
    let order: Vec<i64> = entries
        .iter()
        .map(|e| e["tick"].as_i64().expect("tick"))
        .collect();
    assert!(order.windows(2).all(|w| w[0] >= w[1]), "{order:?}");
    assert_eq!(entries[7]["outcome"], "success");
    assert_eq!(entries[3]["signal"], 15);

    let since = show(ticks[1]);
    let json = fixture.json(&["history", "--job", "archive", "--since", &since]);
    assert_eq!(json["entries"].as_array().expect("entries").len(), 5);
    let json = fixture.json(&["history", "--since", "1h"]);
    assert_eq!(json["entries"], serde_json::json!([]));
    let (code, stdout, _) = fixture.run(&["history", "--job", "idle"]);
    assert_eq!((code, stdout.as_str()), (0, "no entries\n"));

    let (code, _, stderr) = fixture.run(&["history", "--job", "nope"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("no job named \"nope\"")
            && stderr.contains("known jobs: archive, hourly, idle"),
        "{stderr}"
    );
    for limit in ["0", "5001"] {
        let (code, _, stderr) = fixture.run(&["history", "--limit", limit]);
        assert_eq!(code, 2, "{stderr}");
    }
    let (code, _, stderr) = fixture.run(&["history", "--since", "yesterday"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("is neither an RFC 3339 timestamp"),
        "{stderr}"
    );
}

/// `explain`: a run's story (who raced, who won with which token, how it ended), a tick nobody ran (the
/// skips and the miss), a tick with no entry at all (a hint), a tick off the schedule (the nearest ones),
/// an unknown job and a malformed tick (usage errors).
#[test]
fn explain_tells_one_ticks_story() {
    let fixture = Fixture::new();
    let ticks = fixture.seed();
    let (code, stdout, stderr) = fixture.run(&["explain", "archive", &show(ticks[0])]);
    assert_eq!(code, 0, "{stderr}");
    for part in [
        "raced by 3 workers: w1, w2, w3",
        "w2 won it with token 4 (run run-4)",
        ": failure, exit code 3, after 1.250s",
        "w1 lost it to w2: already_claimed",
    ] {
        assert!(stdout.contains(part), "{part:?} not in:\n{stdout}");
    }
    let json = fixture.json(&["explain", "archive", &show(ticks[1])]);
    assert_eq!(json["verdict"], "ran");
    assert_eq!(json["on_schedule"], true);
    assert_eq!(json["runs"][0]["outcome"], "timeout");
    assert_eq!(json["entries"].as_array().expect("entries").len(), 2);

    let (code, stdout, _) = fixture.run(&["explain", "hourly", &show(hourly_tick())]);
    assert_eq!(code, 0);
    for part in [
        "w1 skipped it: no_quorum",
        "w2 raised the alarm: missed, nobody ran it within its window (unclaimed: nobody claimed it",
        "nobody ran it",
    ] {
        assert!(stdout.contains(part), "{part:?} not in:\n{stdout}");
    }
    let json = fixture.json(&["explain", "hourly", &show(hourly_tick_at(6))]);
    assert_eq!(json["verdict"], "no_entry");
    assert!(json["story"]
        .to_string()
        .contains("no entry: nobody accounted for this tick"));
    assert!(json["hint"]
        .as_str()
        .expect("a hint")
        .contains("no worker recorded it"));

    let between = Tick(hourly_tick().as_millis() - 1_800_000);
    let (code, stdout, _) = fixture.run(&["explain", "hourly", &show(between)]);
    assert_eq!(code, 0);
    let expected = format!(
        "{} is not a tick of hourly (\"0 * * * *\" in UTC); the nearest are {} before and {} after",
        show(between),
        show(hourly_tick_at(4)),
        show(hourly_tick())
    );
    assert!(stdout.contains(&expected), "{expected:?} not in:\n{stdout}");

    let (code, _, stderr) = fixture.run(&["explain", "nightly", "2026-01-01T00:00:00Z"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("no job named \"nightly\"")
            && stderr.contains("known jobs: archive, hourly, idle"),
        "{stderr}"
    );
    let (code, _, stderr) = fixture.run(&["explain", "archive", "yesterday"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("expected an RFC 3339 timestamp"),
        "{stderr}"
    );
}

/// A node killed: the commands answer from the other two and name it, on stderr and in `missing_nodes`.
#[test]
fn a_missing_node_is_named_and_the_majority_answers() {
    let mut fixture = Fixture::new();
    let ticks = fixture.seed();
    fixture.cluster.kill(2);
    let node = format!("redis://:***@127.0.0.1:{}", fixture.cluster.port(2));
    let (code, stdout, stderr) = fixture.run(&["history", "--job", "archive", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!("warning: node {node} did not answer")),
        "{stderr}"
    );
    let json: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["missing_nodes"][0]["node"], node.as_str());
    assert_eq!(json["entries"].as_array().expect("entries").len(), 8);
    for args in [vec!["status"], vec!["explain", "archive", &show(ticks[0])]] {
        let (code, stdout, stderr) = fixture.run(&args);
        assert_eq!(code, 0, "{stderr}");
        assert!(stderr.contains(&node), "{args:?}: {stderr}");
        assert!(!stdout.is_empty());
    }
}

/// No majority (one node killed, one hung): exit 3 and an error naming both, without their password,
/// within the command's bound.
#[test]
fn no_majority_exits_3_naming_the_nodes() {
    let mut fixture = Fixture::new();
    fixture.seed();
    fixture.cluster.kill(1);
    fixture.cluster.stop(2);
    for args in [
        vec!["status"],
        vec!["history"],
        vec!["explain", "archive", "2026-01-01T00:00:00Z"],
    ] {
        let mut command = redcron(fixture.dir.path());
        command.args(&args).arg("-c").arg(&fixture.config);
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn redcron");
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().expect("wait").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{args:?} did not end within 60 s with a hung node");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().expect("output");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty());
        assert!(stderr.contains("error: the store could not be reached: no majority: 1 of 3 nodes answered, 2 needed"), "{stderr}");
        for i in [1, 2] {
            let node = format!("redis://:***@127.0.0.1:{}", fixture.cluster.port(i));
            assert!(stderr.contains(&node), "{node} not named in {stderr}");
        }
        assert!(!stderr.contains(PASSWORD), "{stderr}");
    }
    fixture.cluster.cont(2);
}

/// A node holding a garbage entry: it is skipped with a warning naming the node; the other entries, and
/// the same ones from the other nodes, still come out.
#[test]
fn a_garbage_entry_is_skipped_with_a_warning() {
    let fixture = Fixture::new();
    let ticks = fixture.seed();
    let id = format!("{}|ghost|run", ticks[0].as_millis());
    let _: i64 = fixture.cluster.query(
        0,
        redis::cmd("HSET")
            .arg("redcron:{archive}:history")
            .arg(&id)
            .arg("{not json"),
    );
    let _: i64 = fixture.cluster.query(
        0,
        redis::cmd("ZADD")
            .arg("redcron:{archive}:history:index")
            .arg(ticks[0].as_millis())
            .arg(&id),
    );
    let node = format!("redis://:***@127.0.0.1:{}", fixture.cluster.port(0));
    let (code, stdout, stderr) = fixture.run(&["history", "--job", "archive"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!("warning: {node}: history entry skipped:")),
        "{stderr}"
    );
    assert_eq!(stdout.lines().count(), 9, "{stdout}");
    for args in [
        vec!["status", "--json"],
        vec!["explain", "archive", &show(ticks[0]), "--json"],
    ] {
        let (code, stdout, stderr) = fixture.run(&args);
        assert_eq!(code, 0, "{stderr}");
        let json: Value = serde_json::from_str(&stdout).expect("JSON");
        assert!(
            json["skipped"][0]
                .as_str()
                .expect("a skipped item")
                .starts_with(&node),
            "{json}"
        );
    }
}
