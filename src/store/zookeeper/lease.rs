//! Renewals and releases on ZooKeeper: a granted lease is the ephemeral lease node of the session that
//! won it, and lives exactly as long as that session (or until released).
//!
//! A renewal is a round trip that proves the session alive after it was sent: a `sync` (answered only
//! through the leader, after the member caught up with it) and a read of the lease node after it, which
//! must still hold this lease's value and belong to this session. The deadline then moves to
//! `sent + timeout − timeout/4 − drift` ([`ZookeeperStore::lease_deadline`]), before the ensemble could
//! expire the session. A node gone or another session's, or the session expired, is a lost lease; no
//! answer is unconfirmed — the deadline stands, and a session cut off from the ensemble is assumed
//! expired at it. A release deletes the lease node if it is still this lease's, at the version read.
//! The claim record and the fence stay.
//!
//! **A lease also ends at its deadline while its session lives.** The session outlives a lease whose
//! renewals stopped (the process is alive, its client pings): so each granted lease has a *reaper*, a
//! task that deletes its node (if still this lease's) once its deadline has passed without a renewal,
//! as Redis drops a key at its TTL. The worker has stopped the job by then; the next claim finds the job
//! free, and the late holder's renewal fails for good.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use std::time::Duration;
use tokio::sync::Notify;

use zookeeper_client::{EventType, SessionState};

use super::decide::lease_path;
use super::ZookeeperStore;
use crate::clock::boot::BootInstant;
use crate::lock::{Lease, RenewError};
use crate::store::Leases;

/// A granted lease as this store keeps it, for its renewals and its reaper: the session it was won in,
/// its deadline, and whether it was released (its node still to be deleted).
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub session: i64,
    pub deadline: BootInstant,
    pub released: bool,
    /// Wakes the reaper early (a release).
    pub wake: Arc<Notify>,
}

/// What a read of a lease node found.
enum Found {
    /// This lease's value, in this session.
    Yes,
    /// Gone, another value, or another session's.
    No,
}

impl ZookeeperStore {
    /// Remembers a granted lease (its session and deadline), and starts its reaper (see the module):
    /// once the deadline passed without a renewal, or the lease was released and its node is still there
    /// (a release that failed: the member it went to died), the reaper deletes the node through
    /// `client`, again until that is done or the session ended (which deletes it too).
    pub(super) fn remember(&self, lease: &Lease, session: i64, client: zookeeper_client::Client) {
        let wake = Arc::new(Notify::new());
        let held = Held {
            session,
            deadline: lease.deadline(),
            released: false,
            wake: Arc::clone(&wake),
        };
        lock(&self.leases).insert(lease.value.clone(), held);
        let leases = Arc::clone(&self.leases);
        let (value, path) = (lease.value.clone(), Self::path_of(lease));
        tokio::spawn(async move {
            let mut pause = Duration::from_millis(100);
            loop {
                let Some(held) = lock(&leases).get(&value).cloned() else {
                    return; // released, its node deleted
                };
                let left = held.deadline.saturating_duration_since(BootInstant::now());
                if !held.released && !left.is_zero() {
                    tokio::select! {
                        () = tokio::time::sleep(left) => {}
                        () = wake.notified() => {}
                    }
                    continue;
                }
                let ended = !matches!(
                    client.state(),
                    SessionState::Disconnected
                        | SessionState::SyncConnected
                        | SessionState::ConnectedReadOnly
                );
                match delete_if_ours(&client, &path, &value, session).await {
                    Ok(())
                    | Err(
                        zookeeper_client::Error::SessionExpired
                        | zookeeper_client::Error::ClientClosed,
                    ) => {
                        lock(&leases).remove(&value);
                        return;
                    }
                    Err(_) if ended => {
                        lock(&leases).remove(&value);
                        return;
                    }
                    Err(_) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(1));
                    }
                }
            }
        });
    }

    /// The session a lease not released was won in.
    fn session_of(&self, value: &str) -> Option<i64> {
        lock(&self.leases)
            .get(value)
            .filter(|held| !held.released)
            .map(|held| held.session)
    }

    /// Moves a lease's deadline (for its reaper).
    fn extended(&self, value: &str, deadline: BootInstant) {
        if let Some(held) = lock(&self.leases).get_mut(value) {
            held.deadline = deadline;
        }
    }

    fn path_of(lease: &Lease) -> String {
        lease_path(&lease.job, lease.tick, lease.overlap, &lease.series)
    }

    /// A sync, then a read of the lease node, within `limit`, in session `id`'s client.
    async fn prove(&self, lease: &Lease, id: i64, limit: Duration) -> Result<Found, String> {
        let session = self.sessions.current(limit).await?;
        if session.id != id {
            return Ok(Found::No);
        }
        let path = Self::path_of(lease);
        let proof = async {
            session.client.sync(&path).await?;
            session.client.get_data(&path).await
        };
        match tokio::time::timeout(limit, proof).await {
            Err(_) => Err("no answer within node_timeout".to_string()),
            Ok(Err(zookeeper_client::Error::NoNode)) => Ok(Found::No),
            Ok(Err(zookeeper_client::Error::SessionExpired)) => Ok(Found::No),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok((data, stat))) => Ok(
                if data == lease.value.as_bytes() && stat.ephemeral_owner == id {
                    Found::Yes
                } else {
                    Found::No
                },
            ),
        }
    }
}

