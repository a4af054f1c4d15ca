//! Run history and membership on ZooKeeper, in the shape of the other stores, and the bounded reads
//! every part of the store uses ([`ZookeeperStore::children`], [`ZookeeperStore::read_many`]).
//!
//! History: one persistent node per entry, `/history/<job>/<tick>-<entry id>` (the tick as 20 digits that
//! sort as it does), holding the entry's JSON; a later version of the same fact replaces it. After a
//! write of a tick that checks the bound ([`crate::history::HistorySettings::checks_bound_at`]) the job's
//! entries are listed, and once there are more than `most_ticks` ticks the oldest past `keep_ticks` are
//! deleted. Members: `/members/<id>` holds `<seen ms> <JSON>` (stamped with the announcing worker's
//! clock: ZooKeeper has no clock to read), and `/members-alive/<id>` is an ephemeral node of the
//! announcing session (holding the instant its heartbeat ends, for people): a worker is alive while it
//! stands, with no clock read by the readers. It goes when the worker stops (it deletes it), when its
//! session ends, or when its heartbeat ([`Member::ttl`]) ends without a new announcement: the announcing
//! store's reaper deletes it then, on this host's boot clock (the session outlives a worker that stopped
//! announcing but lives).
//! Records older than [`KEEP_DEAD`] are dropped by the next announcement.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use zookeeper_client::{CreateMode, MultiReadResult, Stat};

use super::session::Session;
use super::{node_name, sortable, text, ZookeeperStore, EXCHANGE_TIMEOUT, MAX_CHILDREN};
use crate::clock::boot::BootInstant;
use crate::history::{Entry, Query};
use crate::lock::QuorumFailure;
use crate::membership::{self, Member, KEEP_DEAD};
use crate::store::{skip_note, Read, Records};

/// How many reads go in one multi-read of small nodes (members, triggers, pauses).
pub(super) const READ_CHUNK: usize = 200;

/// How many history entries go in one multi-read: each may carry 128 KiB of output tails, and the
/// answer to one multi-read is one message that holds the session's connection while it is sent.
const HISTORY_CHUNK: usize = 16;

