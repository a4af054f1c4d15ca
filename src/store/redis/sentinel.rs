//! A Sentinel-managed group as one node of the majority: which server is its master now.
//!
//! A group's node never writes to a replica. It asks the Sentinels in turn for the master's address
//! (`SENTINEL GET-MASTER-ADDR-BY-NAME`; the one that answered is asked first next time), connects there,
//! and checks with `ROLE` that the server is a master before anything is sent; the node's connection
//! ([`super::node`]) then identifies it as any node's. It resolves the master again whenever that
//! connection fails, a write is refused `READONLY`, the master stops being one at a periodic re-check, or
//! a Sentinel announces `+switch-master` for the group (a watcher subscribed to the Sentinels bumps the
//! group's [`Group::epoch`], which ends every connection opened before); a write its replicas did not
//! acknowledge makes it ask the Sentinels whether the master moved ([`Group::verify`]).
//!
//! What makes a failover safe is the other half, in [`super::node`] and [`super::admission`]: a group's
//! answer counts only once `WAIT` says every replica the Sentinels know as up has its writes
//! ([`Group::acks_needed`]), so whichever replica they promote holds every claim the group confirmed;
//! and a new master
//! counts at once only if it was promoted from the master this process knew (its `master_replid2` is
//! that master's `master_replid`). Any other new server under the group — the master restarted empty,
//! or a group with `min_replicas_acked: 0` — is held off as a restarted node is.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};

use futures_util::StreamExt as _;
use redis::{ConnectionAddr, IntoConnectionInfo as _, RedisConnectionInfo, TlsCertificates, Value};
use tracing::{info, warn};

use crate::config::{ReplicaAcks, SentinelGroup};
use crate::logging::events;
use crate::store::GroupState;

/// How long one Sentinel may take to connect and answer before the next is asked.
const SENTINEL_TIMEOUT: Duration = Duration::from_millis(1_000);
/// How long the watcher waits before it subscribes again after losing its Sentinel.
const WATCH_RETRY: Duration = Duration::from_secs(1);
/// How often the watcher checks that its group is still in use (it ends with the store).
const WATCH_ALIVE: Duration = Duration::from_secs(5);

/// A group's settings, the Sentinel asked first, and the epoch of its master.
pub(super) struct Group {
    config: SentinelGroup,
    /// The store's CA and client certificate for a TLS group (`redis.ca_file`, …); `None`: the Mozilla
    /// roots, no client certificate.
    certificates: Option<TlsCertificates>,
    label: String,
    /// The Sentinel to ask first: the last one that answered.
    first: AtomicUsize,
    /// Bumped at each `+switch-master` of this group: connections opened before it are dropped.
    epoch: AtomicU64,
    /// Whether a [`Group::verify`] is under way: a lagging replica fails every round, and one question
    /// to the Sentinels at a time is enough.
    verifying: AtomicBool,
    /// Whether a [`Group::recount`] is under way, for the same reason.
    counting: AtomicBool,
    /// The master this process last connected to, and the moves it has seen ([`Group::state`]).
    seen: Mutex<Seen>,
    /// How many replicas the Sentinels last said they know and do not think down: what
    /// `min_replicas_acked: all` waits for ([`Group::acks_needed`]); [`REPLICAS_UNKNOWN`] until a
    /// Sentinel has said, and again whenever none answered.
    replicas_up: AtomicU32,
}

/// `replicas_up` when no Sentinel has said how many replicas are up: the group's answers do not count.
const REPLICAS_UNKNOWN: u32 = u32::MAX;

/// What a process has seen of a group's master.
#[derive(Default)]
struct Seen {
    /// `host:port` of the master a connection was last opened to (and `ROLE` confirmed).
    master: Option<String>,
    /// How often a new connection found the master at another address than the one before.
    failovers: u64,
    /// When the last of those was found.
    last_failover: Option<DateTime<Utc>>,
}

/// The master a Sentinel named, ready to connect to.
pub(super) struct Master {
    pub(super) client: redis::Client,
    /// `host:port`, for messages.
    pub(super) address: String,
    /// The group's epoch when the master was asked for.
    pub(super) epoch: u64,
}

