//! What the etcd cluster granted: every write of every job's claim record, read back from etcd's own
//! history — the etcd run's counterpart of the Redis nodes' append-only files ([`super::claims`]).
//!
//! etcd keeps every revision of every key until it is compacted, and the test cluster never compacts,
//! so a watch from revision 1 replays each put of `redcron:{<job>}:claim` (`<tick ms> <lease value>`,
//! as on Redis) in commit order. A put is a committed Raft entry: the cluster granted that tick to that
//! claimant, whether or not its worker lived to log `tick.won`. Each is recorded as confirmed on every
//! member (a committed entry is on a majority at once and on every member once it catches up), so the
//! checker's rules read it as a grant: two claimants with a record of one tick would be a double grant,
//! and a tick granted to a worker killed before it logged `tick.won` is explained as on Redis. Lease
//! keys carry no expiry that etcd would show (it keeps lease deadlines on the leader), so none are read.

use std::time::Duration;

use etcd_client::{Client, EventType, WatchOptions};

use super::claims::ClaimWrite;

/// How long reading the history may take (a run writes a few thousand records).
const READ_LIMIT: Duration = Duration::from_secs(30);
/// A watch that says nothing for this long has replayed everything (the last revision may be outside
/// the prefix).
const QUIET: Duration = Duration::from_secs(2);

/// Every claim record put in the cluster at `endpoints` since it started, as written on each of its
/// `members`; panics if the cluster cannot be read (the run's evidence would be missing).
pub fn read_history(endpoints: &[String], members: usize) -> Vec<ClaimWrite> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("cannot start a Tokio runtime");
    let records = runtime
        .block_on(async {
            tokio::time::timeout(READ_LIMIT, records(endpoints))
                .await
                .unwrap_or_else(|_| Err(format!("not read within {READ_LIMIT:?}")))
        })
        .unwrap_or_else(|e| panic!("cannot read the etcd cluster's claim history: {e}"));
    records
        .iter()
        .flat_map(|(key, value)| {
            (0..members).filter_map(move |member| super::claims::parse_set(member, key, value))
        })
        .collect()
}

/// `(key, value)` of every put under the workers' prefix up to the current revision, in commit order.
async fn records(endpoints: &[String]) -> Result<Vec<(String, String)>, String> {
    let mut client = Client::connect(endpoints, None)
        .await
        .map_err(|e| e.to_string())?;
    let now = client
        .get("redcron:", None)
        .await
        .map_err(|e| e.to_string())?
        .header()
        .map_or(0, |h| h.revision());
    let options = WatchOptions::new().with_prefix().with_start_revision(1);
    let mut stream = client
        .watch("redcron:", Some(options))
        .await
        .map_err(|e| e.to_string())?;
    let mut found = Vec::new();
    let mut seen = 0;
    while seen < now {
        // The first answer (the watch created) has no events; a quiet stream means nothing is left.
        let next = tokio::time::timeout(QUIET, stream.message()).await;
        let Ok(Some(answer)) = next.unwrap_or(Ok(None)).map_err(|e| e.to_string()) else {
            break;
        };
        for event in answer.events() {
            let Some(kv) = event.kv() else { continue };
            seen = seen.max(kv.mod_revision());
            if event.event_type() == EventType::Put && kv.mod_revision() <= now {
                let key = kv.key_str().map_err(|e| e.to_string())?;
                let value = kv.value_str().map_err(|e| e.to_string())?;
                found.push((key.to_string(), value.to_string()));
            }
        }
    }
    Ok(found)
}
