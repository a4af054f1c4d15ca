//! A clock far ahead never moves the fencing tokens: a `redcron trigger` run on a host whose clock says
//! 2300 (libfaketime), and a trigger request planted in the store with that time, on 5 Redis nodes, a
//! 3-member etcd cluster and the embedded store, with two real workers.
//!
//! Before, the request's time was the command host's clock, compared with nothing: the winner's token
//! took the floor of the year 2300 (`tick × 1000`, past 2^53), and on Redis every later run got the same
//! token, because `CONFIRM` compared the fence in Lua doubles.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use redcron::history::{Entry, Kind, Query};
use redcron::lock::keys::token_floor;
use redcron::schedule::Tick;
use redcron::store::Store;
use redcron::trigger::TriggerRequest;
use serde_json::Value;

use crate::cli::redcron;
use crate::inspect::parse;
use crate::support::{libfaketime, Backend, Cluster, TestDir, Worker};
use crate::worker::start_workers_with;

/// The far future of the wrong clock.
const FAR: &str = "2300-01-01T00:00:00Z";

/// A job due every second that does nothing: the tokens are read from the history.
const JOB: &str = "  - name: tick\n    schedule: \"* * * * * *\"\n    command: 'true'\n";

/// Where the workers keep their state.
enum Site {
    Shared(Cluster),
    /// The embedded store: `redcron.db` beside the workers' configs, one file for both.
    Embedded,
}

impl Site {
    fn config(&self, worker: &str) -> String {
        match self {
            Site::Shared(cluster) => cluster.config(worker, JOB),
            Site::Embedded => crate::embedded::config_with(worker, JOB),
        }
    }

    /// Whether the command can read the cluster's time from the store (the Redis nodes' clocks, a SQL
    /// server's) and so corrects its own; elsewhere it refuses a clock far off the workers'.
    fn corrects(&self) -> bool {
        matches!(self, Site::Shared(cluster)
            if matches!(cluster.backend(), Backend::Redis | Backend::Postgres | Backend::Mariadb))
    }
}

/// The store the workers use, opened from a worker's config, with a runtime to drive it.
struct Reader {
    runtime: tokio::runtime::Runtime,
    store: Store,
}

impl Reader {
    fn open(config: &std::path::Path) -> Reader {
        let config = redcron::config::load(config).expect("a valid config");
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        let store = {
            let _inside = runtime.enter();
            Store::open(&config).expect("the store opens")
        };
        Reader { runtime, store }
    }

    fn runs(&self) -> Vec<Entry> {
        let query = Query {
            job: "tick".into(),
            since: None,
            until: None,
            limit: 1_000,
        };
        let read = self.runtime.block_on(self.store.history(&query));
        let entries = read.expect("the history is read").value;
        entries
            .into_iter()
            .filter(|e| e.kind == Kind::Run)
            .collect()
    }

