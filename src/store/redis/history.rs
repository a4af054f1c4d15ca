//! Run history and membership on the Redis nodes: written to every node, read back from a majority.
//!
//! Per job, each node keeps three keys with the job's hash tag: `…:{<job>}:history` (a hash, entry id →
//! entry JSON), `…:{<job>}:history:index` (a sorted set of entry ids by tick) and `…:{<job>}:history:ticks`
//! (a sorted set of the ticks that have entries). [`RECORD`] writes a whole batch of entries, of any jobs,
//! in one call per node (per [`RECORD_CHUNK`] entries): the keys of several jobs in one script, which is
//! why the nodes must be standalone Redis servers, not a Redis Cluster (redcron follows no `MOVED`
//! anyway). Now and then ([`crate::history::HistorySettings::checks_bound_at`]) the same atomic step
//! counts a job's ticks and drops the oldest once there are more than
//! [`crate::history::HistorySettings::most_ticks`], down to `keep_ticks`. Members
//! are `…:members` (a hash, worker id → `<seen ms> <JSON>`) and `…:members:expiry` (a sorted set of worker
//! ids by heartbeat expiry; `…:{members}…` on a Redis Cluster, one slot for both); both stamped with the node's own `TIME`, so no worker's clock decides who is
//! alive.
//!
//! None of this is on a claim's path: the worker writes entries after the facts, in the background.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use futures_util::stream::{FuturesUnordered, StreamExt as _};
use redis::{Script, Value};

use super::round::evalsha;
use super::RedisStore;
use crate::history::{self, Entry, Query};
use crate::lock::quorum::quorum;
use crate::lock::QuorumFailure;
use crate::membership::{self, Member, KEEP_DEAD};
use crate::store::Records;
use crate::store::{skip_note, Read};

/// The longest any history or membership exchange with one node may take. Longer than a claim's round:
/// nothing waits on it but the background writer and the CLI.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);

