//! The etcd store: claims, leases, fencing tokens, run history and membership in an etcd cluster.
//!
//! etcd replicates every write through Raft and orders all of them by one revision, so the store needs no
//! majority logic of its own and no clock: a claim of `(job, T)` is a compare-and-swap that writes the
//! job's claim record (`<T> <lease value>`, the names of [`crate::lock::keys`]), its lease key (bound
//! to an etcd lease with the lock's TTL) and its fence only if all are unchanged since they were read and
//! the record said that no other claimant confirmed `T` or a later tick (`claim.rs`); the claims of a
//! batch are read together and written several to a transaction, never two of one job (`batch.rs`). The
//! fencing token is `max(fence + 1, T_ms × 1000)`, the other stores' rule, written into the fence by that
//! write: strictly increasing in grant order across all workers for each job, and above every earlier
//! tick's tokens even after the cluster was restored from a snapshot. Renewals are etcd keep-alives, a release revokes the etcd lease (which deletes
//! only the keys bound to it: this attempt's), and a lease is lost only as etcd decides (`lease.rs`).
//! Each series instance (the schedule, a trigger, a retry attempt) has its own claim record under the
//! job's lease key (`snapshot.rs`); a pause is the job's `…:paused` key, which every claim reads and
//! compares (`pause.rs`); a trigger request is a key its claim is anchored on (`triggers.rs`). What must
//! not be kept for good — one-off claim records, trigger requests, pauses with an end — is bound to an
//! etcd lease, so etcd drops it without any clock being read. History and membership are keys under the
//! same prefix (`history.rs`). The argument, its assumptions and limits are in `docs/protocol.md`, *The
//! etcd store*.
//!
//! The client is the `etcd-client` crate: the maintained Rust client of etcd's v3 gRPC API (on tonic),
//! with TLS (rustls) and user/password auth with token refresh; one client per member, and the failover
//! between them is the store's own (`cluster.rs`): the crate's channel balanced over all endpoints kept
//! choosing a hung member.
//! Its build script compiles etcd's `.proto` files with protoc; the `protoc-bin-vendored` crate brings
//! one, so a build needs no protoc package (`.cargo/config.toml`).

mod batch;
mod claim;
mod cluster;
mod history;
mod lease;
mod pause;
mod pause_guard;
mod snapshot;
mod triggers;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, DeleteOptions, DeleteResponse, GetOptions, GetResponse,
    Identity, PutOptions, PutResponse, TlsOptions, Txn, TxnResponse,
};

pub use self::pause_guard::{Guarded, PauseGuard};

use self::cluster::Cluster;
use super::{Health, StoreError};
use crate::clock::cluster::Readings;
use crate::config::EtcdConfig;
use crate::history::HistorySettings;
use crate::lock::quorum::quorum;
use crate::lock::{LockSettings, QuorumFailure};

/// Claims, leases, tokens, history and membership in one etcd cluster.
pub struct EtcdStore {
    settings: LockSettings,
    history: HistorySettings,
    endpoints: Vec<String>,
    /// One client per member, each connected on first use (a worker starts while etcd is down), and
    /// the failover between them.
    cluster: Arc<Cluster>,
    /// The same members on clients (HTTP/2 connections) of their own for history reads, which may
    /// answer megabytes: a claim or a renewal never waits behind a read's frames on a connection.
    readers: Cluster,
    /// How many history reads may be under way at once ([`HISTORY_READS`]); more wait their turn
    /// (within the read's own budget), so a busy dashboard waits for itself, not for the cluster.
    reads: tokio::sync::Semaphore,
    /// The etcd lease of each granted lease and its write's revision, by lease value (unique per attempt),
    /// for renew, release and its watch.
    leases: Mutex<HashMap<String, Held>>,
    /// The etcd lease that keeps each announced member alive, by worker id.
    members: Mutex<HashMap<String, i64>>,
    /// Lease values this process released whose revoke etcd has not applied yet (during an election):
    /// their runs have ended, so this process may take the job's lease key over from them.
    released: Arc<Mutex<HashSet<String>>>,
}

/// How many history reads one store runs at once (as on Redis and ZooKeeper).
const HISTORY_READS: usize = 2;

