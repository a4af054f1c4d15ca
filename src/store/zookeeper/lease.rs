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

use std::future::Future;
use std::time::Duration;

use zookeeper_client::{EventType, SessionState};

use super::claim::lease_path;
use super::ZookeeperStore;
use crate::clock::boot::BootInstant;
use crate::lock::{Lease, RenewError};
use crate::store::Leases;

/// What a read of a lease node found.
enum Held {
    /// This lease's value, in this session.
    Yes,
    /// Gone, another value, or another session's.
    No,
}

impl ZookeeperStore {
    /// Remembers the session a lease was won in, by its value.
    pub(super) fn remember(&self, value: &str, session: i64) {
        self.lock_leases().insert(value.to_string(), session);
    }

    /// The session a lease was won in.
    fn session_of(&self, value: &str) -> Option<i64> {
        self.lock_leases().get(value).copied()
    }

    /// Forgets a released lease; returns the session it was won in.
    fn forget(&self, value: &str) -> Option<i64> {
        self.lock_leases().remove(value)
    }

    fn lock_leases(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, i64>> {
        // A panic while holding the map leaves it whole (every use is one call on it).
        self.leases
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn path_of(lease: &Lease) -> String {
        lease_path(&lease.job, lease.tick, lease.overlap, &lease.series)
    }

    /// A sync, then a read of the lease node, within `limit`, in session `id`'s client.
    async fn prove(&self, lease: &Lease, id: i64, limit: Duration) -> Result<Held, String> {
        let session = self.sessions.current(limit).await?;
        if session.id != id {
            return Ok(Held::No);
        }
        let path = Self::path_of(lease);
        let proof = async {
            session.client.sync(&path).await?;
            session.client.get_data(&path).await
        };
        match tokio::time::timeout(limit, proof).await {
            Err(_) => Err("no answer within node_timeout".to_string()),
            Ok(Err(zookeeper_client::Error::NoNode)) => Ok(Held::No),
            Ok(Err(zookeeper_client::Error::SessionExpired)) => Ok(Held::No),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok((data, stat))) => Ok(
                if data == lease.value.as_bytes() && stat.ephemeral_owner == id {
                    Held::Yes
                } else {
                    Held::No
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
            (Ok(Held::No), _, _) => {
                lease.mark_lost();
                let why =
                    "lease not held: its node is gone or another session's (the session expired?)";
                Err(RenewError::NotHeld(self.failure(why)))
            }
            (_, true, _) => {
                lease.mark_lost();
                Err(RenewError::Expired)
            }
            (Ok(Held::Yes), false, Some(timeout)) => {
                let deadline = self.lease_deadline(start, timeout);
                if deadline > lease.deadline() {
                    lease.extend_to(deadline);
                }
                Ok(())
            }
            (Ok(Held::Yes), false, None) => {
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
    /// also after the lease was lost. Bounded by `node_timeout`; a release that fails leaves the node
    /// to the end of the session (a live session's node stays: the job is busy until the next release
    /// or the end of the process).
    async fn release(&self, lease: &Lease) {
        let Some(id) = self.forget(&lease.value) else {
            return;
        };
        let limit = self.settings.node_timeout;
        let Ok(session) = self.sessions.current(limit).await else {
            return;
        };
        if session.id != id {
            return;
        }
        let path = Self::path_of(lease);
        let value = lease.value.clone();
        let client = session.client.clone();
        let delete = async move {
            let (data, stat) = client.get_data(&path).await?;
            if data == value.as_bytes() && stat.ephemeral_owner == id {
                client.delete(&path, Some(stat.version)).await?;
            }
            Ok::<_, zookeeper_client::Error>(())
        };
        let task = tokio::spawn(delete);
        let _ = tokio::time::timeout(limit, task).await;
    }
}