impl Group {
    /// The group, with its watcher of `+switch-master` started (it ends once the group is dropped).
    /// Must be called inside a Tokio runtime.
    pub(super) fn start(
        config: &SentinelGroup,
        certificates: Option<TlsCertificates>,
    ) -> Arc<Group> {
        let group = Arc::new(Group {
            label: config.label(),
            config: config.clone(),
            certificates,
            first: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            verifying: AtomicBool::new(false),
            counting: AtomicBool::new(false),
            seen: Mutex::new(Seen::default()),
            replicas_up: AtomicU32::new(REPLICAS_UNKNOWN),
        });
        tokio::spawn(watch(Arc::downgrade(&group)));
        group
    }

    /// What logs and errors call the group (`sentinel://MASTER@host:port,…`).
    pub(super) fn label(&self) -> &str {
        &self.label
    }

    /// How many replicas must acknowledge a write before the group's answer counts: every replica the
    /// Sentinels know and do not think down (at least one) with `all`, else the number configured.
    ///
    /// Why every one: the Sentinels promote one replica and only then turn the old master into a
    /// replica. In between — a planned failover, a master that resumes during its own failover — the
    /// old master still takes writes and the other replicas still acknowledge them, but the promoted
    /// one no longer does; they are dropped when the others follow the new master. A write counts only
    /// if the replica promoted next has it; waiting for all of them is the one way to know, since
    /// which one is promoted is the Sentinels' choice. The count is the Sentinels' view (a promoted
    /// replica stays in it until the switch), read with the master and again whenever a Sentinel
    /// announces a replica down, up or new, and every few seconds; a replica that comes back raises it
    /// at its announcement.
    ///
    /// Until a Sentinel has said — or when none answered the last time it was asked — the count is
    /// unknown and the group's answers do not count (an error saying so): waiting for fewer replicas
    /// than there are would let the promoted one lack a confirmed claim.
    pub(super) fn acks_needed(&self) -> Result<u32, String> {
        match self.config.min_replicas_acked {
            ReplicaAcks::All => match self.replicas_up.load(Ordering::Acquire) {
                REPLICAS_UNKNOWN => Err(format!(
                    "no Sentinel of {} said how many replicas are up (SENTINEL REPLICAS): its \
                     answers do not count until one does",
                    self.label
                )),
                up => Ok(up.max(1)),
            },
            ReplicaAcks::Exactly(n) => Ok(n),
        }
    }

    /// Asks the Sentinels again how many replicas are up, in the background (one question at a time):
    /// called when a round found the count unknown, so that the group counts again as soon as a
    /// Sentinel answers rather than at the watcher's next quiet spell.
    pub(super) fn recount(group: &Arc<Group>) {
        if group.counting.swap(true, Ordering::AcqRel) {
            return;
        }
        let group = Arc::clone(group);
        tokio::spawn(async move {
            group.refresh_replicas().await;
            group.counting.store(false, Ordering::Release);
        });
    }

    /// Asks the Sentinels in turn how many replicas they know as up; keeps the first answer, or marks
    /// the count unknown when none answered.
    async fn refresh_replicas(&self) {
        let count = self.config.sentinels.len();
        let start = self.first.load(Ordering::Relaxed);
        for offset in 0..count {
            let sentinel = &self.config.sentinels[(start + offset) % count];
            let asked = async {
                let (host, port) = split_address(sentinel).ok()?;
                let client = self.client(&host, port, true).ok()?;
                let mut connection = client.get_multiplexed_async_connection().await.ok()?;
                let reply: Value = redis::cmd("SENTINEL")
                    .arg("REPLICAS")
                    .arg(&self.config.master)
                    .query_async(&mut connection)
                    .await
                    .ok()?;
                replicas_up(&reply)
            };
            if let Ok(Some(up)) = tokio::time::timeout(SENTINEL_TIMEOUT, asked).await {
                self.replicas_up.store(up, Ordering::Release);
                return;
            }
        }
        if self.replicas_up.swap(REPLICAS_UNKNOWN, Ordering::AcqRel) != REPLICAS_UNKNOWN {
            warn!(event = events::store::MASTER_UNKNOWN, node = %self.label,
                  "No Sentinel said how many replicas are up; the group's answers do not count until one does");
        }
    }

