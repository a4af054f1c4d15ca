//! `pause` and `trigger` with a live worker of an earlier release in the fleet: one that announces no
//! capabilities (`honours`) would go on running a paused job's ticks (its claim scripts never look at the
//! pause) and never claims a trigger request, so both commands name it and refuse (exit 5) unless told
//! `--even-if-ignored`; with current workers only they act as before.
//!
//! The old worker is its announcement: the JSON an earlier release wrote (no `honours` field), written
//! through the store's unchanged announcement path, alive for half an hour.

use std::path::Path;
use std::time::Duration;

use redcron::membership::Member;
use redcron::store::Store;

use crate::inspect::workers::wait_for;
use crate::inspect::{inspect, parse};
use crate::support::{Backend, TestDir};
use crate::worker::{ledger_job, start_workers_with};

/// What a worker of a release before pause and trigger announced: no `honours` field.
const OLD_ANNOUNCEMENT: &str = r#"{"id":"legacy-7","host":"oldhost","pid":4242,"version":"0.0.9",
  "config_fingerprint":"0123456789abcdef","started_at":"2026-11-23T10:00:00Z","running":[],
  "heartbeat_ms":600000,"state":"running"}"#;

/// Writes [`OLD_ANNOUNCEMENT`] into the store `config` names, as that worker's heartbeat would.
fn announce_old_worker(config: &Path) {
    let config = redcron::config::load(config).expect("a valid config");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let store = Store::open(&config).expect("the store opens");
        let member: Member = serde_json::from_str(OLD_ANNOUNCEMENT).expect("an old announcement");
        store.announce(&member).await.expect("announced");
    });
}

/// Waits until `status` shows `worker` alive.
fn wait_alive(dir: &TestDir, config: &Path, worker: &str) {
    wait_for(&format!("{worker} alive"), Duration::from_secs(20), || {
        let (_, stdout, _) = inspect(dir, config, &["status", "--json"]);
        let status: serde_json::Value = serde_json::from_str(&stdout).ok()?;
        let workers = status["workers"].as_array()?.clone();
        workers
            .iter()
            .any(|w| w["id"] == worker && w["alive"] == true)
            .then_some(())
    });
}

/// Whether `status` shows `job` paused.
fn paused(dir: &TestDir, config: &Path, job: &str) -> bool {
    let (code, stdout, stderr) = inspect(dir, config, &["status", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let status = parse(&stdout);
    let jobs = status["jobs"].as_array().expect("jobs").clone();
    let found = jobs.iter().find(|j| j["name"] == job).expect("the job");
    !found["paused"].is_null()
}

/// The scenario on the store `config` names, with the current worker `w0` running `tick`: pause and
/// trigger work with current workers only; with the old worker alive, both refuse with exit 5 naming it
/// (and nothing is written; `pause --all` too), and act with `--even-if-ignored`, saying which worker
/// ignores them; `resume` is never refused.
fn pause_and_trigger_refuse_while_a_worker_ignores_them(dir: &TestDir, config: &Path) {
    wait_alive(dir, config, "w0");
    // A fleet of current workers: pause and resume as before.
    let (code, stdout, stderr) = inspect(dir, config, &["pause", "tick"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("no claim of it is granted anywhere"),
        "{stdout}"
    );
    let (code, _, stderr) = inspect(dir, config, &["resume", "tick"]);
    assert_eq!(code, 0, "{stderr}");

    announce_old_worker(config);
    wait_alive(dir, config, "legacy-7");
    let (code, stdout, stderr) = inspect(dir, config, &["pause", "tick"]);
    assert_eq!(code, 5, "pause must refuse: {stdout}{stderr}");
    assert!(
        stderr.contains("legacy-7") && stderr.contains("oldhost") && stderr.contains("0.0.9"),
        "the refusal names the old worker: {stderr}"
    );
    assert!(stderr.contains("--even-if-ignored"), "{stderr}");
    assert!(!stderr.contains("w0"), "w0 honours pause: {stderr}");
    assert!(
        !paused(dir, config, "tick"),
        "a refused pause writes nothing"
    );
    let (code, stdout, stderr) = inspect(dir, config, &["pause", "--all"]);
    assert_eq!(code, 5, "pause --all must refuse: {stdout}{stderr}");
    assert!(
        stderr.contains("legacy-7") && stderr.contains("redcron pause --all --even-if-ignored"),
        "{stderr}"
    );
    assert!(
        !paused(dir, config, "tick"),
        "a refused pause --all writes nothing"
    );

    let (code, stdout, stderr) = inspect(dir, config, &["trigger", "tick", "--timeout", "5s"]);
    assert_eq!(code, 5, "trigger must refuse: {stdout}{stderr}");
    assert!(stderr.contains("legacy-7"), "{stderr}");
    let (_, status, _) = inspect(dir, config, &["status", "--json"]);
    let status = parse(&status);
    assert_eq!(
        status["jobs"][0]["pending_triggers"],
        serde_json::json!([]),
        "a refused trigger writes no request: {status}"
    );

    let (code, stdout, stderr) = inspect(dir, config, &["pause", "tick", "--even-if-ignored"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("legacy-7") && !stdout.contains("granted anywhere"),
        "the report says which worker ignores the pause: {stdout}"
    );
    assert!(paused(dir, config, "tick"));
    let (code, _, stderr) = inspect(
        dir,
        config,
        &["pause", "tick", "--json", "--even-if-ignored"],
    );
    assert_eq!(code, 0, "{stderr}");
    let (code, stdout, stderr) = inspect(dir, config, &["resume", "tick"]);
    assert_eq!(code, 0, "resume is never refused: {stdout}{stderr}");
    assert!(!paused(dir, config, "tick"));

    let (code, stdout, stderr) = inspect(
        dir,
        config,
        &["trigger", "tick", "--even-if-ignored", "--timeout", "20s"],
    );
    assert_eq!(code, 0, "w0 runs the request: {stdout}{stderr}");
    assert!(stdout.contains("w0 won it"), "{stdout}");
}

/// A live worker of an earlier release makes `pause` and `trigger` refuse, naming it; on Redis and on etcd.
fn a_live_worker_of_an_earlier_release_makes_pause_and_trigger_refuse(backend: Backend) {
    let cluster = backend.start();
    let dir = TestDir::new();
    let job = ledger_job("tick", "@yearly", &dir.ledger());
    let _workers = start_workers_with(&dir, 1, |worker| {
        cluster.config(&format!("{worker}  heartbeat_every: 1s\n"), &job)
    });
    pause_and_trigger_refuse_while_a_worker_ignores_them(&dir, &dir.join("w0.yaml"));
}

/// The same on the embedded store, whose workers on one host share one database file.
#[test]
fn a_live_worker_of_an_earlier_release_makes_pause_and_trigger_refuse_embedded() {
    let dir = TestDir::new();
    let job = ledger_job("tick", "@yearly", &dir.ledger());
    let (_worker, config) = crate::embedded::start_worker(&dir, "w0", &job);
    pause_and_trigger_refuse_while_a_worker_ignores_them(&dir, &config);
}

crate::on_every_store!(
    async: [],
    sync: [a_live_worker_of_an_earlier_release_makes_pause_and_trigger_refuse],
);
