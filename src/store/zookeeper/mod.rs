//! The ZooKeeper store: claims, leases, fencing tokens, run history and membership in a ZooKeeper
//! ensemble.
//!
//! ZooKeeper orders every write through its leader (Zab) and gives each one a zxid, so, as on etcd, the
//! store needs no majority logic of its own. Under the chroot `/<key_prefix>`:
//! - `/jobs/<job>` is the job's **fence** node: its data is the job's pause (empty: none), and every
//!   claim, pause and resume of the job rewrites it with the version it read — so all of them are
//!   ordered against each other in one place (`claim.rs`, `pause.rs`);
//! - `/jobs/<job>/c<series key>` is a **claim record** per series instance (the suffixes of
//!   [`crate::lock::keys::claim_keys`]), holding `<tick ms> <lease value>` as on every store;
//! - `/jobs/<job>/l<lease key>` is the **lease**: an *ephemeral* node of the winner's session holding its
//!   lease value — the job is busy for the next tick while it exists (`lease.rs`);
//! - `/triggers/<id>` the trigger requests, `/history/<job>/<tick>-<entry id>` the run history,
//!   `/members/<id>` and the ephemeral `/members-alive/<id>` the membership (`records.rs`).
//!
//! A claim is one multi-op — `setData(fence, version)`, `create`/`setData` of the record, `create` of the
//! ephemeral lease — applied at once or not at all; the **token** is the zxid of that transaction (the
//! fence's new `mzxid`). The **lease is the session**: it lives while the ensemble keeps the session,
//! and the worker's deadline for it is always set by a round trip (sent at `s`) to
//! `s + negotiated session timeout − margin`, before the ensemble could expire the session
//! ([`ZookeeperStore::lease_deadline`]). The argument, its assumptions and limits are in
//! `docs/protocol.md`, *The ZooKeeper store*.
//!
//! One session per store (one per worker process), connected on first use, in the background, and
//! again after it expired: a new session never inherits the old one's leases, whose ephemeral nodes the
//! ensemble deleted with it. With digest auth, the first session makes every node under the chroot its
//! user's before it serves a call (`acl.rs`).

mod acl;
mod claim;
mod decide;
mod lease;
mod pause;
mod records;
mod session;
mod triggers;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::session::Sessions;
use super::{Health, StoreError};
use crate::clock::cluster::Readings;
use crate::config::ZookeeperConfig;
use crate::history::HistorySettings;
use crate::lock::quorum::quorum;
use crate::lock::{validity, LockSettings, QuorumFailure};

/// The most bytes of one node's data the store reads as a value; a larger one is garbage, skipped. It is
/// ZooKeeper's own bound on a node's data (`jute.maxbuffer`'s default, 1 MiB): a history entry with both
/// output tails at the largest `output_tail` is up to about 790 KB of JSON (a control byte is 6).
pub(super) const MAX_DATA: usize = 1024 * 1024;

/// The most children of one node a read goes through; more are left for the next read (with a note).
pub(super) const MAX_CHILDREN: usize = 20_000;

/// The longest a history, membership or trigger request may take: nothing waits on it but the background
/// writer and the CLI (as on etcd).
pub(super) const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);

/// How many history reads one store runs at once.
const HISTORY_READS: usize = 2;

/// Claims, leases, tokens, history and membership in one ZooKeeper ensemble.
pub struct ZookeeperStore {
    settings: LockSettings,
    history: HistorySettings,
    hosts: Vec<String>,
    /// The session, connected in the background on first use and after it expired.
    sessions: Sessions,
    /// How many history reads may be under way at once ([`HISTORY_READS`]); more wait their turn.
    reads: tokio::sync::Semaphore,
    /// Each granted lease not yet released, by lease value (unique per attempt): its session and
    /// deadline, which its reaper (`lease.rs`) reads.
    leases: Arc<Mutex<HashMap<String, lease::Held>>>,
    /// When each member this process announced stops being alive unless announced again, by worker id
    /// (boot clock), which its reaper (`records.rs`) reads.
    heartbeats: Arc<Mutex<HashMap<String, crate::clock::boot::BootInstant>>>,
}

