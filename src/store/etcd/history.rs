//! Run history and membership on etcd, in the same shape as on the Redis nodes
//! ([`crate::store::redis`]'s `history.rs`).
//!
//! History: one key per entry, `<prefix>:{<job>}:history/<tick>/<entry id>` (the tick as 20 digits that
//! sort as it does), holding the entry's JSON; a later version of the same fact replaces it. A batch is
//! one transaction (per [`MAX_TXN_OPS`] entries). After a write of a tick that checks the bound
//! ([`crate::history::HistorySettings::checks_bound_at`]) its job's ticks are listed, and once there are
//! more than [`crate::history::HistorySettings::most_ticks`] the oldest past `keep_ticks` are deleted with
//! one range delete (a write and its trim are separate requests: a worker that dies between them leaves
//! the excess to the next check). Members: `<prefix>:members/<id>` holds `<seen ms> <JSON>`
//! (stamped with the announcing worker's wall clock: etcd has no clock to read), and
//! `<prefix>:members-alive/<id>` is bound to an etcd lease with the heartbeat's TTL, kept alive by each
//! announcement: a worker is alive exactly while etcd keeps that key. Records older than [`KEEP_DEAD`] are
//! dropped by the next announcement.

use std::time::Duration;

use chrono::{DateTime, Utc};
use etcd_client::{DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::{sortable, EtcdStore};
use crate::history::{Entry, Query};
use crate::lock::QuorumFailure;
use crate::membership::{self, Member, KEEP_DEAD};
use crate::store::Records;
use crate::store::{skip_note, Read};

/// The longest a history or membership request may take: nothing waits on it but the background writer
/// and the CLI (as on Redis).
pub(super) const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);

/// The most operations etcd takes in one transaction (its `--max-txn-ops` default).
pub(super) const MAX_TXN_OPS: usize = 128;

/// The most bytes of entries written in one transaction: etcd refuses a request of more than 1.5 MiB
/// (its `--max-request-bytes` default), and a refused batch would be tried again, and refused, forever.
/// An entry alone is always below it (its output tails are bounded: [`crate::config::MAX_OUTPUT_TAIL`]).
pub(super) const MAX_TXN_BYTES: usize = 1024 * 1024;

/// The most keys of one page of a history read.
const FIRST_PAGE: i64 = 256;