    /// Waits until `count` scheduled runs of a tick after `after` are in the history.
    fn wait_for_runs_after(&self, after: DateTime<Utc>, count: usize) -> Vec<Entry> {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let runs = self.runs();
            let later = runs
                .iter()
                .filter(|r| r.trigger.is_none() && r.tick > after.timestamp_millis())
                .count();
            if later >= count {
                return runs;
            }
            assert!(
                Instant::now() < deadline,
                "fewer than {count} runs after {after}: {runs:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn pending(&self) -> Vec<TriggerRequest> {
        let read = self.runtime.block_on(self.store.triggers());
        read.expect("the requests are read").value
    }
}

/// The first event of any of `workers` that matches `pred`, within `timeout`.
fn wait_any(workers: &[Worker], timeout: Duration, pred: impl Fn(&Value) -> bool) -> Option<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let found = workers
            .iter()
            .find_map(|w| w.logs().into_iter().find(|e| pred(e)));
        if found.is_some() || Instant::now() >= deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The scenario of [`a_clock_far_ahead_moves_no_token`] at `site`.
fn far_ahead(site: Site) {
    let dir = TestDir::new();
    let mut workers = start_workers_with(&dir, 2, |worker| site.config(worker));
    if site.corrects() {
        // On Redis a worker whose own clock says 2300 runs on the nodes' time, and takes part.
        let path = dir.write("w2.yaml", site.config("  id: w2\n"));
        let skewed = Worker::builder(path)
            .faketime("@2300-01-01 00:00:00")
            .spawn();
        let offset = skewed
            .wait_for_event("clock.offset", Duration::from_secs(10))
            .expect("the skewed worker measures its offset");
        assert!(
            offset["offset_ms"].as_i64() < Some(-1_000_000_000),
            "{offset}"
        );
        workers.push(skewed);
    }
    let config = dir.join("w0.yaml");
    let reader = Reader::open(&config);
    let start = Utc::now();
    reader.wait_for_runs_after(start, 2);

    // A request written straight into the store, with the far time and a 30 s window.
    let far: DateTime<Utc> = FAR.parse().expect("a time");
    let planted = TriggerRequest::new("tick", far, Duration::from_secs(30), "planted@test");
    let written = reader
        .runtime
        .block_on(reader.store.request_trigger(&planted));
    written.expect("the request is written");
    let refused = wait_any(&workers, Duration::from_secs(20), |e| {
        e["event"] == "trigger.refused" && e["trigger"] == planted.id.as_str()
    })
    .expect("a worker refuses the planted request");
    assert_eq!(refused["reason"], "ahead", "{refused}");
    assert_eq!(refused["job"], "tick", "{refused}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while reader.pending().iter().any(|r| r.id == planted.id) {
        assert!(
            Instant::now() < deadline,
            "the refused request is still in the store"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // The command, on a host whose clock says 2300.
    let library = libfaketime().expect("libfaketime.so.1 (package faketime)");
    let output = redcron(dir.path())
        .args(["trigger", "tick", "--json", "-c"])
        .arg(&config)
        .env("LD_PRELOAD", library)
        .env("FAKETIME", "@2300-01-01 00:00:00")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .output()
        .expect("run redcron trigger");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let mut triggered = None;
    if site.corrects() {
        assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
        let report = parse(&stdout);
        let asked: DateTime<Utc> = report["request"]["requested_at"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .expect("the request's time");
        let off = (asked - Utc::now()).num_seconds().abs();
        assert!(off < 60, "asked at {asked}, {off} s off the cluster's time");
        assert!(stderr.contains("ahead"), "a note on the clock: {stderr}");
        triggered = report["request"]["id"].as_str().map(str::to_string);
    } else {
        assert_eq!(output.status.code(), Some(1), "{stdout}{stderr}");
        assert!(stderr.contains("clock"), "{stderr}");
        assert!(stderr.contains("ahead"), "{stderr}");
    }

    let after = Utc::now();
    let runs = reader.wait_for_runs_after(after, 3);
    assert!(
        runs.iter()
            .all(|r| r.trigger.as_deref() != Some(planted.id.as_str())),
        "the planted request ran: {runs:?}"
    );
    if let Some(id) = &triggered {
        assert!(
            runs.iter()
                .any(|r| r.trigger.as_deref() == Some(id.as_str())),
            "the command's request ran: {runs:?}"
        );
    }
    // Every token is one of now: below the floor of an hour from now.
    let limit = token_floor(Tick(
        (Utc::now() + chrono::Duration::hours(1)).timestamp_millis(),
    ));
    for run in &runs {
        let token = run.token.expect("a run has a token");
        assert!(token < limit, "token {token} is past now's: {run:?}");
    }
    // The scheduled runs' tokens rise with their ticks, and no two runs share a token.
    let mut scheduled: Vec<&Entry> = runs.iter().filter(|r| r.trigger.is_none()).collect();
    scheduled.sort_by_key(|r| r.tick);
    for pair in scheduled.windows(2) {
        assert!(
            pair[1].token > pair[0].token,
            "token {:?} at {} after {:?} at {}",
            pair[1].token,
            pair[1].tick,
            pair[0].token,
            pair[0].tick
        );
    }
    // The worker at 2300 raced the ticks of now, on the nodes' time.
    if let Some(skewed) = workers.get(2) {
        let raced: Vec<Value> = (skewed.logs().into_iter())
            .filter(|e| e["event"] == "tick.won" || e["event"] == "tick.lost")
            .collect();
        assert!(!raced.is_empty(), "the skewed worker raced nothing");
        for event in &raced {
            let tick: DateTime<Utc> = event["tick"]
                .as_str()
                .and_then(|t| t.parse().ok())
                .expect("a tick");
            assert!((tick - Utc::now()).num_minutes().abs() < 5, "{event}");
        }
    }
    let mut tokens: Vec<u64> = runs.iter().filter_map(|r| r.token).collect();
    tokens.sort_unstable();
    let count = tokens.len();
    tokens.dedup();
    assert_eq!(tokens.len(), count, "two runs share a token: {runs:?}");
}

/// A request planted in the store with the time 2300 is refused by the workers (`trigger.refused`),
/// removed and never run; then `redcron trigger` run with the clock at 2300 either asks at the cluster's
/// time (Redis, PostgreSQL: its run has a token of now) or refuses (etcd, embedded: no clock to correct
/// by, exit 1). Throughout, every run's token is one of now, and the scheduled runs' tokens rise strictly,
/// three runs and more after it. Where the store has a clock, a third worker, whose clock says 2300, races
/// the ticks of now with them. On Redis, etcd and PostgreSQL.
fn a_clock_far_ahead_moves_no_token(backend: Backend) {
    far_ahead(Site::Shared(backend.start()));
}

/// [`a_clock_far_ahead_moves_no_token`] on the embedded store: two workers on one file.
#[test]
fn a_clock_far_ahead_moves_no_token_on_the_embedded_store() {
    far_ahead(Site::Embedded);
}

crate::on_every_store!(
    async: [],
    sync: [a_clock_far_ahead_moves_no_token],
);
