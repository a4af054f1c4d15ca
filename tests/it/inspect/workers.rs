//! End to end: three real workers race four jobs on three nodes; `history`, `explain` and `status` tell
//! what they did — and, once every worker was killed, that they are dead and the jobs overdue.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::{inspect, parse};
use crate::support::{RedisCluster, TestDir};
use crate::worker::start_workers;

/// One job that succeeds, one that fails, one that times out, one that outlives its interval.
const JOBS: &str = r#"  - name: ok
    schedule: "* * * * * *"
    command: 'true'
  - name: fails
    schedule: "* * * * * *"
    command: 'exit 3'
  - name: slow
    schedule: "*/3 * * * * *"
    command: 'sleep 5'
    timeout: 1s
  - name: long
    schedule: "* * * * * *"
    command: 'sleep 2.5'
"#;

/// Polls `probe` every 200 ms until it gives a value; panics with `what` after `timeout`.
pub(crate) fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A success, a failure, a timeout and an overlap skip, each told by `explain` and listed by `history` as
/// the workers' own logs saw it; `status` shows three live workers on one config; killed, they are shown
/// dead and the jobs overdue.
#[test]
fn what_three_workers_did_is_told_by_history_and_explain() {
    let cluster = RedisCluster::start(3);
    let dir = TestDir::new();
    let mut workers = start_workers(&cluster, &dir, 3, "  heartbeat_every: 1s\n", JOBS);
    let cli_config = dir.join("w0.yaml");
    let json = |args: &[&str]| {
        let mut args = args.to_vec();
        args.push("--json");
        let (code, stdout, stderr) = inspect(&dir, &cli_config, &args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
        parse(&stdout)
    };
    let event =
        |pred: &dyn Fn(&Value) -> bool| workers.iter().flat_map(|w| w.logs()).find(|e| pred(e));

    // Each ended run as its worker logged it, then as `explain` tells it once all 3 workers' entries landed.
    for (job, outcome, told, verdict) in [
        ("ok", "success", ": success, exit code 0", "ran"),
        ("fails", "failure", ": failure, exit code 3", "failed"),
        ("slow", "timeout", ": timeout", "failed"),
    ] {
        // The newest such run as its worker logged it, once `explain` tells its 3 racers: each loser's entry
        // (earlier writers) or the winner's view of them (current ones, whose routine losers write
        // nothing) — 3 either way, but only for ticks after the workers came to see each other, so an
        // early tick (raced by fewer) is passed over for a later one.
        let (finished, story) = wait_for(
            &format!("a {outcome} of {job} raced by all 3 workers"),
            Duration::from_secs(90),
            || {
                let newest = workers
                    .iter()
                    .flat_map(|w| w.logs())
                    .filter(|e| {
                        e["event"] == "run.finished" && e["job"] == job && e["outcome"] == outcome
                    })
                    .max_by_key(|e| e["tick"].as_str().unwrap_or_default().to_string())?;
                let tick = newest["tick"].as_str()?.to_string();
                let story = json(&["explain", job, &tick]);
                let raced = story["raced"].as_array()?.len();
                let ended = !story["runs"][0]["ended_at"].is_null();
                (raced == 3 && ended).then(|| (newest.clone(), story.clone()))
            },
        );
        let tick = finished["tick"].as_str().expect("tick").to_string();
        assert_eq!(story["verdict"], verdict, "{story}");
        assert_eq!(story["on_schedule"], true);
        let run = &story["runs"][0];
        assert_eq!(run["outcome"], outcome);
        assert_eq!(run["worker"], finished["worker"]);
        assert_eq!(run["token"], finished["token"]);
        let (code, text, stderr) = inspect(&dir, &cli_config, &["explain", job, &tick]);
        assert_eq!(code, 0, "{stderr}");
        let won = format!(
            "{} won it with token {}",
            finished["worker"].as_str().expect("worker"),
            finished["token"]
        );
        assert!(
            text.contains(&won) && text.contains(told),
            "{won:?}, {told:?} not in:\n{text}"
        );
        let history = json(&["history", "--job", job, "--limit", "5000"]);
        let listed = history["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .any(|e| {
                e["kind"] == "run" && e["token"] == finished["token"] && e["outcome"] == outcome
            });
        assert!(
            listed,
            "the {outcome} of {job} at {tick} is not in the history"
        );
        // One record per tick, the run its record; never two runs of one tick.
        let ticks = history["ticks"].as_array().expect("ticks");
        let record = ticks
            .iter()
            .find(|t| t["token"] == finished["token"])
            .unwrap_or_else(|| panic!("no tick of {job} run with {}", finished["token"]));
        assert_eq!(
            (&record["kind"], &record["outcome"]),
            (&"run".into(), &outcome.into())
        );
        assert!(
            ticks
                .iter()
                .all(|t| t["other_runs"] == serde_json::json!([])),
            "a double run of {job}: {history}"
        );
    }

    // A tick of `long` taken while its previous run held the job: skipped for overlap, and said so.
    let busy = wait_for(
        "a tick of long lost to its previous run",
        Duration::from_secs(60),
        || event(&|e| e["event"] == "tick.lost" && e["job"] == "long" && e["reason"] == "busy"),
    );
    let tick = busy["tick"].as_str().expect("tick").to_string();
    let story = wait_for("the overlap skip's entry", Duration::from_secs(30), || {
        let story = json(&["explain", "long", &tick]);
        let skipped = story["entries"]
            .as_array()?
            .iter()
            .any(|e| e["kind"] == "skipped" && e["reason"] == "overlap");
        skipped.then_some(story)
    });
    assert_eq!(story["runs"], serde_json::json!([]), "{story}");
    assert!(
        story["story"]
            .to_string()
            .contains("skipped it: overlap: the job's previous run still held it"),
        "{story}"
    );

    // Three live workers on the same config; every job accounted for.
    let status = json(&["status"]);
    let live: Vec<(&Value, &Value, &Value)> = status["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .map(|w| (&w["alive"], &w["config_differs"], &w["runs_this_config"]))
        .collect();
    let (yes, no) = (&Value::Bool(true), &Value::Bool(false));
    assert_eq!(live, vec![(yes, no, yes); 3], "{status}");
    let jobs = status["jobs"].as_array().expect("jobs");
    assert!(jobs.iter().all(|j| j["overdue"].is_null()), "{status}");
    assert!(
        jobs[1]["failures_in_a_row"].as_u64().expect("a count") >= 1,
        "{status}"
    );

    // Every worker killed: dead once their heartbeats expire, and a tick whose window then ends is overdue.
    for worker in &mut workers {
        worker.kill();
    }
    wait_for(
        "dead workers and an overdue job",
        Duration::from_secs(60),
        || {
            let status = json(&["status"]);
            let dead = status["workers"]
                .as_array()?
                .iter()
                .all(|w| w["alive"] == false);
            let overdue = !status["jobs"][0]["overdue"].is_null();
            (dead && overdue).then_some(())
        },
    );
    let (code, text, _) = inspect(&dir, &cli_config, &["status"]);
    assert_eq!(code, 0);
    assert!(
        text.lines()
            .any(|l| l.starts_with("ok ") && l.contains("OVERDUE: no entry for")),
        "{text}"
    );
}
