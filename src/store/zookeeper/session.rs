//! The store's ZooKeeper session: connected in the background on first use, shared by every call, and
//! replaced by a new one once the ensemble expired it (or closed it, or refused its auth).
//!
//! A connect runs as a task of its own, so a caller that stops waiting for it (its `node_timeout` passed)
//! never cancels it: the next call finds the session ready. The client reconnects to another member by
//! itself within the same session while the session lives; only a new session loses the leases, whose
//! ephemeral nodes the ensemble deleted with the old one.
//!
//! A session talks to one member at a time, so while that member is hung (SIGSTOP, a long GC pause, a
//! partition that drops packets) every request of this worker goes unanswered, whatever the others do,
//! until the client gives the member up: after its **connection timeout** without a byte from it
//! ([`connection_timeout`]). The client's own default is `2/5` of the session timeout — 12 s at the
//! default `lock.ttl` of 30 s, during which this worker claims nothing and confirms no renewal — so
//! the store sets it to what `lock.node_timeout` says a member may take. (The client picks the next
//! member in a shuffled order, which may be the hung one again: that try costs one more connection
//! timeout.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt as _, Shared};
use zookeeper_client::{Acls, Client, CreateMode, SessionState, TlsOptions};

use super::acl;
use crate::config::ZookeeperConfig;
use crate::store::StoreError;

/// One ZooKeeper session, chrooted to `/<key_prefix>`.
pub(super) struct Session {
    pub client: Client,
    /// The session id: the `ephemeralOwner` of the nodes this session creates.
    pub id: i64,
    /// The session timeout the ensemble negotiated (within its `tickTime × 2 … × 20`): the one that
    /// bounds leases, whatever was asked for.
    pub timeout: Duration,
    /// The ACL of every node the store creates: the creator's (digest auth) or anyone's.
    pub acls: Acls<'static>,
}

impl Session {
    /// Whether the session may still serve: not expired, closed or refused (a disconnected client
    /// reconnects within the session).
    pub fn usable(&self) -> bool {
        !matches!(
            self.client.state(),
            SessionState::Expired | SessionState::Closed | SessionState::AuthFailed
        )
    }
}

/// Why a connect gave no session.
#[derive(Debug, Clone)]
pub(super) struct Unconnected {
    pub why: String,
    /// Whether the store cannot be used until someone acts (a node of the store that this user cannot
    /// make its own, `acl.rs`), rather than not yet (the ensemble is down): the worker stops at start.
    pub unusable: bool,
}

impl Unconnected {
    fn later(why: String) -> Unconnected {
        Unconnected {
            why,
            unusable: false,
        }
    }
}

type Connecting = Shared<BoxFuture<'static, Result<Arc<Session>, Unconnected>>>;

/// What a connect needs, kept for every later connect.
struct Spec {
    /// `host:port,host:port`, as the client's connect string takes it.
    hosts: String,
    chroot: String,
    timeout: Duration,
    /// How long the client waits for a byte from its member before it moves the session to another.
    connection_timeout: Duration,
    /// `user:password` for digest auth.
    digest: Option<String>,
    tls: Option<TlsOptions>,
}

/// The session of a store, and the connect under way.
pub(super) struct Sessions {
    spec: Arc<Spec>,
    connecting: Mutex<Option<Connecting>>,
    /// Whether a session of this process has walked the whole tree under the chroot and made it this
    /// user's (with auth: `acl.rs`); later sessions check the chroot and its directories only.
    walked: Arc<AtomicBool>,
}

