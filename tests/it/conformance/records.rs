//! Records: the run history (entries merged, kept within the job's bound, read newest first within a
//! limit and a window) and membership (workers alive while they announce, dead once they stopped or their
//! heartbeat expired, listed either way).

use std::time::{Duration, Instant};

use redcron::history::{
    Control, Entry, HistorySettings, Kind, Query, CONTROL_PAUSED, CONTROL_RESUMED,
};
use redcron::lock::LockSettings;
use redcron::membership::{Member, Sharer};
use redcron::schedule::Tick;

use crate::support::Backend;

/// Writes `entries`, again while the store answers that no majority took them (a loaded machine: a write
/// is a quorum commit on etcd and ZooKeeper, bounded by the store's exchange timeout) — as the worker's
/// history writer retries; a rewrite of an entry replaces it (its id is its key). Panics after 20 s.
async fn recorded(store: &redcron::store::Store, entries: &[Entry]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match store.record(entries).await {
            Ok(()) => return,
            Err(failure) if Instant::now() < deadline => {
                println!("record failed, again: {failure:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(failure) => panic!("not recorded within 20 s: {failure:?}"),
        }
    }
}

/// Entries of 5 ticks by two workers, with `keep_ticks: 3`, read back as the newest 3 ticks, newest first,
/// within the limit and the window asked for; a later version of an entry replaces the earlier one.
pub(super) async fn the_store_keeps_the_newest_ticks_newest_first(backend: Backend) {
    let cluster = backend.start_shared();
    let history = HistorySettings {
        keep_ticks: 3,
        ..HistorySettings::default()
    };
    let store = cluster.store_keeping(LockSettings::default(), history);
    let now = chrono::Utc::now();
    let mut entries = Vec::new();
    for tick in 1..=5 {
        for worker in ["w1", "w2"] {
            entries.push(Entry::new(
                "kept",
                Tick(tick * 1_000),
                worker,
                Kind::Lost,
                now,
            ));
        }
    }
    recorded(&store, &entries).await;
    let mut ended = Entry::new("kept", Tick(5_000), "w1", Kind::Lost, now);
    ended.reason = Some("already_claimed".to_string());
    ended.recorded_at = now + chrono::Duration::seconds(1);
    recorded(&store, &[ended]).await;
    let query = |limit| Query {
        job: "kept".to_string(),
        since: None,
        until: None,
        limit,
    };
    let read = store.history(&query(100)).await.expect("read").value;
    let ticks: Vec<i64> = read.iter().map(|e| e.tick).collect();
    assert_eq!(
        ticks,
        [5_000, 5_000, 4_000, 4_000, 3_000, 3_000],
        "{read:#?}"
    );
    let newest = read.iter().find(|e| e.worker == "w1").expect("w1's entry");
    assert_eq!(newest.reason.as_deref(), Some("already_claimed"));
    let three = store.history(&query(3)).await.expect("read").value;
    let ticks: Vec<i64> = three.iter().map(|e| e.tick).collect();
    assert_eq!(ticks, [5_000, 5_000, 4_000], "{three:#?}");
    let mut window = query(100);
    (window.since, window.until) = (Some(Tick(4_000)), Some(Tick(4_000)));
    assert_eq!(store.history(&window).await.expect("read").value.len(), 2);
}

/// The entries of `job` read back (limit 5,000).
async fn read_all(store: &redcron::store::Store, job: &str) -> Vec<Entry> {
    let query = Query {
        job: job.to_string(),
        since: None,
        until: None,
        limit: 5_000,
    };
    store.history(&query).await.expect("read").value
}

/// A skip is one per tick: a second worker's skip of a tick replaces the first, while the tick's run, a
/// loser's entry and the skip of another series stay beside it.
pub(super) async fn a_second_skip_of_a_tick_replaces_the_first(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(LockSettings::default());
    let now = chrono::Utc::now();
    let skip = |worker: &str, reason: &str, at: chrono::DateTime<chrono::Utc>| {
        let mut entry = Entry::new("once", Tick(1_000), worker, Kind::Skipped, at);
        entry.reason = Some(reason.to_string());
        entry
    };
    let run = Entry::new("once", Tick(1_000), "w1", Kind::Run, now);
    let lost = Entry::new("once", Tick(1_000), "w3", Kind::Lost, now);
    let retry = skip("w1", "shutdown", now).in_series(&redcron::lock::Series::Retry(1));
    let first = skip("w1", "paused", now);
    recorded(&store, &[run, lost, retry, first]).await;
    let second = skip("w2", "paused", now + chrono::Duration::seconds(1));
    recorded(&store, &[second]).await;
    let read = read_all(&store, "once").await;
    let mut kept: Vec<(String, String, Option<u32>)> = read
        .iter()
        .map(|e| (e.kind.as_str().to_string(), e.worker.clone(), e.attempt))
        .collect();
    kept.sort();
    let expected = [
        ("lost", "w3", None),
        ("run", "w1", None),
        ("skipped", "w1", Some(1)),
        ("skipped", "w2", None),
    ]
    .map(|(kind, worker, attempt)| (kind.to_string(), worker.to_string(), attempt));
    assert_eq!(kept, expected, "{read:#?}");
}

/// The bound holds with its slack: with `keep_ticks: 8` (checked at every tick) a job never holds more
/// than 10 ticks and never fewer than the 8 newest; with the default 200 (checked at one tick in 4) a job
/// written 1,500 ticks, 25 at a time, holds more than 200 but never more than 250 plus the ticks written
/// since the last check (here fewer than 30), nor fewer than 200 once it had them — on every node, once
/// a write reached it.
pub(super) async fn the_bound_holds_with_its_slack(backend: Backend) {
    let cluster = backend.start_shared();
    for (keep, ticks, per_write) in [(8_usize, 40_i64, 1_usize), (200, 1_500, 25)] {
        let history = HistorySettings {
            keep_ticks: keep,
            ..HistorySettings::default()
        };
        // Past `most`, a job is cut at the next tick that checks (every tick for the small bound).
        let most = history.most_ticks() + if keep < 100 { 0 } else { 30 };
        let store = cluster.store_keeping(LockSettings::default(), history);
        let job = format!("bound{keep}");
        let now = chrono::Utc::now();
        let entries: Vec<Entry> = (1..=ticks)
            .map(|n| {
                Entry::new(
                    &job,
                    Tick(1_795_000_000_000 + n * 60_000),
                    "w1",
                    Kind::Run,
                    now,
                )
            })
            .collect();
        let mut largest = 0;
        for (written, batch) in entries.chunks(per_write).enumerate() {
            recorded(&store, batch).await;
            // A write returns once a majority took it (Redis): a read at once may also see a node that
            // has not cut the job yet, beside one that has. Every node's copy is within the bound once
            // the write reached it.
            let settled = Instant::now() + Duration::from_secs(5);
            let read = loop {
                let read = read_all(&store, &job).await;
                if read.len() <= most || Instant::now() > settled {
                    break read;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let held = read.len();
            let written = (written + 1) * per_write;
            assert!(held <= most, "{keep}: {held} ticks held, more than {most}");
            assert!(
                held >= written.min(keep),
                "{keep}: {held} ticks held of {written}"
            );
            let newest = read.first().map(|e| e.tick);
            assert_eq!(
                newest,
                batch.last().map(|e| e.tick),
                "{keep}: the newest tick stays"
            );
            largest = largest.max(held);
        }
        println!("keep_ticks {keep}: at most {largest} ticks held");
        assert!(largest > keep, "{keep}: the slack is used ({largest})");
    }
}

/// Entries in the format of earlier versions are read: a loser's `lost` entry, with the id every version
/// gave it and none of the newer fields, beside a new run entry that names who raced.
pub(super) async fn old_format_entries_are_still_read(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(LockSettings::default());
    let old = r#"{"job":"mixed","tick":2000,"worker":"old-1","kind":"lost","reason":"already_claimed",
        "by":"new-1","fingerprint":"0429ee8171572cf5","recorded_at":"2026-11-23T12:25:05.019Z"}"#;
    let old = Entry::from_json(old).expect("an entry of an earlier version");
    assert_eq!(old.id(), "2000|old-1|lost");
    let mut run = Entry::new("mixed", Tick(2_000), "new-1", Kind::Run, chrono::Utc::now());
    run.raced = Some(vec!["new-1".to_string(), "old-1".to_string()]);
    recorded(&store, &[old.clone(), run.clone()]).await;
    let read = read_all(&store, "mixed").await;
    assert_eq!(read.len(), 2, "{read:#?}");
    assert!(read.contains(&old), "{read:#?}");
    assert!(read.contains(&run), "{read:#?}");
}

/// Two `control` entries (a pause and a resume) of one millisecond by one writer are both kept, beside a
/// run of that very millisecond, and read back as written, whatever the store.
pub(super) async fn two_controls_of_one_millisecond_are_both_kept(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(LockSettings::default());
    let made = chrono::DateTime::from_timestamp_millis(1_795_436_705_012).expect("an instant");
    let control = |action: &'static str| {
        let what = Control {
            action,
            by: "ops via dashboard from 127.0.0.1".to_string(),
            reason: "migration".to_string(),
            until: Some(made + chrono::Duration::hours(1)),
        };
        Entry::control("controlled", &what, "dashboard", made)
    };
    let (paused, resumed) = (control(CONTROL_PAUSED), control(CONTROL_RESUMED));
    let run = Entry::new(
        "controlled",
        Tick(made.timestamp_millis()),
        "w1",
        Kind::Run,
        made,
    );
    recorded(&store, &[paused.clone(), resumed.clone(), run.clone()]).await;
    let read = read_all(&store, "controlled").await;
    assert_eq!(read.len(), 3, "{read:#?}");
    for entry in [&paused, &resumed, &run] {
        assert!(read.contains(entry), "{entry:?} not in {read:#?}");
    }
}

/// A member announced is alive and stamped by the store; once it announced that it stopped it is listed
/// but dead at once; one that stops announcing is listed but dead once its heartbeat expired.
pub(super) async fn members_are_alive_until_they_stop_or_expire(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(LockSettings::default());
    let now = chrono::Utc::now();
    let member = |id: &str, heartbeat_ms: u64| -> Member {
        serde_json::from_value(serde_json::json!({
            "id": id, "started_at": now, "heartbeat_ms": heartbeat_ms
        }))
        .expect("a member")
    };
    let (mut stopping, dying) = (member("stopping", 60_000), member("dying", 300));
    // Every field is kept, the processes that share the worker's id too (`status` shows them).
    stopping.shared_with = vec![Sharer {
        host: "other-host".to_string(),
        pid: 4321,
        seen_at: now,
    }];
    for member in [&stopping, &dying] {
        store.announce(member).await.expect("announced");
    }
    let alive = |members: &[Member], id: &str| {
        let found = members.iter().find(|m| m.id == id);
        found.map(|m| (m.alive, m.seen_at.is_some()))
    };
    let members = store.members().await.expect("read").value;
    assert_eq!(
        alive(&members, "stopping"),
        Some((true, true)),
        "{members:#?}"
    );
    assert_eq!(alive(&members, "dying"), Some((true, true)), "{members:#?}");
    let kept = members.iter().find(|m| m.id == "stopping");
    assert_eq!(
        kept.map(|m| &m.shared_with),
        Some(&stopping.shared_with),
        "{members:#?}"
    );
    let stopped = Member {
        state: "stopped".to_string(),
        ..stopping
    };
    store.announce(&stopped).await.expect("announced");
    let members = store.members().await.expect("read").value;
    assert_eq!(
        alive(&members, "stopping"),
        Some((false, true)),
        "{members:#?}"
    );

    let deadline = Instant::now() + backend.expiry(dying.ttl()) + Duration::from_secs(10);
    loop {
        let members = store.members().await.expect("read").value;
        match alive(&members, "dying") {
            Some((false, _)) => break,
            Some((true, _)) if Instant::now() < deadline => {}
            other => panic!("{other:?}: the expired member is listed dead: {members:#?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(store.members().await.expect("read").value.len(), 2);
}

/// The largest output tail a job may keep, per stream (`output_tail`'s bound).
const LARGEST_TAIL: usize = 64 * 1024;

/// Entries as large as a job can make them are written and read back whole: three writes of 7 entries
/// with both output tails at the largest `output_tail` (the history writer's most per call, about
/// 0.9 MiB), one of 14 (a store takes any call: etcd's 1.5 MiB bound on a request is the store's to
/// keep), and one entry whose tails are control bytes (each 6 bytes of JSON: the most a tail can grow
/// when stored); then a read of the job's whole history (4.5 MiB and more, past a gRPC client's
/// 4 MiB bound on one answer) returns all 36 entries, each tail intact.
pub(super) async fn entries_at_the_largest_output_tails_are_written_and_read_whole(
    backend: Backend,
) {
    let cluster = backend.start_shared();
    let store = cluster.store(LockSettings::default());
    let now = chrono::Utc::now();
    let large = |tick: i64, fill: char| {
        let mut entry = Entry::new("large", Tick(tick * 1_000), "w1", Kind::Run, now);
        entry.outcome = Some("failure".to_string());
        entry.tail_out = Some(fill.to_string().repeat(LARGEST_TAIL));
        entry.tail_err = Some(fill.to_string().repeat(LARGEST_TAIL));
        entry
    };
    for call in 0..3 {
        let entries: Vec<Entry> = (0..7).map(|i| large(1 + call * 7 + i, 'x')).collect();
        recorded(&store, &entries).await;
    }
    let twice_a_call: Vec<Entry> = (22..=35).map(|tick| large(tick, 'x')).collect();
    recorded(&store, &twice_a_call).await;
    recorded(&store, &[large(100, '\u{1}')]).await;
    let query = Query {
        job: "large".to_string(),
        since: None,
        until: None,
        limit: 5_000,
    };
    let read = store
        .history(&query)
        .await
        .expect("the whole history is read");
    assert!(read.skipped.is_empty(), "{:?}", read.skipped);
    let ticks: Vec<i64> = read.value.iter().map(|e| e.tick / 1_000).collect();
    let mut expected: Vec<i64> = (1..=35).rev().collect();
    expected.insert(0, 100);
    assert_eq!(ticks, expected, "every entry, newest first");
    for entry in &read.value {
        let fill = if entry.tick == 100_000 { '\u{1}' } else { 'x' };
        for tail in [&entry.tail_out, &entry.tail_err] {
            let tail = tail.as_deref().unwrap_or_default();
            assert!(
                tail.len() == LARGEST_TAIL && tail.chars().all(|c| c == fill),
                "tick {}: a tail of {} bytes came back",
                entry.tick,
                tail.len()
            );
        }
    }
}
