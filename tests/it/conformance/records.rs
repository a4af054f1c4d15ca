//! Records: the run history (entries merged, kept within the job's bound, read newest first within a
//! limit and a window) and membership (workers alive while they announce, dead once they stopped or their
//! heartbeat expired, listed either way).

use std::time::{Duration, Instant};

use redcron::history::{Entry, HistorySettings, Kind, Query};
use redcron::lock::LockSettings;
use redcron::membership::Member;
use redcron::schedule::Tick;

use crate::support::Backend;

/// Entries of 5 ticks by two workers, with `keep_ticks: 3`, read back as the newest 3 ticks, newest first,
/// within the limit and the window asked for; a later version of an entry replaces the earlier one.
pub(super) async fn the_store_keeps_the_newest_ticks_newest_first(backend: Backend) {
    let cluster = backend.start();
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
    store.record(&entries).await.expect("recorded");
    let mut ended = Entry::new("kept", Tick(5_000), "w1", Kind::Lost, now);
    ended.reason = Some("already_claimed".to_string());
    ended.recorded_at = now + chrono::Duration::seconds(1);
    store.record(&[ended]).await.expect("recorded");
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

/// A member announced is alive and stamped by the store; once it announced that it stopped it is listed
/// but dead at once; one that stops announcing is listed but dead once its heartbeat expired.
pub(super) async fn members_are_alive_until_they_stop_or_expire(backend: Backend) {
    let cluster = backend.start();
    let store = cluster.store(LockSettings::default());
    let now = chrono::Utc::now();
    let member = |id: &str, heartbeat_ms: u64| -> Member {
        serde_json::from_value(serde_json::json!({
            "id": id, "started_at": now, "heartbeat_ms": heartbeat_ms
        }))
        .expect("a member")
    };
    let (stopping, dying) = (member("stopping", 60_000), member("dying", 300));
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