impl Sessions {
    /// Sessions for the ensemble of `config`, chrooted to `/<prefix>`; reads the TLS files now, so that a
    /// bad file stops the worker at start, naming it.
    pub fn new(
        config: &ZookeeperConfig,
        prefix: &str,
        node_timeout: Duration,
    ) -> Result<Sessions, StoreError> {
        let tls = match &config.tls {
            None => None,
            Some(tls) => {
                let _ = rustls::crypto::ring::default_provider().install_default();
                let read = |path: &std::path::Path| {
                    std::fs::read_to_string(path).map_err(|e| StoreError::Zookeeper {
                        reason: format!("cannot read {}: {e}", path.display()),
                    })
                };
                let bad =
                    |path: &std::path::Path, e: zookeeper_client::Error| StoreError::Zookeeper {
                        reason: format!("{}: {e}", path.display()),
                    };
                let mut options = TlsOptions::new()
                    .with_pem_ca(&read(&tls.ca_file)?)
                    .map_err(|e| bad(&tls.ca_file, e))?;
                if let Some((cert, key)) = &tls.client_identity {
                    options = options
                        .with_pem_identity(&read(cert)?, &read(key)?)
                        .map_err(|e| bad(cert, e))?;
                }
                Some(options)
            }
        };
        let spec = Spec {
            hosts: config.hosts.join(","),
            chroot: format!("/{prefix}"),
            timeout: config.session_timeout,
            connection_timeout: connection_timeout(node_timeout, config.session_timeout),
            digest: config
                .auth
                .as_ref()
                .map(|(user, password)| format!("{user}:{password}")),
            tls,
        };
        Ok(Sessions {
            spec: Arc::new(spec),
            connecting: Mutex::new(None),
            walked: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The connect under way or done, started anew when there is none or its session is no longer
    /// usable (or it failed).
    pub fn start(&self) -> Connecting {
        let mut connecting = self
            .connecting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(current) = connecting.as_ref() {
            match current.peek() {
                None => return current.clone(),
                Some(Ok(session)) if session.usable() => return current.clone(),
                Some(_) => {}
            }
        }
        let task = tokio::spawn(connect(Arc::clone(&self.spec), Arc::clone(&self.walked)));
        let shared = async move {
            task.await.unwrap_or_else(|e| {
                Err(Unconnected::later(format!("the connect task failed: {e}")))
            })
        }
        .boxed()
        .shared();
        *connecting = Some(shared.clone());
        shared
    }

    /// The usable session, waiting at most `limit` for a connect.
    pub async fn current(&self, limit: Duration) -> Result<Arc<Session>, String> {
        let connecting = self.start();
        match tokio::time::timeout(limit, connecting).await {
            Ok(Ok(session)) if session.usable() => Ok(session),
            Ok(Ok(_)) => Err("the session expired; a new one is being connected".to_string()),
            Ok(Err(failed)) => Err(failed.why),
            Err(_) => Err(format!(
                "no session yet (connecting, waited {})",
                crate::config::show_duration(limit)
            )),
        }
    }

    /// With auth, why the store cannot be used, if the first connect says so within the session
    /// timeout (the ACL walk included); `None` once a session is ready, when the ensemble does not
    /// answer in that time, and without auth (which makes no walk).
    pub async fn unusable(&self) -> Option<String> {
        self.spec.digest.as_ref()?;
        match tokio::time::timeout(self.spec.timeout, self.start()).await {
            Ok(Err(failed)) if failed.unusable => Some(failed.why),
            _ => None,
        }
    }

    /// The session, if one is connected and usable now (no wait).
    pub fn ready(&self) -> Option<Arc<Session>> {
        let connecting = self
            .connecting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match connecting.as_ref()?.peek()? {
            Ok(session) if session.usable() => Some(Arc::clone(session)),
            _ => None,
        }
    }
}

/// How long the client may hear nothing from the member its session rides before it moves the session
/// to another: `4 × node_timeout`, at least 1 s, at most the client's own default of `2/5` of the
/// session timeout.
///
/// A member that answered none of four rounds in time is hung for this worker's purposes. The client
/// pings an idle connection after `3/8` of this (so a healthy member has `5/8` of it, 1.25 node
/// timeouts at least, to answer the ping), and a false move costs little: the session, its ephemeral
/// leases and their deadlines stay as they are; the requests in flight fail as a lost answer does
/// (`claim.rs` settles such a claim by reading it back), and ZooKeeper refuses what the old member
/// still forwards once the session has moved. The bound keeps a short session's timeouts as the
/// client sets them (above `3/5` of the session timeout it would ignore the setting).
pub(super) fn connection_timeout(node_timeout: Duration, session_timeout: Duration) -> Duration {
    (node_timeout * 4)
        .max(Duration::from_secs(1))
        .min(session_timeout * 2 / 5)
}

/// Connects a new session, makes the chroot's directories, with auth makes the tree this user's
/// (`acl.rs`: the whole of it unless `walked`), and chroots the client.
async fn connect(spec: Arc<Spec>, walked: Arc<AtomicBool>) -> Result<Arc<Session>, Unconnected> {
    let mut connector = Client::connector()
        .with_session_timeout(spec.timeout)
        .with_connection_timeout(spec.connection_timeout);
    if let Some(digest) = &spec.digest {
        connector = connector.with_auth("digest", digest.as_bytes());
    }
    let root = match &spec.tls {
        Some(tls) => {
            connector
                .with_tls(tls.clone())
                .secure_connect(&spec.hosts)
                .await
        }
        None => connector.connect(&spec.hosts).await,
    }
    .map_err(|e| Unconnected::later(format!("cannot connect: {e}")))?;
    let acls = if spec.digest.is_some() {
        Acls::creator_all()
    } else {
        Acls::anyone_all()
    };
    let options = CreateMode::Persistent.with_acls(acls);
    for dir in acl::DIRS {
        let path = format!("{}/{dir}", spec.chroot);
        match root.mkdir(&path, &options).await {
            Ok(()) => {}
            // Another identity's chroot (with auth: this user's walk would stop there too).
            Err(zookeeper_client::Error::NoAuth) if spec.digest.is_some() => {
                let acl = match root.get_acl(&spec.chroot).await {
                    Ok((acl, _)) => acl::show(&acl),
                    Err(e) => format!("unreadable: {e}"),
                };
                return Err(Unconnected {
                    why: acl::Unfixable {
                        path: spec.chroot.clone(),
                        why: format!("this user may not make {path} in it"),
                        acl,
                    }
                    .to_string(),
                    unusable: true,
                });
            }
            Err(e) => return Err(Unconnected::later(format!("cannot make {path}: {e}"))),
        }
    }
    let id = root.session_id().0;
    if spec.digest.is_some() {
        let whole = !walked.load(Ordering::Acquire);
        match acl::lock_down(&root, &spec.chroot, id, whole).await {
            Ok(report) => {
                report.log(&spec.chroot);
                if whole {
                    walked.store(true, Ordering::Release);
                }
            }
            Err(acl::Stopped::Unfixable(unfixable)) => {
                return Err(Unconnected {
                    why: unfixable.to_string(),
                    unusable: true,
                })
            }
            Err(acl::Stopped::Failed(why)) => return Err(Unconnected::later(why)),
        }
    }
    let client = root
        .chroot(spec.chroot.as_str())
        .map_err(|_| Unconnected::later(format!("invalid chroot {}", spec.chroot)))?;
    let timeout = client.session_timeout();
    Ok(Arc::new(Session {
        client,
        id,
        timeout,
        acls,
    }))
}

#[cfg(test)]
mod tests {
    use super::connection_timeout;
    use std::time::Duration;

    /// Four node timeouts, at least 1 s, at most the client's own `2/5` of the session timeout.
    #[test]
    fn the_connection_timeout_is_four_node_timeouts_within_its_bounds() {
        let ms = Duration::from_millis;
        // The defaults: node_timeout 500 ms, session 30 s (lock.ttl).
        assert_eq!(connection_timeout(ms(500), ms(30_000)), ms(2_000));
        assert_eq!(connection_timeout(ms(100), ms(30_000)), ms(1_000));
        // The chaos runs' 400 ms and 4 s: the client's default already.
        assert_eq!(connection_timeout(ms(400), ms(4_000)), ms(1_600));
        // A short session keeps the client's default, below the 1 s floor too.
        assert_eq!(connection_timeout(ms(500), ms(2_000)), ms(800));
    }
}