impl ZookeeperStore {
    /// The children of `path`, sorted (none if it does not exist).
    pub(super) async fn children(
        &self,
        session: &Session,
        path: &str,
    ) -> Result<Vec<String>, String> {
        match session.client.list_children(path).await {
            Ok(mut names) => {
                names.sort_unstable();
                Ok(names)
            }
            Err(zookeeper_client::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// The data of each of `paths`, in order (`None`: no such node), in multi-reads of `chunk` paths.
    pub(super) async fn read_many(
        &self,
        session: &Session,
        paths: impl Iterator<Item = String>,
        chunk: usize,
    ) -> Result<Vec<Option<(Vec<u8>, Stat)>>, String> {
        let paths: Vec<String> = paths.collect();
        let mut found = Vec::with_capacity(paths.len());
        for chunk in paths.chunks(chunk) {
            let mut reader = session.client.new_multi_reader();
            for path in chunk {
                reader.add_get_data(path).map_err(|e| e.to_string())?;
            }
            let results = reader.commit().await.map_err(|e| e.to_string())?;
            for result in results {
                found.push(match result {
                    MultiReadResult::Data { data, stat } => Some((data, stat)),
                    _ => None,
                });
            }
        }
        Ok(found)
    }

    /// [`Records::history`]'s read, unbounded in time.
    async fn read_history(&self, query: &Query) -> Result<Read<Vec<Entry>>, QuorumFailure> {
        let _turn = self
            .reads
            .acquire()
            .await
            .map_err(|_| self.failure("the history reads are closed"))?;
        let session = self
            .sessions
            .current(EXCHANGE_TIMEOUT)
            .await
            .map_err(|why| self.failure(why))?;
        let dir = Self::history_dir(&query.job);
        let mut names = self
            .children(&session, &dir)
            .await
            .map_err(|why| self.failure(why))?;
        let from = sortable(query.since.map_or(i64::MIN, |t| t.as_millis()));
        let to = sortable(query.until.map_or(i64::MAX, |t| t.as_millis()));
        names.retain(|name| {
            name.get(..20)
                .is_some_and(|tick| tick >= from.as_str() && tick <= to.as_str())
        });
        names.reverse();
        // Whole ticks up to the limit, so that the merge's order picks the entries of the last tick.
        let mut chosen = Vec::new();
        for name in &names {
            let tick = name.get(..20);
            if chosen.len() >= query.limit
                && chosen.last().map(|n: &&String| n.get(..20)) != Some(tick)
            {
                break;
            }
            chosen.push(name);
        }
        let datas = self
            .read_many(
                &session,
                chosen.iter().map(|name| format!("{dir}/{name}")),
                HISTORY_CHUNK,
            )
            .await
            .map_err(|why| self.failure(why))?;
        let (mut entries, mut skipped) = (Vec::new(), Vec::new());
        for (name, data) in chosen.iter().zip(datas) {
            let Some((data, _)) = data else { continue };
            match text(&data).and_then(|json| Entry::from_json(json).map_err(|e| e.to_string())) {
                Ok(entry) => entries.push(entry),
                Err(why) => skipped.push(skip_note("zookeeper", "history entry", name, &why)),
            }
        }
        Ok(Read::newest(entries, query.limit, skipped))
    }

    /// Writes `data` at `path`: created (with its parent, if missing) or replaced.
    async fn put(
        &self,
        session: &Session,
        path: &str,
        data: &[u8],
        mode: CreateMode,
    ) -> Result<(), String> {
        let options = mode.with_acls(session.acls);
        let client = &session.client;
        for _ in 0..3 {
            match client.create(path, data, &options).await {
                Ok(_) => return Ok(()),
                Err(zookeeper_client::Error::NodeExists) if mode == CreateMode::Persistent => {
                    match client.set_data(path, data, None).await {
                        Ok(_) => return Ok(()),
                        Err(zookeeper_client::Error::NoNode) => continue,
                        Err(e) => return Err(e.to_string()),
                    }
                }
                Err(zookeeper_client::Error::NoNode) => {
                    let parent = path.rsplit_once('/').map_or("", |(parent, _)| parent);
                    let dir = CreateMode::Persistent.with_acls(session.acls);
                    client
                        .mkdir(parent, &dir)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        Err(format!("{path} kept changing under the write"))
    }

    /// Makes the ephemeral `path` this session's, holding `data`: created, rewritten if this session's,
    /// or taken over from another session (an earlier one of this process, not yet expired).
    async fn keep_alive(&self, session: &Session, path: &str, data: &[u8]) -> Result<(), String> {
        let options = CreateMode::Ephemeral.with_acls(session.acls);
        let client = &session.client;
        for _ in 0..3 {
            match client.create(path, data, &options).await {
                Ok(_) => return Ok(()),
                Err(zookeeper_client::Error::NodeExists) => {}
                Err(e) => return Err(e.to_string()),
            }
            let stat = match client.check_stat(path).await {
                Ok(Some(stat)) => stat,
                Ok(None) => continue,
                Err(e) => return Err(e.to_string()),
            };
            let written = if stat.ephemeral_owner == session.id {
                client
                    .set_data(path, data, Some(stat.version))
                    .await
                    .map(|_| ())
            } else {
                client.delete(path, Some(stat.version)).await
            };
            match written {
                Ok(()) if stat.ephemeral_owner == session.id => return Ok(()),
                Ok(())
                | Err(zookeeper_client::Error::NoNode | zookeeper_client::Error::BadVersion) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Err(format!("{path} kept changing under the write"))
    }

    /// Sets (or with `None` forgets) when member `id`'s heartbeat ends; whether it had none (its reaper
    /// is to be started).
    fn heartbeat_ends(&self, id: &str, ends: Option<BootInstant>) -> bool {
        let mut beats = self.heartbeats.lock().unwrap_or_else(|p| p.into_inner());
        match ends {
            Some(ends) => beats.insert(id.to_string(), ends).is_none(),
            None => {
                beats.remove(id);
                false
            }
        }
    }

    /// Deletes member `id`'s alive node at `path` once its heartbeat ended without a new announcement
    /// (the session outlives a worker that stopped announcing but lives): a member is alive while the
    /// node stands, with no clock read by the readers.
    fn reap_member(&self, id: &str, path: String, client: zookeeper_client::Client) {
        let beats = Arc::clone(&self.heartbeats);
        let id = id.to_string();
        tokio::spawn(async move {
            loop {
                let ends = beats
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&id)
                    .copied();
                let Some(ends) = ends else { return };
                let left = ends.saturating_duration_since(BootInstant::now());
                if !left.is_zero() {
                    tokio::time::sleep(left).await;
                    continue;
                }
                beats.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                let _ = client.delete(&path, None).await;
                return;
            }
        });
    }

    /// `/history/<job>`.
    fn history_dir(job: &str) -> String {
        format!("/history/{}", node_name(job))
    }

    /// Deletes the job's entries of every tick older than its newest `keep_ticks`, once it has more than
    /// `most_ticks` ([`crate::history::HistorySettings::newest_dropped`]).
    async fn trim(&self, session: &Session, job: &str) -> Result<(), String> {
        let dir = Self::history_dir(job);
        let names = self.children(session, &dir).await?;
        let mut ticks: Vec<&str> = names.iter().filter_map(|name| name.get(..20)).collect();
        ticks.dedup();
        ticks.reverse();
        let Some(newest_dropped) = self.history.newest_dropped(&ticks) else {
            return Ok(());
        };
        let doomed = names
            .iter()
            .filter(|name| name.get(..20).is_some_and(|tick| tick <= newest_dropped))
            .map(|name| session.client.delete(&format!("{dir}/{name}"), None));
        join_all(doomed).await;
        Ok(())
    }

    /// Deletes the records of members last heard from more than [`KEEP_DEAD`] before `now_ms`.
    async fn drop_dead(&self, session: &Session, now_ms: i64) -> Result<(), String> {
        let cutoff =
            now_ms.saturating_sub(i64::try_from(KEEP_DEAD.as_millis()).unwrap_or(i64::MAX));
        let records = self.read_members(session).await?;
        let dead = records
            .iter()
            .filter(|(_, seen, _)| *seen < cutoff)
            .map(|(id, _, _)| session.client.delete(&format!("/members/{id}"), None));
        join_all(dead).await;
        Ok(())
    }

    /// The member records: `(node name, seen ms, JSON)`; a record that is not text reads as seen at 0.
    async fn read_members(&self, session: &Session) -> Result<Vec<(String, i64, String)>, String> {
        let mut ids = self.children(session, "/members").await?;
        ids.truncate(MAX_CHILDREN);
        let datas = self
            .read_many(
                session,
                ids.iter().map(|id| format!("/members/{id}")),
                READ_CHUNK,
            )
            .await?;
        Ok(ids
            .into_iter()
            .zip(datas)
            .filter_map(|(id, data)| {
                let (data, _) = data?;
                let record = text(&data).unwrap_or_default();
                let (seen, json) = record.split_once(' ').unwrap_or(("0", ""));
                Some((id, seen.parse().unwrap_or(0), json.to_string()))
            })
            .collect())
    }
}

impl Records for ZookeeperStore {
    /// Writes `entries` (at once), and keeps each of their jobs within its bound; see
    /// [`crate::store::Store::record`].
    async fn record(&self, entries: &[Entry]) -> Result<(), QuorumFailure> {
        let run = async {
            let session = self.sessions.current(EXCHANGE_TIMEOUT).await?;
            let session = &session;
            let writes = entries.iter().map(|entry| async move {
                let path = format!(
                    "{}/{}-{}",
                    Self::history_dir(&entry.job),
                    sortable(entry.tick),
                    node_name(&entry.id())
                );
                self.put(
                    session,
                    &path,
                    entry.to_json().as_bytes(),
                    CreateMode::Persistent,
                )
                .await
            });
            join_all(writes)
                .await
                .into_iter()
                .collect::<Result<Vec<()>, String>>()?;
            let mut jobs: Vec<&str> = entries
                .iter()
                .filter(|e| self.history.checks_bound_at(e.tick))
                .map(|e| e.job.as_str())
                .collect();
            jobs.sort_unstable();
            jobs.dedup();
            for job in jobs {
                self.trim(session, job).await?;
            }
            Ok::<_, String>(())
        };
        match tokio::time::timeout(EXCHANGE_TIMEOUT, run).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(self.failure(why)),
            Err(_) => Err(self.failure("no answer in time")),
        }
    }

    /// The entries of `query`, newest first; an entry that does not parse is skipped, and named in
    /// [`Read::skipped`]; see [`crate::store::Store::history`].
    ///
    /// In its turn among at most two reads at once, the entries fetched [`HISTORY_CHUNK`] at a time (so
    /// that a renewal on the same session waits for one chunk at most: ZooKeeper answers a session's
    /// requests in order), all within [`EXCHANGE_TIMEOUT`].
    async fn history(&self, query: &Query) -> Result<Read<Vec<Entry>>, QuorumFailure> {
        match tokio::time::timeout(EXCHANGE_TIMEOUT, self.read_history(query)).await {
            Ok(read) => read,
            Err(_) => Err(self.failure("the history read got no answer in time")),
        }
    }

    /// Records `member`, stamped now, and keeps it alive while this session lives and its heartbeat
    /// lasts ([`Member::ttl`]; a `stopped` one: not alive); drops members not heard from for
    /// [`KEEP_DEAD`]; see [`crate::store::Store::announce`].
    async fn announce(&self, member: &Member) -> Result<(), QuorumFailure> {
        let run = async {
            let session = self.sessions.current(EXCHANGE_TIMEOUT).await?;
            let seen_ms = Utc::now().timestamp_millis();
            let json = serde_json::to_string(member).unwrap_or_default();
            let id = node_name(&member.id);
            let record = format!("{seen_ms} {json}");
            self.put(
                &session,
                &format!("/members/{id}"),
                record.as_bytes(),
                CreateMode::Persistent,
            )
            .await?;
            let alive = format!("/members-alive/{id}");
            let ttl = member.ttl();
            if ttl.is_zero() {
                self.heartbeat_ends(&member.id, None);
                match session.client.delete(&alive, None).await {
                    Ok(()) | Err(zookeeper_client::Error::NoNode) => {}
                    Err(e) => return Err(e.to_string()),
                }
            } else {
                let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
                let until = seen_ms.saturating_add(ttl_ms).to_string();
                self.keep_alive(&session, &alive, until.as_bytes()).await?;
                let ends = BootInstant::now() + ttl;
                if self.heartbeat_ends(&member.id, Some(ends)) {
                    self.reap_member(&member.id, alive, session.client.clone());
                }
            }
            self.drop_dead(&session, seen_ms).await
        };
        match tokio::time::timeout(EXCHANGE_TIMEOUT, run).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(self.failure(why)),
            Err(_) => Err(self.failure("no answer in time")),
        }
    }

    /// Every member announced within [`KEEP_DEAD`], alive or not, sorted by id; see
    /// [`crate::store::Store::members`].
    async fn members(&self) -> Result<Read<Vec<Member>>, QuorumFailure> {
        let session = self
            .sessions
            .current(EXCHANGE_TIMEOUT)
            .await
            .map_err(|why| self.failure(why))?;
        let fail = |why: String| self.failure(why);
        let records = self.read_members(&session).await.map_err(fail)?;
        // Alive is the ephemeral node standing, not a time compared with this host's clock: a reader whose
        // clock is far off (`redcron trigger` on a host at the year 2300) still sees who is alive.
        let alive_ids = self
            .children(&session, "/members-alive")
            .await
            .map_err(fail)?;
        let alive: Vec<&String> = alive_ids.iter().collect();
        let (mut members, mut skipped) = (Vec::new(), Vec::new());
        for (name, seen_ms, json) in records {
            match Member::read(&name, &json) {
                Ok(mut member) => {
                    member.seen_at = DateTime::<Utc>::from_timestamp_millis(seen_ms);
                    member.alive = alive.contains(&&name);
                    members.push(member);
                }
                Err(why) => skipped.push(skip_note("zookeeper", "member", &name, &why)),
            }
        }
        Ok(Read {
            value: membership::merge([members]),
            missing: Vec::new(),
            skipped,
        })
    }
}
