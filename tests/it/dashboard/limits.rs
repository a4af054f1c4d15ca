//! What one worker's dashboard serves at once (issue 46.2, the dashboard's side): a few reads of the
//! store at a time, each answer within a byte budget, and the others told to come back.

use super::*;
use redcron::history::{Entry, HistorySettings, Kind};
use redcron::lock::LockSettings;
use redcron::schedule::Tick;
use redcron::store::embedded::EmbeddedStore;
use redcron::store::Store;

/// Failed runs seeded (the store keeps a job's newest 200 ticks), each with 48 KiB of standard output
/// kept.
const RUNS: usize = 200;
const TAIL: usize = 48 * 1024;
/// Concurrent `GET /api/history?job=big&limit=5000`.
const READERS: usize = 16;

/// Seeds `RUNS` failed runs of job `big`, a minute apart, into the embedded store at `path`.
fn seed(path: &std::path::Path) {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let store = Store::Embedded(
            EmbeddedStore::open(path, LockSettings::default(), HistorySettings::default())
                .expect("the store opens"),
        );
        let now = chrono::Utc::now();
        let first = (now.timestamp_millis() / 60_000 - RUNS as i64 - 1) * 60_000;
        let entries: Vec<Entry> = (0..RUNS)
            .map(|i| {
                let tick = Tick(first + i as i64 * 60_000);
                let at = tick.to_utc();
                let mut entry = Entry::new("big", tick, "w0", Kind::Run, at);
                entry.token = Some(i as u64 + 1);
                entry.started_at = Some(at);
                entry.ended_at = Some(at + chrono::Duration::seconds(1));
                entry.outcome = Some("failure".to_string());
                entry.exit_code = Some(1);
                entry.duration_ms = Some(1000);
                entry.tail_out = Some("o".repeat(TAIL));
                entry
            })
            .collect();
        for batch in entries.chunks(50) {
            store.record(batch).await.expect("recorded");
        }
    });
}

/// The most memory the worker `pid` has held (VmHWM), in MiB.
fn peak_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb / 1024)
        .expect("VmHWM")
}

/// 16 clients at once ask for `/api/history?job=big&limit=5000` of a job with 200 failed runs that each
/// kept 48 KiB of output (about 20 MB of JSON each): every answer is 200 within the 16 MiB budget with
/// `cut_short` saying how many ticks it lists, or 503 with `Retry-After`; the worker's peak memory
/// stays under 400 MiB (before: every request read and serialized it all at once); `/healthz`
/// answers throughout.
#[test]
fn heavy_history_reads_take_turns_within_a_byte_budget() {
    let dir = TestDir::new();
    let db = dir.join("redcron.db");
    seed(&db);
    let store = format!("embedded:\n  path: {}\n", db.display());
    let jobs = "  - name: big\n    schedule: \"0 0 1 1 *\"\n    command: [\"false\"]\n    output_tail: 65536\n";
    let (worker, port) = listening_worker(&dir, "jobs", |port| {
        yaml(&store, "w1", &format!("127.0.0.1:{port}"), "", jobs)
    });
    let pid = worker.pid();
    let before = peak_mib(pid);

    let readers: Vec<_> = (0..READERS)
        .map(|_| {
            std::thread::spawn(move || {
                // A debug build on a loaded machine takes seconds per answer: a minute each.
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .proxy(None)
                    .timeout_global(Some(Duration::from_secs(120)))
                    .build()
                    .into();
                let started = Instant::now();
                let url = format!("http://127.0.0.1:{port}/api/history?job=big&limit=5000");
                let response = agent.get(url).call().expect("an answer");
                answer(response, started)
            })
        })
        .collect();
    let mut probes = Vec::new();
    while !readers.iter().all(|r| r.is_finished()) {
        let started = Instant::now();
        let status = get(port, "/healthz").map(|(status, ..)| status).ok();
        probes.push((status, started.elapsed()));
        std::thread::sleep(Duration::from_millis(200));
    }
    let answers: Vec<Answer> = readers
        .into_iter()
        .map(|r| r.join().expect("a reader"))
        .collect();
    let peak = peak_mib(pid);

    let served: Vec<&Answer> = answers.iter().filter(|a| a.status == 200).collect();
    let busy = answers.iter().filter(|a| a.status == 503).count();
    eprintln!(
        "{} served, {busy} busy, peak {peak} MiB (from {before}), largest answer {} bytes",
        served.len(),
        served.iter().map(|a| a.body.len()).max().unwrap_or(0)
    );
    assert_eq!(served.len() + busy, READERS, "only 200 or 503");
    assert!(!served.is_empty(), "some are served");
    for answer in &answers {
        if answer.status == 503 {
            assert!(!answer.header("retry-after").is_empty(), "{}", answer.body);
        }
    }
    for answer in &served {
        assert!(
            answer.body.len() <= 17 * 1024 * 1024,
            "{} bytes",
            answer.body.len()
        );
        let history = answer.json();
        let listed = history["ticks"].as_array().map_or(0, Vec::len);
        assert!((1..RUNS).contains(&listed), "{listed} ticks listed");
        let cut = history["cut_short"].as_str().unwrap_or_default();
        assert!(
            cut.contains(&format!("the newest {listed} of {RUNS} ticks")),
            "{cut:?}"
        );
    }
    assert!(peak < 400, "the worker peaked at {peak} MiB");
    assert!(
        probes
            .iter()
            .all(|(status, took)| *status == Some(200) && *took < Duration::from_secs(2)),
        "{probes:?}"
    );
}