    /// The epoch now: a connection opened at an older one is to a master the Sentinels replaced.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Notes that a connection was opened to the master at `address` and `ROLE` confirmed it: a move
    /// from another address is a failover seen.
    pub(super) fn connected(&self, address: &str) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        if seen.master.as_deref() == Some(address) {
            return;
        }
        if seen.master.is_some() {
            seen.failovers += 1;
            seen.last_failover = Some(Utc::now());
        }
        seen.master = Some(address.to_string());
    }

    /// The group's master as this process last found it, and the failovers it has seen.
    pub(super) fn state(&self) -> GroupState {
        let (master, failovers, last_failover) = match self.seen.lock() {
            Ok(seen) => (seen.master.clone(), seen.failovers, seen.last_failover),
            Err(_) => (None, 0, None),
        };
        GroupState {
            group: self.label.clone(),
            master,
            failovers,
            last_failover,
        }
    }

    /// Asks the Sentinels in turn for the master's address; the first answer wins. Errors say what each
    /// Sentinel said, never a password.
    pub(super) async fn master(&self) -> Result<Master, String> {
        let epoch = self.epoch();
        let count = self.config.sentinels.len();
        let start = self.first.load(Ordering::Relaxed);
        let mut said = Vec::new();
        for offset in 0..count {
            let index = (start + offset) % count;
            let sentinel = &self.config.sentinels[index];
            match tokio::time::timeout(SENTINEL_TIMEOUT, self.ask(sentinel)).await {
                Ok(Ok((host, port))) => {
                    self.first.store(index, Ordering::Relaxed);
                    if self.config.min_replicas_acked == ReplicaAcks::All {
                        self.refresh_replicas().await;
                    }
                    let client = self.client(&host, port, false)?;
                    return Ok(Master {
                        client,
                        address: format!("{host}:{port}"),
                        epoch,
                    });
                }
                Ok(Err(why)) => said.push(format!("{sentinel}: {why}")),
                Err(_) => said.push(format!(
                    "{sentinel}: no answer within {} ms",
                    SENTINEL_TIMEOUT.as_millis()
                )),
            }
        }
        let why = format!(
            "no Sentinel of {} named the master ({})",
            self.label,
            said.join("; ")
        );
        warn!(event = events::store::MASTER_UNKNOWN, node = %self.label, error = %why, "No Sentinel named the group's master");
        Err(why)
    }

    /// One Sentinel's answer: the master's host and port.
    async fn ask(&self, sentinel: &str) -> Result<(String, u16), String> {
        let (host, port) = split_address(sentinel)?;
        let client = self.client(&host, port, true)?;
        let mut connection = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|error| error.to_string())?;
        let reply: Value = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.config.master)
            .query_async(&mut connection)
            .await
            .map_err(|error| error.to_string())?;
        master_address(&reply).ok_or_else(|| {
            format!(
                "monitors no master named {:?} (`sentinel monitor` names it)",
                self.config.master
            )
        })
    }

    /// A client for `host:port` with the group's TLS setting and the data nodes' credentials (or, for a
    /// Sentinel, the Sentinels' own).
    fn client(&self, host: &str, port: u16, sentinel: bool) -> Result<redis::Client, String> {
        let address = if self.config.tls {
            ConnectionAddr::TcpTls {
                host: host.to_string(),
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.to_string(), port)
        };
        let (username, password) = if sentinel {
            (
                &self.config.sentinel_username,
                &self.config.sentinel_password,
            )
        } else {
            (&self.config.username, &self.config.password)
        };
        let mut settings = RedisConnectionInfo::default();
        if !sentinel {
            settings = settings.set_db(self.config.db);
        }
        if let Some(username) = username {
            settings = settings.set_username(username);
        }
        if let Some(password) = password {
            settings = settings.set_password(password);
        }
        let info = address
            .into_connection_info()
            .map_err(|error| error.to_string())?
            .set_redis_settings(settings);
        let client = match &self.certificates {
            Some(certificates) if self.config.tls => {
                redis::Client::build_with_tls(info, certificates.clone())
            }
            _ => redis::Client::open(info),
        };
        client.map_err(|error| format!("{host}:{port}: {error}"))
    }

    /// Asks the Sentinels whether the master is still at `address` (a write there was not acknowledged by
    /// its replicas); if they name another, ends the connections to the old one as an announcement does.
    pub(super) async fn verify(&self, address: &str) {
        if self.verifying.swap(true, Ordering::AcqRel) {
            return;
        }
        let named = self.master().await;
        self.verifying.store(false, Ordering::Release);
        if let Ok(master) = named {
            if master.address != address && master.epoch == self.epoch() {
                self.switched(&format!(
                    "the Sentinels name {} instead of {address}",
                    master.address
                ));
            }
        }
    }

    /// Notes that a Sentinel announced a new master for the group.
    fn switched(&self, announcement: &str) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        info!(event = events::store::MASTER_SWITCHED, node = %self.label, announcement = %announcement,
              "A Sentinel announced a new master for the group; connections to the old one are closed");
    }
}