/// Writes entries of several jobs and keeps each job within the bound.
///
/// KEYS: per job, entries (hash), ticks (sorted set), index (sorted set). ARGV: keep, most, then `job,
/// id, tick, check, json` per entry, `job` the 1-based place of its job's keys (in threes). Each entry
/// is an `HSET` and two `ZADD`s; only an entry that adds a tick to the node and carries `check` (`1`)
/// counts its job's ticks (`ZCARD`), and cuts them back to `keep` once there are more than `most`.
/// Returns how many ticks were dropped.
pub static RECORD: LazyLock<Script> = LazyLock::new(|| Script::new(RECORD_LUA));
const RECORD_LUA: &str = r#"
local keep = tonumber(ARGV[1])
local most = tonumber(ARGV[2])
local dropped = 0
for i = 3, #ARGV, 5 do
  local k = (tonumber(ARGV[i]) - 1) * 3
  local entries, ticks, index = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  redis.call('HSET', entries, ARGV[i + 1], ARGV[i + 4])
  redis.call('ZADD', index, ARGV[i + 2], ARGV[i + 1])
  if redis.call('ZADD', ticks, ARGV[i + 2], ARGV[i + 2]) == 1 and ARGV[i + 3] == '1' then
    local excess = redis.call('ZCARD', ticks) - keep
    if excess > most - keep then
      local old = redis.call('ZRANGE', ticks, 0, excess - 1)
      local newest_dropped = old[#old]
      local ids = redis.call('ZRANGEBYSCORE', index, '-inf', newest_dropped)
      for j = 1, #ids, 500 do
        redis.call('HDEL', entries, unpack(ids, j, math.min(j + 499, #ids)))
      end
      redis.call('ZREMRANGEBYSCORE', index, '-inf', newest_dropped)
      redis.call('ZREMRANGEBYRANK', ticks, 0, excess - 1)
      dropped = dropped + excess
    end
  end
end
return dropped
"#;

/// The most entries written by one call of [`RECORD`]: a larger batch takes several calls (in one
/// pipeline), so that no call holds a node for long.
const RECORD_CHUNK: usize = 100;

/// The most entries in one pipeline to a node: a larger batch (the recorder's gathers up to 1,000, a
/// tick's runs) goes in pipelines one after the other, for the reason claims do
/// ([`super::scripts::CLAIMS_PER_ATTEMPT`]): each connection's write buffer keeps the size of the largest
/// message it sent. With claims bounded, a tick's 1,000 entries in one message were the largest: the
/// peak of a worker that ran 1,000 jobs a tick was ~1 MB lower with this bound (docs/scaling.md, "A sixth
/// look").
const RECORDS_PER_PIPELINE: usize = 2 * RECORD_CHUNK;

/// Reads one page of a job's entries with ticks in `[ARGV[1], ARGV[2]]`, newest first: of the `ARGV[4]`
/// ids from place `ARGV[3]` on, those whose entries fit in `ARGV[5]` bytes (at least one).
///
/// KEYS: entries, index. Returns how many ids the page went through, `1` if they were the range's last
/// (else `0`), then their entries' JSON (an id whose entry is gone reads as `nil`, skipped). A page is
/// bounded so that no call holds the node for long: a node runs one script at a time, and a claim or
/// renewal waits for it ([`PAGE_BYTES`]).
pub static HISTORY: LazyLock<Script> = LazyLock::new(|| Script::new(HISTORY_LUA));
const HISTORY_LUA: &str = r#"
local wanted = tonumber(ARGV[4])
local ids = redis.call('ZREVRANGEBYSCORE', KEYS[2], ARGV[2], ARGV[1], 'LIMIT', tonumber(ARGV[3]), wanted)
local budget = tonumber(ARGV[5])
local page = {'0', '0'}
local bytes = 0
for i = 1, #ids do
  if i > 1 and bytes >= budget then
    break
  end
  local json = redis.call('HGET', KEYS[1], ids[i])
  if json then
    bytes = bytes + #json
  end
  page[#page + 1] = json
end
local went = #page - 2
page[1] = tostring(went)
if went == #ids and #ids < wanted then
  page[2] = '1'
end
return page
"#;

/// The most bytes of entries one page of a history read carries (unless its first entry alone is
/// more): about a millisecond of a node's time, so a dashboard reading a job's megabytes of output tails
/// delays a claim or a renewal on that node by no more.
const PAGE_BYTES: usize = 256 * 1024;

/// The most ids one page of a history read goes through.
const PAGE_IDS: usize = 1_000;

/// Announces a worker: `<now ms> <json>` under its id, heartbeat expiry now + ttl; drops members dead for
/// longer than `keep_dead`.
///
/// KEYS: members (hash), expiry (sorted set). ARGV: id, json, ttl ms, keep_dead ms.
pub static ANNOUNCE: LazyLock<Script> = LazyLock::new(|| Script::new(ANNOUNCE_LUA));
const ANNOUNCE_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', now) .. ' ' .. ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[4]))
for i = 1, #dead do
  redis.call('HDEL', KEYS[1], dead[i])
  redis.call('ZREM', KEYS[2], dead[i])
end
return 1
"#;

/// Reads every member: `{now ms, id, value, expiry ms, id, value, expiry ms, …}` on the node's clock.
///
/// KEYS: members, expiry.
pub static MEMBERS: LazyLock<Script> = LazyLock::new(|| Script::new(MEMBERS_LUA));
const MEMBERS_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {string.format('%d', now)}
local all = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
if #all == 0 then
  return out
end
-- One HMGET for every member (in chunks, far below Lua's limit on unpack), not an HGET each.
local ids = {}
for i = 1, #all, 2 do
  ids[#ids + 1] = all[i]
end
local values = {}
for j = 1, #ids, 500 do
  local part = redis.call('HMGET', KEYS[1], unpack(ids, j, math.min(j + 499, #ids)))
  for k = 1, #part do
    values[#values + 1] = part[k]
  end
end
for i = 1, #ids do
  if values[i] then
    table.insert(out, ids[i])
    table.insert(out, values[i])
    table.insert(out, all[2 * i])
  end
end
return out
"#;

/// The sources of this module's scripts, for `SCRIPT LOAD` after a `NOSCRIPT`.
pub(super) fn sources() -> [&'static str; 4] {
    [RECORD_LUA, HISTORY_LUA, ANNOUNCE_LUA, MEMBERS_LUA]
}

/// A job's history keys: entries, ticks, index.
fn history_keys(prefix: &str, job: &str) -> [String; 3] {
    let base = format!("{prefix}:{{{job}}}:history");
    [
        base.clone(),
        format!("{base}:ticks"),
        format!("{base}:index"),
    ]
}

/// The keys and arguments of one [`RECORD`] call writing `entries`: each job's three keys once, in the
/// order its first entry comes.
fn record_call(
    prefix: &str,
    settings: &history::HistorySettings,
    entries: &[&Entry],
) -> (Vec<String>, Vec<String>) {
    let mut jobs: Vec<&str> = Vec::new();
    let mut args = vec![
        settings.keep_ticks.to_string(),
        settings.most_ticks().to_string(),
    ];
    for entry in entries {
        let place = match jobs.iter().position(|job| *job == entry.job) {
            Some(place) => place,
            None => {
                jobs.push(&entry.job);
                jobs.len() - 1
            }
        };
        let check = if settings.checks_bound_at(entry.tick) {
            "1"
        } else {
            "0"
        };
        args.extend([
            (place + 1).to_string(),
            entry.id(),
            entry.tick.to_string(),
            check.to_string(),
            entry.to_json(),
        ]);
    }
    let keys = jobs
        .into_iter()
        .flat_map(|job| history_keys(prefix, job))
        .collect();
    (keys, args)
}

/// Why a node's answer to a write failed: its error, or the first command it refused; `None` if it ran
/// every command.
fn failure(answer: &Result<Vec<Value>, String>) -> Option<String> {
    match answer {
        Ok(values) => values.iter().find_map(|v| match v {
            Value::ServerError(e) => Some(super::reply::describe(e)),
            _ => None,
        }),
        Err(why) => Some(why.clone()),
    }
}

/// The membership keys: members, expiry. On a Redis Cluster (`per_slot`) both carry the hash tag
/// `{members}`, so that one script call reaches both on one slot; elsewhere they keep the names every
/// version has written.
fn member_keys(prefix: &str, per_slot: bool) -> [String; 2] {
    let base = match per_slot {
        true => format!("{prefix}:{{members}}"),
        false => format!("{prefix}:members"),
    };
    [base.clone(), format!("{base}:expiry")]
}

impl RedisStore {
    /// Sends `pipeline` to every node at once and waits for every answer, each bounded by
    /// [`EXCHANGE_TIMEOUT`]: `(node label, its values or why it failed)`.
    pub(super) async fn ask_all(
        &self,
        pipeline: &redis::Pipeline,
    ) -> Vec<(String, Result<Vec<Value>, String>)> {
        let timeout = EXCHANGE_TIMEOUT.max(self.settings.node_timeout);
        join_all(
            self.nodes.iter().map(|node| async move {
                (node.label.clone(), node.eval(pipeline, timeout).await)
            }),
        )
        .await
    }

    /// Runs a history read (`read`, given a node and the read's deadline) on every node at once, on the
    /// readers' connections, in its turn among at most [`super::HISTORY_READS`] reads at once, all
    /// within the exchange's timeout: a read of megabytes never queues a claim or a renewal behind it on
    /// a connection, and many reads at once (a busy dashboard) wait for each other rather than take
    /// every node's time.
    async fn ask_readers<'a, F, Fut>(&'a self, read: F) -> Vec<(String, Result<Vec<Value>, String>)>
    where
        F: Fn(&'a super::node::Node, tokio::time::Instant) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<Value>, String>>,
    {
        let timeout = EXCHANGE_TIMEOUT.max(self.settings.node_timeout);
        let deadline = tokio::time::Instant::now() + timeout;
        let Ok(Ok(_turn)) = tokio::time::timeout_at(deadline, self.reads.acquire()).await else {
            let busy = format!(
                "no turn among the history reads within {} ms",
                timeout.as_millis()
            );
            return self
                .readers
                .iter()
                .map(|node| (node.label.clone(), Err(busy.clone())))
                .collect();
        };
        join_all(
            self.readers
                .iter()
                .map(|node| async { (node.label.clone(), read(node, deadline).await) }),
        )
        .await
    }

    /// Sends `pipeline` to every node at once, as [`RedisStore::ask_all`] does, but returns as soon as a
    /// majority of the configured nodes ran every command without an error; the other nodes' answers are
    /// awaited in the background (each bounded by [`EXCHANGE_TIMEOUT`]). When no majority has succeeded
    /// by then, every node's answer is waited for, so a failure names every node that failed.
    ///
    /// So a write that a majority takes at once is not held up by a hung minority: with a node that does
    /// not answer, a batch of several pipelines written one after the other costs no exchange timeout per
    /// pipeline.
    pub(super) async fn ask_until_majority(
        &self,
        pipeline: redis::Pipeline,
    ) -> Vec<(String, Result<Vec<Value>, String>)> {
        let timeout = EXCHANGE_TIMEOUT.max(self.settings.node_timeout);
        let pipeline = Arc::new(pipeline);
        // Each request owns what it needs, so that the stragglers can move to a background task.
        let mut pending: FuturesUnordered<_> = (0..self.nodes.len())
            .map(|index| {
                let (nodes, pipeline) = (Arc::clone(&self.nodes), Arc::clone(&pipeline));
                async move {
                    let node = &nodes[index];
                    (node.label.clone(), node.eval(&pipeline, timeout).await)
                }
            })
            .collect();
        let (needed, mut succeeded) = (quorum(self.nodes.len()), 0);
        let mut answers = Vec::with_capacity(self.nodes.len());
        while let Some((node, answer)) = pending.next().await {
            if failure(&answer).is_none() {
                succeeded += 1;
            }
            answers.push((node, answer));
            if succeeded >= needed {
                break;
            }
        }
        if !pending.is_empty() {
            tokio::spawn(async move { while pending.next().await.is_some() {} });
        }
        answers
    }

    /// `Ok` if a majority of the configured nodes ran every command without an error.
    pub(super) fn written_by_majority(
        &self,
        answers: Vec<(String, Result<Vec<Value>, String>)>,
    ) -> Result<(), QuorumFailure> {
        let mut failures = Vec::new();
        for (node, answer) in answers {
            if let Some(why) = failure(&answer) {
                failures.push((node, why));
            }
        }
        let configured = self.nodes.len();
        let granted = configured - failures.len();
        if granted >= quorum(configured) {
            return Ok(());
        }
        Err(QuorumFailure {
            unheard: Vec::new(),
            refused: Vec::new(),
            configured,
            needed: quorum(configured),
            granted,
            failures,
        })
    }

    /// Parses the one reply of each node that answered with `parse`; fails unless a majority of the
    /// configured nodes gave a readable reply. Nodes that failed are named in `missing`.
    pub(super) fn read_majority<T>(
        &self,
        answers: Vec<(String, Result<Vec<Value>, String>)>,
        mut parse: impl FnMut(&str, Value) -> Result<T, String>,
    ) -> Result<Read<Vec<T>>, QuorumFailure> {
        let mut values = Vec::new();
        let mut missing = Vec::new();
        for (node, answer) in answers {
            let reply = answer.and_then(|values| {
                values
                    .into_iter()
                    .next()
                    .ok_or_else(|| "no reply".to_string())
            });
            match reply.and_then(|value| parse(&node, value)) {
                Ok(value) => values.push(value),
                Err(why) => missing.push((node, why)),
            }
        }
        let configured = self.nodes.len();
        if values.len() < quorum(configured) {
            return Err(QuorumFailure {
                unheard: Vec::new(),
                refused: Vec::new(),
                configured,
                needed: quorum(configured),
                granted: values.len(),
                failures: missing,
            });
        }
        Ok(Read {
            value: values,
            missing,
            skipped: Vec::new(),
        })
    }
}

impl Records for RedisStore {
    /// Writes `entries` to every node: one script call per [`RECORD_CHUNK`] entries, whatever their
    /// jobs, in pipelines of at most [`RECORDS_PER_PIPELINE`] entries one after the other; see
    /// [`crate::store::Store::record`]. Each pipeline is done once a majority has taken it
    /// ([`RedisStore::ask_until_majority`]), so a hung node costs no timeout per pipeline; the rest of the
    /// nodes take it in the background. Fails at the first pipeline a majority did not take: the caller
    /// writes the whole batch again, and an entry written twice is kept once (one per job and id).
    async fn record(&self, entries: &[Entry]) -> Result<(), QuorumFailure> {
        for message in entries.chunks(RECORDS_PER_PIPELINE) {
            let mut pipeline = redis::pipe();
            // On a Redis Cluster a call's keys stay on one slot: one call per job's slot.
            let mut by_call: Vec<Vec<&Entry>> = Vec::new();
            for entry in message {
                let slot = |e: &Entry| super::cluster::slot(e.job.as_bytes());
                let call = by_call.iter_mut().find(|call| {
                    call.len() < RECORD_CHUNK && (!self.per_slot || slot(call[0]) == slot(entry))
                });
                match call {
                    Some(call) => call.push(entry),
                    None => by_call.push(vec![entry]),
                }
            }
            for chunk in &by_call {
                let (keys, args) = record_call(&self.settings.key_prefix, &self.history, chunk);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                pipeline.add_command(evalsha(&RECORD, &keys, &args));
            }
            let answers = self.ask_until_majority(pipeline).await;
            self.written_by_majority(answers)?;
        }
        Ok(())
    }

    /// The entries of `query`, read from every node that answers and merged; see
    /// [`crate::store::Store::history`].
    async fn history(&self, query: &Query) -> Result<Read<Vec<Entry>>, QuorumFailure> {
        let since = query
            .since
            .map_or("-inf".to_string(), |t| t.as_millis().to_string());
        let until = query
            .until
            .map_or("+inf".to_string(), |t| t.as_millis().to_string());
        let [entries, _, index] = history_keys(&self.settings.key_prefix, &query.job);
        let keys = [entries, index];
        let answers = self
            .ask_readers(|node, deadline| {
                read_pages(node, &keys, [&since, &until], query.limit, deadline)
            })
            .await;
        let mut skipped = Vec::new();
        let read = self.read_majority(answers, |node, value| {
            let mut entries = Vec::new();
            for item in strings(value)? {
                let Some(json) = item else { continue };
                match Entry::from_json(&json) {
                    Ok(entry) => entries.push(entry),
                    Err(why) => skipped.push(format!("{node}: history entry skipped: {why}")),
                }
            }
            Ok(entries)
        })?;
        let mut merged = history::merge(read.value);
        merged.truncate(query.limit);
        skipped.extend(read.skipped);
        Ok(Read {
            value: merged,
            missing: read.missing,
            skipped,
        })
    }

    /// Announces `member` on every node; see [`crate::store::Store::announce`].
    async fn announce(&self, member: &Member) -> Result<(), QuorumFailure> {
        let keys = member_keys(&self.settings.key_prefix, self.per_slot);
        let json = serde_json::to_string(member).unwrap_or_default();
        let (ttl, keep) = (
            member.ttl().as_millis().to_string(),
            KEEP_DEAD.as_millis().to_string(),
        );
        let mut pipeline = redis::pipe();
        pipeline.add_command(evalsha(&ANNOUNCE, &keys, &[&member.id, &json, &ttl, &keep]));
        let answers = self.ask_all(&pipeline).await;
        self.written_by_majority(answers)
    }

    /// Every member known to a majority, merged; see [`crate::store::Store::members`].
    async fn members(&self) -> Result<Read<Vec<Member>>, QuorumFailure> {
        let keys = member_keys(&self.settings.key_prefix, self.per_slot);
        let mut pipeline = redis::pipe();
        pipeline.add_command(evalsha(&MEMBERS, &keys, &[]));
        let answers = self.ask_all(&pipeline).await;
        let mut skipped = Vec::new();
        let read = self.read_majority(answers, |node, value| {
            let items = strings(value)?;
            let now: i64 = items
                .first()
                .and_then(|n| n.as_deref()?.parse().ok())
                .ok_or("no time in the reply")?;
            let mut members = Vec::new();
            for triple in items[1..].chunks(3) {
                let [id, stored, expiry] = triple else { break };
                let id = id.as_deref().unwrap_or("(not UTF-8)");
                let parsed = match (stored, expiry) {
                    (Some(stored), Some(expiry)) => parse_member(id, stored, expiry, now),
                    _ => Err("not UTF-8 text".to_string()),
                };
                match parsed {
                    Ok(member) => members.push(member),
                    Err(why) => skipped.push(skip_note(node, "member", id, &why)),
                }
            }
            Ok(members)
        })?;
        skipped.extend(read.skipped);
        Ok(Read {
            value: membership::merge(read.value),
            missing: read.missing,
            skipped,
        })
    }
}

/// A job's entries on `node` (KEYS `keys`, ticks in `window`), newest first, at most `limit`, read in
/// pages of [`HISTORY`] until `deadline`: one reply, an array of the entries' JSON, as one call of the
/// whole range would give. A page starts at the place where the one before it ended; an entry written
/// meanwhile moves the later ones one place down, so one may be read twice (the merge keeps it once),
/// and a trim drops only entries older than any read yet: none is missed.
async fn read_pages(
    node: &super::node::Node,
    keys: &[String; 2],
    window: [&str; 2],
    limit: usize,
    deadline: tokio::time::Instant,
) -> Result<Vec<Value>, String> {
    let (mut entries, mut place) = (Vec::new(), 0);
    while place < limit {
        let (from, wanted) = (place.to_string(), (limit - place).min(PAGE_IDS).to_string());
        let budget = PAGE_BYTES.to_string();
        let mut pipeline = redis::pipe();
        pipeline.add_command(evalsha(
            &HISTORY,
            keys,
            &[window[0], window[1], &from, &wanted, &budget],
        ));
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let reply = node.eval(&pipeline, left).await?.into_iter().next();
        let Some(Value::Array(mut page)) = reply else {
            return Err(format!("unexpected reply {reply:?}"));
        };
        let head: Vec<Value> = page.drain(..2.min(page.len())).collect();
        let number = |value: Option<&Value>| match value {
            Some(Value::BulkString(bytes)) => {
                std::str::from_utf8(bytes).ok()?.parse::<usize>().ok()
            }
            _ => None,
        };
        let (Some(went), Some(last)) = (number(head.first()), number(head.get(1))) else {
            return Err(format!("unexpected page head {head:?}"));
        };
        entries.extend(page);
        place += went;
        if went == 0 || last == 1 {
            break;
        }
    }
    Ok(vec![Value::Array(entries)])
}

/// An array reply as optional strings (`nil` items as `None`); a server error or another shape fails.
pub(super) fn strings(value: Value) -> Result<Vec<Option<String>>, String> {
    match value {
        Value::Array(items) => Ok(items
            .into_iter()
            .map(|item| match item {
                Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
                Value::SimpleString(s) => Some(s),
                Value::Int(n) => Some(n.to_string()),
                _ => None,
            })
            .collect()),
        Value::ServerError(e) => Err(super::reply::describe(&e)),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// One stored member (`<seen ms> <json>`) under `id`, with its expiry, read at `now` on the node's clock.
fn parse_member(id: &str, stored: &str, expiry: &str, now: i64) -> Result<Member, String> {
    let shown = |text: &str| crate::logging::shorten(&format!("{text:?}"), 60);
    let (seen, json) = stored
        .split_once(' ')
        .ok_or_else(|| format!("malformed value {}", shown(stored)))?;
    let seen: i64 = seen
        .parse()
        .map_err(|_| format!("malformed time {}", shown(seen)))?;
    let expiry: f64 = expiry
        .parse()
        .map_err(|_| format!("malformed expiry {}", shown(expiry)))?;
    let mut member = Member::read(id, json)?;
    member.seen_at = DateTime::<Utc>::from_timestamp_millis(seen);
    member.alive = expiry > now as f64;
    Ok(member)
}