impl EtcdStore {
    /// Deletes the job's entries of every tick older than its newest `keep_ticks`, once it has more than
    /// [`crate::history::HistorySettings::most_ticks`] ([`crate::history::HistorySettings::newest_dropped`]).
    async fn trim(&self, job: &str) -> Result<(), String> {
        let base = self.history_base(job);
        let keys = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Key, SortOrder::Descend);
        let prefix = base.clone();
        let listed = self.get(EXCHANGE_TIMEOUT, prefix, keys).await?;
        let mut ticks: Vec<&[u8]> = listed
            .kvs()
            .iter()
            .filter_map(|kv| kv.key().get(base.len()..base.len() + 20))
            .collect();
        ticks.dedup();
        let Some(newest_dropped) = self.history.newest_dropped(&ticks) else {
            return Ok(());
        };
        // Every key of a tick up to the newest dropped one: `…/<tick>/…` sorts below `…/<tick>0`.
        let end = format!("{base}{}0", String::from_utf8_lossy(newest_dropped));
        let range = DeleteOptions::new().with_range(end);
        self.delete(EXCHANGE_TIMEOUT, base, Some(range))
            .await
            .map(|_| ())
    }

    /// Whether etcd lease `id` (a member's) was still alive and is renewed now.
    async fn renew_member(&self, id: Option<i64>) -> bool {
        match id {
            Some(id) => self.keep_alive(id, EXCHANGE_TIMEOUT).await == Ok(true),
            None => false,
        }
    }

    /// Deletes the records of members last heard from more than [`KEEP_DEAD`] before `now_ms`.
    async fn drop_dead(&self, now_ms: i64) -> Result<(), String> {
        let cutoff =
            now_ms.saturating_sub(i64::try_from(KEEP_DEAD.as_millis()).unwrap_or(i64::MAX));
        let (records, _) = self.read_members().await?;
        let dead: Vec<TxnOp> = records
            .iter()
            .filter(|(_, seen_ms, _)| *seen_ms < cutoff)
            .map(|(key, _, _)| TxnOp::delete(key.as_str(), None))
            .take(MAX_TXN_OPS)
            .collect();
        if dead.is_empty() {
            return Ok(());
        }
        let txn = Txn::new().and_then(dead);
        self.txn(EXCHANGE_TIMEOUT, txn).await.map(|_| ())
    }

    /// The member records (`(key, seen ms, JSON)`) and the ids whose heartbeat key etcd still keeps.
    async fn read_members(&self) -> Result<(Vec<(String, i64, String)>, Vec<String>), String> {
        let records = self.member_key("members", "");
        let alive = self.member_key("members-alive", "");
        let txn = Txn::new().and_then([
            TxnOp::get(records.as_str(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(
                alive.as_str(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            ),
        ]);
        let answer = self.txn(EXCHANGE_TIMEOUT, txn).await?;
        let mut found = (Vec::new(), Vec::new());
        for (index, response) in answer.op_responses().into_iter().enumerate() {
            let etcd_client::TxnOpResponse::Get(get) = response else {
                continue;
            };
            for kv in get.kvs() {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                if index == 1 {
                    found.1.push(key[alive.len()..].to_string());
                    continue;
                }
                let text = String::from_utf8_lossy(kv.value());
                let (seen, json) = text.split_once(' ').unwrap_or(("0", ""));
                found
                    .0
                    .push((key, seen.parse().unwrap_or(0), json.to_string()));
            }
        }
        Ok(found)
    }

    /// The keys of `[from, to)`, newest first, at most `page` of them; `None` when etcd's answer is larger
    /// than the client takes in one message (tonic refuses it as `OutOfRange` before it is decoded).
    async fn history_page(
        &self,
        from: &str,
        to: &str,
        page: i64,
    ) -> Result<Option<etcd_client::GetResponse>, String> {
        let options = GetOptions::new()
            .with_range(to)
            .with_sort(SortTarget::Key, SortOrder::Descend)
            .with_limit(page);
        self.readers
            .call(EXCHANGE_TIMEOUT, |mut c| {
                let (key, options) = (from.to_string(), options.clone());
                async move {
                    match c.get(key, Some(options)).await {
                        Err(etcd_client::Error::GRpcStatus(status))
                            if status.code() == tonic::Code::OutOfRange =>
                        {
                            Ok(None)
                        }
                        answer => answer.map(Some),
                    }
                }
            })
            .await
    }

    /// `<prefix>:{<job>}:history/`: the job's history keys start with it.
    fn history_base(&self, job: &str) -> String {
        format!("{}:{{{job}}}:history/", self.settings.key_prefix)
    }

    fn entry_key(&self, entry: &Entry) -> String {
        format!(
            "{}{}/{}",
            self.history_base(&entry.job),
            sortable(entry.tick),
            entry.id()
        )
    }

    /// `<prefix>:<kind>/<id>` (with an empty id: the prefix of every member's key).
    fn member_key(&self, kind: &str, id: &str) -> String {
        format!("{}:{kind}/{id}", self.settings.key_prefix)
    }

    fn lock_members(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, i64>> {
        // A panic while holding the map leaves it whole (every use is one call on it).
        self.members
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Records for EtcdStore {
    /// Writes `entries`, and keeps each of their jobs within its bound (see the module); see
    /// [`crate::store::Store::record`].
    async fn record(&self, entries: &[Entry]) -> Result<(), QuorumFailure> {
        // Transactions of at most MAX_TXN_OPS entries and MAX_TXN_BYTES, in order.
        let stored: Vec<(String, String)> = entries
            .iter()
            .map(|entry| (self.entry_key(entry), entry.to_json()))
            .collect();
        let mut stored = stored.into_iter().peekable();
        let (mut puts, mut bytes) = (Vec::new(), 0);
        while let Some((key, json)) = stored.next() {
            bytes += key.len() + json.len();
            puts.push(TxnOp::put(key, json, None));
            let full = stored.peek().is_none_or(|(key, json)| {
                puts.len() == MAX_TXN_OPS || bytes + key.len() + json.len() > MAX_TXN_BYTES
            });
            if full {
                let txn = Txn::new().and_then(std::mem::take(&mut puts));
                self.txn(EXCHANGE_TIMEOUT, txn)
                    .await
                    .map_err(|why| self.failure(why))?;
                bytes = 0;
            }
        }
        // A job's ticks are listed only at a write of a tick that checks the bound (as on Redis).
        let mut jobs: Vec<&str> = entries
            .iter()
            .filter(|e| self.history.checks_bound_at(e.tick))
            .map(|e| e.job.as_str())
            .collect();
        jobs.sort_unstable();
        jobs.dedup();
        for job in jobs {
            self.trim(job).await.map_err(|why| self.failure(why))?;
        }
        Ok(())
    }

    /// The entries of `query`, newest first; see [`crate::store::Store::history`]. An entry that does not
    /// parse is skipped, and named in [`Read::skipped`].
    ///
    /// Read in pages of at most [`FIRST_PAGE`] keys, newest first, each starting below the last key of
    /// the one before, until the limit is reached on a whole tick: one answer of the whole range would
    /// pass the client's 4 MiB bound on a gRPC message once a job's entries carry large output tails, and
    /// then the job's history could not be read at all. A page whose answer passes that bound is asked
    /// again at half the keys, down to one (an entry is far below it: [`MAX_TXN_BYTES`] bounds a write).
    ///
    /// Pages go to the readers' clients, in the read's turn among at most [`super::HISTORY_READS`]
    /// reads at once, waited for at most [`EXCHANGE_TIMEOUT`].
    async fn history(&self, query: &Query) -> Result<Read<Vec<Entry>>, QuorumFailure> {
        let Ok(Ok(_turn)) = tokio::time::timeout(EXCHANGE_TIMEOUT, self.reads.acquire()).await
        else {
            return Err(self.failure(format!(
                "no turn among the history reads within {} ms",
                EXCHANGE_TIMEOUT.as_millis()
            )));
        };
        let base = self.history_base(&query.job);
        let from = format!(
            "{base}{}",
            sortable(query.since.map_or(i64::MIN, |t| t.as_millis()))
        );
        let mut to = format!(
            "{base}{}0",
            sortable(query.until.map_or(i64::MAX, |t| t.as_millis()))
        );
        let (mut entries, mut skipped) = (Vec::new(), Vec::new());
        let mut last_tick: Option<Vec<u8>> = None;
        let mut page = FIRST_PAGE;
        'pages: loop {
            let Some(answer) = self
                .history_page(&from, &to, page)
                .await
                .map_err(|why| self.failure(why))?
            else {
                if page == 1 {
                    return Err(self.failure(format!(
                        "a history entry of job {} is larger than the client's bound on an answer",
                        query.job
                    )));
                }
                page /= 2;
                continue;
            };
            let kvs = answer.kvs();
            // Whole ticks up to the limit, so that the merge's order picks the entries of the last tick.
            for kv in kvs {
                let tick = kv.key().get(base.len()..base.len() + 20);
                if entries.len() >= query.limit && last_tick.as_deref() != tick {
                    break 'pages;
                }
                last_tick = tick.map(<[u8]>::to_vec);
                match kv
                    .value_str()
                    .map_err(|e| e.to_string())
                    .and_then(|json| Entry::from_json(json).map_err(|e| e.to_string()))
                {
                    Ok(entry) => entries.push(entry),
                    Err(why) => skipped.push(format!("etcd: history entry skipped: {why}")),
                }
            }
            match kvs.last() {
                // The range's end is exclusive: the next page starts below the last key read.
                Some(last) if answer.more() => {
                    to = String::from_utf8_lossy(last.key()).into_owned()
                }
                _ => break,
            }
        }
        Ok(Read::newest(entries, query.limit, skipped))
    }

    /// Keeps `member`'s announcement, stamped now, alive for [`Member::ttl`] (a `stopped` one: not
    /// alive), and drops members not heard from for [`KEEP_DEAD`]; see [`crate::store::Store::announce`].
    async fn announce(&self, member: &Member) -> Result<(), QuorumFailure> {
        let seen_ms = Utc::now().timestamp_millis();
        let json = serde_json::to_string(member).unwrap_or_default();
        let record = self.member_key("members", &member.id);
        let alive_key = self.member_key("members-alive", &member.id);
        let mut ops = vec![TxnOp::put(record, format!("{seen_ms} {json}"), None)];
        let known = self.lock_members().get(&member.id).copied();
        if member.ttl().is_zero() {
            ops.push(TxnOp::delete(alive_key, None));
            if let Some(id) = self.lock_members().remove(&member.id) {
                self.revoke_later(id);
            }
        } else if !self.renew_member(known).await {
            let ttl = Self::lease_seconds(member.ttl());
            let id = self
                .call(EXCHANGE_TIMEOUT, |mut c| async move {
                    c.lease_grant(ttl, None).await
                })
                .await
                .map_err(|why| self.failure(why))?
                .id();
            self.lock_members().insert(member.id.clone(), id);
            ops.push(TxnOp::put(
                alive_key,
                "",
                Some(PutOptions::new().with_lease(id)),
            ));
        }
        let txn = Txn::new().and_then(ops);
        self.txn(EXCHANGE_TIMEOUT, txn)
            .await
            .map_err(|why| self.failure(why))?;
        self.drop_dead(seen_ms)
            .await
            .map_err(|why| self.failure(why))
    }

    /// Every member announced within [`KEEP_DEAD`], alive or not, sorted by id; see
    /// [`crate::store::Store::members`].
    async fn members(&self) -> Result<Read<Vec<Member>>, QuorumFailure> {
        let (records, alive) = self.read_members().await.map_err(|why| self.failure(why))?;
        let (mut members, mut skipped) = (Vec::new(), Vec::new());
        let prefix = self.member_key("members", "");
        for (key, seen_ms, json) in records {
            let id = key.strip_prefix(prefix.as_str()).unwrap_or(&key);
            match Member::read(id, &json) {
                Ok(mut member) => {
                    member.seen_at = DateTime::<Utc>::from_timestamp_millis(seen_ms);
                    member.alive = alive.contains(&member.id);
                    members.push(member);
                }
                Err(why) => skipped.push(skip_note("etcd", "member", &key, &why)),
            }
        }
        Ok(Read {
            value: membership::merge([members]),
            missing: Vec::new(),
            skipped,
        })
    }
}