/// A granted lease as the store keeps it: its etcd lease, and the revision of the claim's write (the
/// watch of its lease key starts after it).
#[derive(Debug, Clone, Copy)]
struct Held {
    id: i64,
    revision: i64,
}

impl EtcdStore {
    /// Prepares the store for the cluster `config` names; it connects on first use.
    ///
    /// Fails, naming the file, if a TLS file cannot be read.
    pub fn new(
        config: &EtcdConfig,
        settings: LockSettings,
        history: HistorySettings,
    ) -> Result<EtcdStore, StoreError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let keepalive = settings.node_timeout.max(Duration::from_secs(1));
        let mut options = ConnectOptions::new()
            .with_require_leader(true)
            .with_connect_timeout(keepalive)
            .with_keep_alive(keepalive, keepalive)
            .with_keep_alive_while_idle(true)
            .with_auto_token_refresh(true);
        if let Some((user, password)) = &config.user {
            options = options.with_user(user.clone(), password.clone());
        }
        if config.endpoints.iter().any(|e| e.starts_with("https://")) {
            options = options.with_tls(tls(config)?);
        }
        let cluster = Cluster::new(&config.endpoints, options.clone(), settings.node_timeout);
        let readers = Cluster::new(&config.endpoints, options, settings.node_timeout);
        Ok(EtcdStore {
            settings,
            history,
            endpoints: config.endpoints.clone(),
            cluster: Arc::new(cluster),
            readers,
            reads: tokio::sync::Semaphore::new(HISTORY_READS),
            leases: Mutex::new(HashMap::new()),
            members: Mutex::new(HashMap::new()),
            released: Arc::new(Mutex::new(HashSet::new())),
        })
    }

    /// Runs one request on a member that serves, failing over from one that does not, bounded by
    /// `limit` as the cluster's pace stretches it (`cluster.rs`); an error says what went wrong on each
    /// member.
    async fn call<T, F, Fut>(&self, limit: Duration, request: F) -> Result<T, String>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
        T: Send + 'static,
    {
        self.cluster.call(limit, request).await
    }

    /// One transaction, run as [`Self::call`] runs a request.
    async fn txn(&self, limit: Duration, txn: Txn) -> Result<TxnResponse, String> {
        self.call(limit, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// One get of `key`, run as [`Self::call`] runs a request.
    async fn get(
        &self,
        limit: Duration,
        key: String,
        options: GetOptions,
    ) -> Result<GetResponse, String> {
        self.call(limit, |mut c| {
            let (key, options) = (key.clone(), options.clone());
            async move { c.get(key, Some(options)).await }
        })
        .await
    }

    /// One put of `value` at `key`, run as [`Self::call`] runs a request.
    async fn put(
        &self,
        limit: Duration,
        key: String,
        value: String,
        options: Option<PutOptions>,
    ) -> Result<PutResponse, String> {
        self.call(limit, |mut c| {
            let (key, value, options) = (key.clone(), value.clone(), options.clone());
            async move { c.put(key, value, options).await }
        })
        .await
    }

    /// One delete of `key` (a range with `options`), run as [`Self::call`] runs a request.
    async fn delete(
        &self,
        limit: Duration,
        key: String,
        options: Option<DeleteOptions>,
    ) -> Result<DeleteResponse, String> {
        self.call(limit, |mut c| {
            let (key, options) = (key.clone(), options.clone());
            async move { c.delete(key, options).await }
        })
        .await
    }

    /// `why` as the failure of the cluster: etcd answers for its majority, so one failure stands for all.
    fn failure(&self, why: String) -> QuorumFailure {
        QuorumFailure {
            unheard: Vec::new(),
            refused: Vec::new(),
            configured: self.endpoints.len(),
            needed: quorum(self.endpoints.len()),
            granted: 0,
            failures: vec![(format!("etcd {}", self.endpoints.join(",")), why)],
        }
    }

    /// The etcd lease TTL for a lock or heartbeat of `ttl`: whole seconds, rounded up (etcd may raise it
    /// to its own minimum, which only lengthens it).
    fn lease_seconds(ttl: Duration) -> i64 {
        i64::try_from(ttl.as_millis().div_ceil(1000))
            .unwrap_or(i64::MAX)
            .max(1)
    }

    /// One keep-alive of etcd lease `id`, bounded by `limit`: `Ok(true)` if etcd restarted its TTL,
    /// `Ok(false)` if the lease is gone (expired or revoked: etcd answered TTL 0).
    async fn keep_alive(&self, id: i64, limit: Duration) -> Result<bool, String> {
        self.call(limit, |mut client| async move {
            // Each renewal is a stream of its own, so a hung member holds up only the attempt on it.
            // The client reads the first answer itself, and fails with this error on TTL 0.
            match client.lease_keep_alive(id).await {
                Ok(_) => Ok(true),
                Err(etcd_client::Error::LeaseKeepAliveError(why)) if why == "lease not found" => {
                    Ok(false)
                }
                Err(other) => Err(other),
            }
        })
        .await
    }

    /// Revokes etcd lease `id` in the background, retried until etcd answers, bounded by the TTL (after
    /// which it is gone anyway).
    fn revoke_later(&self, id: i64) {
        let (cluster, settings) = (Arc::clone(&self.cluster), &self.settings);
        tokio::spawn(lease::revoke(
            cluster,
            id,
            settings.node_timeout,
            settings.ttl,
        ));
    }
}

impl Health for EtcdStore {
    /// `etcd:<endpoints>`, separated by commas.
    fn describe(&self) -> String {
        format!("etcd:{}", self.endpoints.join(","))
    }

    fn nodes(&self) -> Vec<String> {
        self.endpoints.clone()
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

    /// None: etcd has no clock to read; workers keep their own.
    async fn read_clocks(&self) -> Option<Readings> {
        None
    }

    /// A linearizable read of one key under the prefix, bounded by `node_timeout`: etcd serves it only
    /// through a leader that a majority of members still follows, as it commits a claim.
    async fn readiness(&self) -> Result<Option<Readings>, String> {
        let key = format!("{}:ready", self.settings.key_prefix);
        let options = GetOptions::new().with_keys_only().with_limit(1);
        self.get(self.settings.node_timeout, key, options)
            .await
            .map(|_| None)
            .map_err(|why| format!("no majority of the etcd members answers: {why}"))
    }

    /// Nothing to prepare: ready at once.
    async fn prepare(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// An etcd client error in one line (gRPC statuses by their message, as etcd words them).
fn describe(error: etcd_client::Error) -> String {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            format!("{:?}: {}", status.code(), status.message())
        }
        other => other.to_string(),
    }
}

/// The TLS options of `config`: its CA (else the Mozilla roots) and its client certificate, if any.
fn tls(config: &EtcdConfig) -> Result<TlsOptions, StoreError> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).map_err(|e| StoreError::Etcd {
            reason: format!("cannot read {}: {e}", path.display()),
        })
    };
    let mut tls = TlsOptions::new();
    tls = match &config.trusted_ca_file {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(read(ca)?)),
        None => tls.with_webpki_roots(),
    };
    if let Some((cert, key)) = &config.client_identity {
        tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(tls)
}

/// A tick as a key part that sorts as the tick does: 20 digits of the tick shifted to be non-negative.
fn sortable(tick: i64) -> String {
    format!("{:020}", (i128::from(tick) - i128::from(i64::MIN)) as u64)
}

#[cfg(test)]
mod tests {
    use super::{sortable, EtcdStore};
    use std::time::Duration;

    #[test]
    fn ticks_sort_as_key_parts() {
        let ticks = [i64::MIN, -5, 0, 1, 999, 1_000, 1_800_000_000_000, i64::MAX];
        let keys: Vec<String> = ticks.iter().map(|t| sortable(*t)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
        assert!(keys.iter().all(|k| k.len() == 20));
    }

    #[test]
    fn lease_ttls_round_up_to_whole_seconds() {
        assert_eq!(EtcdStore::lease_seconds(Duration::from_millis(300)), 1);
        assert_eq!(EtcdStore::lease_seconds(Duration::from_millis(2_000)), 2);
        assert_eq!(EtcdStore::lease_seconds(Duration::from_millis(2_001)), 3);
        assert_eq!(EtcdStore::lease_seconds(Duration::ZERO), 1);
    }
}