/// Checks with `ROLE` that the server on `connection` is a master: a Sentinel's answer may be stale.
pub(super) async fn check_master(
    connection: &mut redis::aio::MultiplexedConnection,
    address: &str,
) -> Result<(), String> {
    let reply: Value = redis::cmd("ROLE")
        .query_async(connection)
        .await
        .map_err(|error| format!("ROLE on {address} failed: {error}"))?;
    let role = match &reply {
        Value::Array(items) => items.first().and_then(text),
        _ => None,
    };
    match role.as_deref() {
        Some("master") => Ok(()),
        Some(role) => Err(format!(
            "the Sentinels named {address} as the master, but it is a {role}: asking again"
        )),
        None => Err(format!("ROLE on {address} gave no role")),
    }
}

/// Follows the Sentinels' `+switch-master` announcements for as long as the group is in use.
async fn watch(group: Weak<Group>) {
    let mut turn = 0usize;
    loop {
        let Some(strong) = group.upgrade() else {
            return;
        };
        let sentinels = strong.config.sentinels.clone();
        let master = strong.config.master.clone();
        let sentinel = &sentinels[turn % sentinels.len()];
        turn += 1;
        let subscribed = async {
            let (host, port) = split_address(sentinel).ok()?;
            let client = strong.client(&host, port, true).ok()?;
            let mut pubsub = tokio::time::timeout(SENTINEL_TIMEOUT, client.get_async_pubsub())
                .await
                .ok()?
                .ok()?;
            let channels = ["+switch-master", "+sdown", "-sdown", "+slave"];
            tokio::time::timeout(SENTINEL_TIMEOUT, pubsub.subscribe(&channels))
                .await
                .ok()?
                .ok()?;
            Some(pubsub)
        }
        .await;
        drop(strong);
        let Some(pubsub) = subscribed else {
            tokio::time::sleep(WATCH_RETRY).await;
            continue;
        };
        let mut messages = pubsub.into_on_message();
        loop {
            let next = tokio::time::timeout(WATCH_ALIVE, messages.next()).await;
            let Some(strong) = group.upgrade() else {
                return;
            };
            let counts_replicas = strong.config.min_replicas_acked == ReplicaAcks::All;
            match next {
                // Quiet: read the replicas again, and go on listening while the group is used.
                Err(_) => {
                    if counts_replicas {
                        strong.refresh_replicas().await;
                    }
                    continue;
                }
                // The Sentinel went away: subscribe to the next one.
                Ok(None) => break,
                Ok(Some(message)) => {
                    let channel = message.get_channel_name().to_string();
                    let payload: String = message.get_payload().unwrap_or_default();
                    if channel == "+switch-master" {
                        // "<master name> <old ip> <old port> <new ip> <new port>"
                        if payload.split(' ').next() == Some(master.as_str()) {
                            strong.switched(&payload);
                        }
                    } else if counts_replicas && about_a_replica_of(&payload, &master) {
                        strong.refresh_replicas().await;
                    }
                }
            }
        }
        tokio::time::sleep(WATCH_RETRY).await;
    }
}

/// Whether a Sentinel event's payload is about a replica of `master`: "slave <name> <ip> <port> @
/// <master name> <master ip> <master port>".
fn about_a_replica_of(payload: &str, master: &str) -> bool {
    let mut words = payload.split(' ');
    words.next() == Some("slave") && words.skip_while(|w| *w != "@").nth(1) == Some(master)
}

