//! Trigger requests (`redcron trigger`): written to the store, read back by every worker's poller, and
//! forgotten once handled.

use std::time::{Duration, Instant};

use chrono::Utc;
use redcron::lock::LockSettings;
use redcron::trigger::TriggerRequest;

use super::warm;
use crate::support::Backend;

/// Two requests written are read back as written, oldest first, from a second store as well (another
/// process); one forgotten is gone for every reader (in the background: within seconds), the other stays.
pub(super) async fn trigger_requests_are_written_read_and_forgotten(backend: Backend) {
    let cluster = backend.start_shared();
    let store = cluster.store(LockSettings::default());
    let reader = cluster.store(LockSettings::default());
    warm(&store).await;
    let now = Utc::now();
    let first = TriggerRequest::new("adhoc", now, Duration::from_secs(30), "ops@test");
    let second = TriggerRequest::new(
        "other",
        now + chrono::Duration::milliseconds(5),
        Duration::from_secs(30),
        "ops@test",
    );
    for request in [&first, &second] {
        store.request_trigger(request).await.expect("requested");
    }
    let read = reader.triggers().await.expect("read");
    assert_eq!(read.value, [first.clone(), second.clone()]);
    assert!(
        read.missing.is_empty() && read.skipped.is_empty(),
        "{read:?}"
    );

    store.forget_trigger(&first.id);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = reader.triggers().await.expect("read").value;
        if left == [second.clone()] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the request is still there: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