impl ZookeeperStore {
    /// Prepares the store for the ensemble `config` names; it connects on first use.
    ///
    /// Fails, naming the file, if a TLS file cannot be read or parsed.
    pub fn new(
        config: &ZookeeperConfig,
        settings: LockSettings,
        history: HistorySettings,
    ) -> Result<ZookeeperStore, StoreError> {
        let sessions = Sessions::new(config, &settings.key_prefix, settings.node_timeout)?;
        Ok(ZookeeperStore {
            settings,
            history,
            hosts: config.hosts.clone(),
            sessions,
            reads: tokio::sync::Semaphore::new(HISTORY_READS),
            leases: Arc::new(Mutex::new(HashMap::new())),
            heartbeats: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    /// `why` as the failure of the ensemble: ZooKeeper answers for its majority, so one failure stands
    /// for all. Names the hosts, never a password.
    pub(super) fn failure(&self, why: impl Into<String>) -> QuorumFailure {
        QuorumFailure {
            unheard: Vec::new(),
            refused: Vec::new(),
            configured: self.hosts.len(),
            needed: quorum(self.hosts.len()),
            granted: 0,
            failures: vec![(format!("zookeeper {}", self.hosts.join(",")), why.into())],
        }
    }

    /// The deadline of a lease whose session was last proven alive by a round trip sent at `sent`, in a
    /// session of negotiated timeout `timeout`: `sent + timeout − timeout/4 − drift`.
    ///
    /// The ensemble expires a session `timeout` after its leader last heard of it; a request at a member
    /// at or after `sent` reaches the leader's session tracker with the member's next ping, at most
    /// `tickTime/2` later, and the negotiated timeout is at least `2 × tickTime`, so a quarter of it
    /// covers that. `drift` covers the clock rates of this host and the leader. At most `ttl − drift`.
    pub(super) fn lease_deadline(
        &self,
        sent: crate::clock::boot::BootInstant,
        timeout: Duration,
    ) -> crate::clock::boot::BootInstant {
        let drift = validity::drift(timeout, self.settings.drift_factor);
        // Never longer than the lock's TTL either, which the rest of redcron takes as a lease's length.
        let valid = timeout.saturating_sub(timeout / 4).min(self.settings.ttl);
        sent + valid.saturating_sub(drift)
    }
}

impl Health for ZookeeperStore {
    /// `zookeeper:<hosts>`, separated by commas (as etcd's: the dashboard lists the nodes from it).
    fn describe(&self) -> String {
        format!("zookeeper:{}", self.hosts.join(","))
    }

    fn nodes(&self) -> Vec<String> {
        self.hosts.clone()
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn settings(&self) -> &LockSettings {
        &self.settings
    }

    fn history_settings(&self) -> &HistorySettings {
        &self.history
    }

    /// None: ZooKeeper has no clock call; workers keep their own (as on etcd).
    async fn read_clocks(&self) -> Option<Readings> {
        None
    }

    /// A `sync` of the chroot and a read after it, bounded by `node_timeout`: a sync is answered only
    /// through a leader that a majority of members follows, as a claim's commit is.
    async fn readiness(&self) -> Result<Option<Readings>, String> {
        let limit = self.settings.node_timeout;
        let ready = async {
            let session = self.sessions.current(limit).await?;
            session
                .client
                .sync("/jobs")
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(())
        };
        match tokio::time::timeout(limit, ready).await {
            Ok(Ok(())) => Ok(None),
            Ok(Err(why)) => Err(format!(
                "no majority of the ZooKeeper members answers ({}): {why}",
                self.hosts.join(",")
            )),
            Err(_) => Err(format!(
                "no majority of the ZooKeeper members answers ({}): no answer within {}",
                self.hosts.join(","),
                crate::config::show_duration(limit)
            )),
        }
    }

    /// Starts connecting (a worker starts while ZooKeeper is down: that is not an error). With auth it
    /// waits for the first connect, up to the session timeout, and fails if a node of the store cannot
    /// be made this user's (`acl.rs`), naming it.
    async fn prepare(&self) -> Result<(), StoreError> {
        let _connecting = self.sessions.start();
        match self.sessions.unusable().await {
            None => Ok(()),
            Some(why) => Err(StoreError::Zookeeper {
                reason: format!("{}: {why}", self.hosts.join(",")),
            }),
        }
    }
}

/// A job name, series key or id as one znode name: letters, digits, `_`, `-` and `:` as they are, every
/// other byte as `%XX` (so `/`, `.` and `..` never reach a path, and two names never meet).
pub(super) fn node_name(text: &str) -> String {
    let mut name = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b':') {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    name
}

/// A node's data as text, if it is UTF-8 and at most [`MAX_DATA`] bytes; else why not.
pub(super) fn text(data: &[u8]) -> Result<&str, String> {
    if data.len() > MAX_DATA {
        return Err(format!("{} bytes, more than {MAX_DATA}", data.len()));
    }
    std::str::from_utf8(data).map_err(|_| "not UTF-8 text".to_string())
}

/// A tick as a name part that sorts as the tick does: 20 digits of the tick shifted to be non-negative.
pub(super) fn sortable(tick: i64) -> String {
    format!("{:020}", (i128::from(tick) - i128::from(i64::MIN)) as u64)
}

#[cfg(test)]
mod tests {
    use super::{node_name, sortable, text, MAX_DATA};

    #[test]
    fn names_never_make_a_path() {
        assert_eq!(node_name("backup-db_1"), "backup-db_1");
        assert_eq!(node_name("a/b"), "a%2Fb");
        assert_eq!(node_name(".."), "%2E%2E");
        assert_eq!(node_name("50%"), "50%25");
        assert_eq!(node_name(":trigger:x"), ":trigger:x");
        assert_ne!(node_name("a%2Fb"), node_name("a/b"));
    }

    #[test]
    fn ticks_sort_as_name_parts() {
        let ticks = [i64::MIN, -5, 0, 1, 999, 1_000, i64::MAX];
        let names: Vec<String> = ticks.iter().map(|t| sortable(*t)).collect();
        assert!(names.windows(2).all(|w| w[0] < w[1]), "{names:?}");
    }

    #[test]
    fn large_or_binary_data_is_not_text() {
        assert_eq!(text(b"ok"), Ok("ok"));
        assert!(text(&[0xff, 0xfe]).is_err());
        assert!(text(&vec![b'a'; MAX_DATA + 1]).is_err());
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod server_tests;