/// How many replicas a `SENTINEL REPLICAS` reply lists that the Sentinel does not think down (no
/// `s_down`, `o_down` or `disconnected` among their flags); `None` for anything but a list.
fn replicas_up(reply: &Value) -> Option<u32> {
    let Value::Array(replicas) = reply else {
        return None;
    };
    let up = replicas
        .iter()
        .filter(|replica| {
            let flags = match replica {
                Value::Array(fields) => fields
                    .chunks(2)
                    .find(|pair| text(&pair[0]).as_deref() == Some("flags"))
                    .and_then(|pair| pair.get(1).and_then(text)),
                Value::Map(fields) => fields
                    .iter()
                    .find(|(key, _)| text(key).as_deref() == Some("flags"))
                    .and_then(|(_, value)| text(value)),
                _ => None,
            };
            flags.is_some_and(|flags| {
                !flags
                    .split(',')
                    .any(|flag| matches!(flag, "s_down" | "o_down" | "disconnected"))
            })
        })
        .count();
    u32::try_from(up).ok()
}

/// The host and port of a validated Sentinel address (`host:port` or `[v6]:port`).
fn split_address(address: &str) -> Result<(String, u16), String> {
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| format!("{address}: expected host:port"))?;
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("{address}: invalid port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok((host.to_string(), port))
}

/// The `[host, port]` of a `GET-MASTER-ADDR-BY-NAME` reply; `None` for a nil (an unknown master) or
/// anything else.
fn master_address(reply: &Value) -> Option<(String, u16)> {
    let Value::Array(items) = reply else {
        return None;
    };
    let [host, port] = items.as_slice() else {
        return None;
    };
    let host = text(host).filter(|host| !host.is_empty() && host.len() <= 255)?;
    let port = text(port)?.parse::<u16>().ok().filter(|port| *port > 0)?;
    Some((host, port))
}

/// A reply's text, if it is one.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::{about_a_replica_of, master_address, replicas_up, split_address};

    #[test]
    fn a_master_address_is_a_host_and_a_port() {
        let reply = Value::Array(vec![
            Value::BulkString(b"10.0.0.5".to_vec()),
            Value::BulkString(b"6380".to_vec()),
        ]);
        assert_eq!(master_address(&reply), Some(("10.0.0.5".to_string(), 6380)));
        assert_eq!(master_address(&Value::Nil), None);
        let bad_port = Value::Array(vec![
            Value::BulkString(b"h".to_vec()),
            Value::BulkString(b"0".to_vec()),
        ]);
        assert_eq!(master_address(&bad_port), None);
        assert_eq!(master_address(&Value::Array(vec![])), None);
    }

    /// A replica counts unless the Sentinel thinks it down or lost its link; anything else is no list.
    #[test]
    fn replicas_up_are_those_not_down() {
        let replica = |flags: &str| {
            Value::Array(vec![
                Value::BulkString(b"name".to_vec()),
                Value::BulkString(b"127.0.0.1:6380".to_vec()),
                Value::BulkString(b"flags".to_vec()),
                Value::BulkString(flags.as_bytes().to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            replica("slave"),
            replica("s_down,slave"),
            replica("slave,disconnected"),
            replica("slave,promoted"),
        ]);
        assert_eq!(replicas_up(&reply), Some(2));
        assert_eq!(replicas_up(&Value::Array(vec![])), Some(0));
        assert_eq!(replicas_up(&Value::Nil), None);
    }

    /// Replica events name their master after `@`; a master's own events are not a replica's.
    #[test]
    fn replica_events_are_told_by_their_master() {
        let event = "slave 127.0.0.1:6380 127.0.0.1 6380 @ mymaster 127.0.0.1 6379";
        assert!(about_a_replica_of(event, "mymaster"));
        assert!(!about_a_replica_of(event, "other"));
        assert!(!about_a_replica_of(
            "master mymaster 127.0.0.1 6379",
            "mymaster"
        ));
    }

    #[test]
    fn sentinel_addresses_split_into_host_and_port() {
        assert_eq!(split_address("h:26379"), Ok(("h".to_string(), 26379)));
        assert_eq!(split_address("[::1]:5"), Ok(("::1".to_string(), 5)));
        assert!(split_address("h").is_err());
    }
}