impl Leases for ZookeeperStore {
    /// Proves the session alive and the lease node its own, before the deadline (see the module); see
    /// [`crate::store::Store::renew`].
    async fn renew(&self, lease: &mut Lease) -> Result<(), RenewError> {
        let start = lease.start_renewal()?;
        let Some(id) = self.session_of(&lease.value) else {
            lease.mark_lost();
            return Err(RenewError::NotHeld(
                self.failure("no session known for this lease"),
            ));
        };
        let budget = lease
            .deadline()
            .saturating_duration_since(start)
            .min(self.settings.node_timeout);
        let answer = self.prove(lease, id, budget).await;
        let timeout = self
            .sessions
            .ready()
            .filter(|s| s.id == id)
            .map(|s| s.timeout);
        let expired = BootInstant::now() >= lease.deadline();
        match (answer, expired, timeout) {
            (Ok(Found::No), _, _) => {
                lease.mark_lost();
                let why =
                    "lease not held: its node is gone or another session's (the session expired?)";
                Err(RenewError::NotHeld(self.failure(why)))
            }
            (_, true, _) => {
                lease.mark_lost();
                Err(RenewError::Expired)
            }
            (Ok(Found::Yes), false, Some(timeout)) => {
                let deadline = self.lease_deadline(start, timeout);
                if deadline > lease.deadline() {
                    lease.extend_to(deadline);
                    self.extended(&lease.value, deadline);
                }
                Ok(())
            }
            (Ok(Found::Yes), false, None) => {
                lease.mark_lost();
                Err(RenewError::NotHeld(
                    self.failure("the lease's session ended"),
                ))
            }
            (Err(why), false, _) => Err(RenewError::Unconfirmed(self.failure(why))),
        }
    }

    /// Resolves once the lease's session ended (expired, closed) or its lease node is deleted or changed
    /// (a data watch), or at once if this store does not know the lease (released).
    fn lease_gone<'a>(&'a self, lease: &Lease) -> impl Future<Output = ()> + Send + use<'a> {
        let id = self.session_of(&lease.value);
        let path = Self::path_of(lease);
        let value = lease.value.clone();
        async move {
            let Some(id) = id else { return };
            loop {
                let Some(session) = self.sessions.ready() else {
                    // No usable session: the lease's session is gone unless it reconnects.
                    match self.sessions.current(self.settings.node_timeout).await {
                        Ok(session) if session.id == id => continue,
                        Ok(_) => return,
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    }
                };
                if session.id != id {
                    return;
                }
                let mut states = session.client.state_watcher();
                match session.client.get_and_watch_data(&path).await {
                    Ok((data, stat, watcher)) => {
                        if data != value.as_bytes() || stat.ephemeral_owner != id {
                            return;
                        }
                        tokio::select! {
                            event = watcher.changed() => {
                                if matches!(event.event_type, EventType::NodeDeleted) {
                                    return;
                                }
                            }
                            state = states.changed() => {
                                if matches!(state, SessionState::Expired | SessionState::Closed | SessionState::AuthFailed) {
                                    return;
                                }
                            }
                        }
                    }
                    Err(
                        zookeeper_client::Error::NoNode | zookeeper_client::Error::SessionExpired,
                    ) => return,
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
    }

    /// At once, as [`Leases::release`]: there is nothing to gather a release with here.
    async fn release_soon(&self, lease: &Lease) {
        Leases::release(self, lease).await
    }

    /// Deletes the lease node if it still holds this lease's value in its session, at the version read;
    /// also after the lease was lost. Bounded by `node_timeout`; a release that fails there (the member
    /// it went to died) is left to the lease's reaper, which deletes the node again until that is done
    /// or the session ended — a live session's node would otherwise keep the job busy for good.
    async fn release(&self, lease: &Lease) {
        let Some(id) = self.session_of(&lease.value) else {
            return;
        };
        let limit = self.settings.node_timeout;
        let deleted = match self.sessions.current(limit).await {
            Ok(session) if session.id == id => {
                let (path, value) = (Self::path_of(lease), lease.value.clone());
                let client = session.client.clone();
                let task =
                    tokio::spawn(async move { delete_if_ours(&client, &path, &value, id).await });
                matches!(tokio::time::timeout(limit, task).await, Ok(Ok(Ok(()))))
            }
            // Another session: the lease's ended with its node.
            Ok(_) => true,
            Err(_) => false,
        };
        let mut leases = lock(&self.leases);
        if deleted {
            if let Some(held) = leases.remove(&lease.value) {
                held.wake.notify_one();
            }
        } else if let Some(held) = leases.get_mut(&lease.value) {
            // The reaper deletes it, retrying until the session ends.
            held.released = true;
            held.wake.notify_one();
        }
    }
}

/// Deletes the lease node at `path` if it holds `value` in session `id`, at the version read.
async fn delete_if_ours(
    client: &zookeeper_client::Client,
    path: &str,
    value: &str,
    id: i64,
) -> Result<(), zookeeper_client::Error> {
    let (data, stat) = match client.get_data(path).await {
        Err(zookeeper_client::Error::NoNode) => return Ok(()),
        other => other?,
    };
    if data == value.as_bytes() && stat.ephemeral_owner == id {
        match client.delete(path, Some(stat.version)).await {
            Ok(()) | Err(zookeeper_client::Error::NoNode | zookeeper_client::Error::BadVersion) => {
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The map of granted leases; a panic while holding it leaves it whole (every use is one call on it).
fn lock(leases: &Mutex<HashMap<String, Held>>) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
    leases
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
