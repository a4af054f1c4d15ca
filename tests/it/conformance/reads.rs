//! Reads beside the lock path: a worker's dashboard hammered with reads of a large history must not
//! delay its claims, renewals or releases — on the embedded store the lock path has its own connection
//! and the reads a few read-only ones, on a SQL store the reads a pool of their own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use redcron::history::{Entry, Kind};
use redcron::lock::LockSettings;
use redcron::schedule::Tick;

use crate::metrics::listening_worker;
use crate::support::{heavy, Backend, TestDir};

/// Ticks of the large job's history, and the bytes of each of its two output tails.
const TICKS: i64 = 200;
const TAIL: usize = 32 * 1024;

/// How long the readers hammer the dashboard, and how many at once.
const HAMMER: Duration = Duration::from_secs(10);
const READERS: usize = 8;

/// A job's history of 200 failed runs with 64 KB of output each (12.8 MB), then 8 threads reading all of
/// it through the worker's dashboard (`/api/history?job=big&limit=5000`) for 10 s, while the worker runs
/// a job that sleeps past several TTLs and a job every second: no renewal fails, no lease is lost, no
/// tick of the every-second job is skipped, missed or started late by more than a second.
pub(super) async fn reads_of_a_large_history_never_delay_claims_or_renewals(backend: Backend) {
    let _place = heavy();
    let cluster = backend.start();
    let store = cluster.store(LockSettings::default());
    let start = Utc::now().timestamp_millis() / 1000 * 1000 - 3_600_000;
    let tail = "x".repeat(TAIL);
    for batch in 0..TICKS / 10 {
        let entries: Vec<Entry> = (0..10)
            .map(|i| {
                let tick = Tick(start + (batch * 10 + i) * 1000);
                let mut entry = Entry::new("big", tick, "filler", Kind::Run, Utc::now());
                entry.outcome = Some("failure".to_string());
                entry.exit_code = Some(1);
                entry.tail_out = Some(tail.clone());
                entry.tail_err = Some(tail.clone());
                entry
            })
            .collect();
        store.record(&entries).await.expect("the history is written");
    }
    drop(store);
    tokio::task::spawn_blocking(move || hammer(&cluster))
        .await
        .expect("the test's thread");
}

/// The worker and the readers of [`reads_of_a_large_history_never_delay_claims_or_renewals`].
fn hammer(cluster: &testkit::Cluster) {
    let dir = TestDir::new();
    let jobs = "  - name: long\n    schedule: \"* * * * * *\"\n    command: [\"sleep\", \"8\"]\n\
                \x20 - name: every\n    schedule: \"* * * * * *\"\n    command: [\"true\"]\n\
                \x20 - name: big\n    schedule: \"0 0 1 1 *\"\n    command: [\"true\"]\n";
    let (worker, port) = listening_worker(&dir, "reads", |port| {
        cluster.config(
            &format!("  id: w1\n  listen: 127.0.0.1:{port}\n"),
            jobs,
        )
    });
    worker
        .wait_for(Duration::from_secs(30), |e| {
            e["event"] == "run.started" && e["job"] == "long"
        })
        .unwrap_or_else(|| panic!("the long job never started: {:?}", worker.lines()));
    worker
        .wait_for(Duration::from_secs(30), |e| {
            e["event"] == "run.finished" && e["job"] == "every"
        })
        .unwrap_or_else(|| panic!("the every-second job never ran: {:?}", worker.lines()));

    let url = format!("http://127.0.0.1:{port}/api/history?job=big&limit=5000");
    let (stop, bytes, answered) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let began = Utc::now();
    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            let (url, stop) = (url.clone(), Arc::clone(&stop));
            let (bytes, answered) = (Arc::clone(&bytes), Arc::clone(&answered));
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .proxy(None)
                    .timeout_global(Some(Duration::from_secs(60)))
                    .build()
                    .into();
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut response) = agent.get(&url).call() else {
                        continue;
                    };
                    let body = response
                        .body_mut()
                        .with_config()
                        .limit(200 * 1024 * 1024)
                        .read_to_vec()
                        .unwrap_or_default();
                    if response.status() == 200 {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let hammered = Instant::now();
    while hammered.elapsed() < HAMMER {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        let _ = reader.join();
    }
    let ended = Utc::now();
    let (answered, bytes) = (
        answered.load(Ordering::Relaxed),
        bytes.load(Ordering::Relaxed),
    );
    eprintln!(
        "{}: {answered} reads answered in {:?}, {} MB served",
        cluster.backend().name(),
        hammered.elapsed(),
        bytes / 1_000_000
    );
    assert!(answered > 0, "no read was answered: {:?}", worker.lines());
    // The tick of the hammer's last second has had its start by now.
    std::thread::sleep(Duration::from_secs(2));

    let logs = worker.logs();
    let bad: Vec<&serde_json::Value> = logs
        .iter()
        .filter(|e| {
            matches!(
                e["event"].as_str(),
                Some("lease.lost" | "lease.renew_failed" | "tick.missed" | "tick.skipped")
            ) || (e["event"] == "tick.retrying" && e["reason"] == "no_quorum")
                || (e["event"] == "run.finished" && e["outcome"] == "lease_lost")
        })
        .filter(|e| e["job"] != "long" || e["event"] != "tick.skipped" || e["reason"] != "overlap")
        .collect();
    assert!(
        bad.is_empty(),
        "reads delayed the lock path on {}: {bad:#?}",
        cluster.backend().name()
    );
    // Every second of the hammer had its tick of `every` started, within a second of the tick.
    let started: Vec<(DateTime<Utc>, DateTime<Utc>)> = logs
        .iter()
        .filter(|e| e["event"] == "run.started" && e["job"] == "every")
        .filter_map(|e| {
            let tick = DateTime::parse_from_rfc3339(e["tick"].as_str()?).ok()?;
            let at = DateTime::parse_from_rfc3339(e["timestamp"].as_str()?).ok()?;
            Some((tick.to_utc(), at.to_utc()))
        })
        .collect();
    let first = began.timestamp() + 1;
    let last = ended.timestamp() - 1;
    let missing: Vec<i64> = (first..=last)
        .filter(|second| !started.iter().any(|(tick, _)| tick.timestamp() == *second))
        .collect();
    assert!(
        missing.is_empty(),
        "ticks of `every` without a run during the reads on {}: {missing:?}",
        cluster.backend().name()
    );
    let late: Vec<_> = started
        .iter()
        .filter(|(tick, _)| (first..=last).contains(&tick.timestamp()))
        .filter(|(tick, at)| *at - *tick > chrono::Duration::seconds(1))
        .collect();
    assert!(
        late.is_empty(),
        "ticks of `every` started late during the reads on {}: {late:?}",
        cluster.backend().name()
    );
}
