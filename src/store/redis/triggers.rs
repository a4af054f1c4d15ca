//! Trigger requests on the Redis nodes: `<prefix>:triggers` (a hash, request id → request JSON) and
//! `<prefix>:triggers:expiry` (a sorted set of request ids by when the store drops them); on a Redis
//! Cluster `<prefix>:{triggers}…`, one slot for all three keys. Every write and
//! every read drops the requests past their expiry on the node's own clock, in the same atomic step, so the
//! hash holds only the requests still in (or just past) their window.
//!
//! `<prefix>:triggers:seq` counts the changes: every `ADD` and every deletion of a request increments it.
//! A reader that listed the requests keeps what it read, with each node's count as it stood just before
//! the list, and afterwards asks only for the counts (a plain `GET`, one command per node instead of
//! `LIST`'s four and a reply of every request): as long as a majority of nodes answer with the counts it
//! knows, no request was added to a majority since — a majority written and a majority read meet on a
//! node, whose count would have moved — and it answers from what it kept. Every [`FULL_LIST_EVERY`] it
//! lists in full anyway: that drops the expired requests on the nodes, and it is how a request written by
//! an older `redcron trigger` (an `ADD` without the increment, from before the count existed) is still
//! seen, at most [`FULL_LIST_EVERY`] late — well within the default window of 30 s
//! ([`crate::trigger::DEFAULT_TIMEOUT`]). A node that restarted empty counts from zero again, and could by
//! chance show a count the reader knows: the same bound covers it.

use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use redis::{Script, Value};
use tokio::time::Instant;

use super::history::strings;
use super::round::evalsha;
use super::RedisStore;
use crate::lock::quorum::quorum;
use crate::lock::QuorumFailure;
use crate::store::Triggers;
use crate::store::{skip_note, Read};
use crate::trigger::{self, TriggerRequest};

/// Drops the requests past their expiry (on this node's clock). Shared by the scripts below.
const DROP_EXPIRED_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for i = 1, #gone do
  redis.call('HDEL', KEYS[1], gone[i])
  redis.call('ZREM', KEYS[2], gone[i])
end
"#;

/// How long a reader answers from the requests it listed while the nodes' change counts stand still, at
/// most: then it lists them in full again.
pub(crate) const FULL_LIST_EVERY: Duration = Duration::from_secs(10);

/// Adds a request, and counts the change. KEYS: requests (hash), expiry (sorted set), change count. ARGV:
/// id, json, expiry (ms since the epoch).
pub static ADD: LazyLock<Script> = LazyLock::new(|| Script::new(&add_source()));
fn add_source() -> String {
    format!(
        "{DROP_EXPIRED_LUA}
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('INCR', KEYS[3])
return 1"
    )
}

/// Every request still kept. KEYS: requests, expiry. Returns `{id, JSON, id, JSON, …}`: the ids too, so
/// that a request that cannot be read is named.
pub static LIST: LazyLock<Script> = LazyLock::new(|| Script::new(&list_source()));
fn list_source() -> String {
    format!("{DROP_EXPIRED_LUA}\nreturn redis.call('HGETALL', KEYS[1])")
}

/// The sources of this module's scripts, for `SCRIPT LOAD` after a `NOSCRIPT`.
pub(super) fn sources() -> [String; 2] {
    [add_source(), list_source()]
}

/// The trigger keys: requests, expiry, change count. On a Redis Cluster (`per_slot`) all three carry
/// the hash tag `{triggers}`, so that one script call reaches them on one slot; elsewhere they keep the
/// names every version (an older `redcron trigger` too) writes.
fn trigger_keys(prefix: &str, per_slot: bool) -> [String; 3] {
    let base = match per_slot {
        true => format!("{prefix}:{{triggers}}"),
        false => format!("{prefix}:triggers"),
    };
    [
        base.clone(),
        format!("{base}:expiry"),
        format!("{base}:seq"),
    ]
}

/// What a reader last listed: the merged requests, each node's change count just before (`None`: the node
/// did not answer), and when.
#[derive(Debug)]
pub(super) struct Listed {
    requests: Vec<TriggerRequest>,
    counts: Vec<Option<Value>>,
    at: Instant,
}

/// The reader's last full list, if any ([`RedisStore::triggers`]).
pub(super) type LastList = Mutex<Option<Listed>>;

impl RedisStore {
    /// The requests kept from the last full list, if it is younger than [`FULL_LIST_EVERY`] and a majority
    /// of nodes answer now with the change counts they had then; `None` otherwise (the caller lists in full).
    async fn unchanged(&self, count_key: &str) -> Option<Read<Vec<TriggerRequest>>> {
        let known: Vec<Option<Value>> = {
            let last = self.last_list.lock().ok()?;
            let listed = last.as_ref()?;
            if listed.at.elapsed() >= FULL_LIST_EVERY {
                return None;
            }
            listed.counts.clone()
        };
        let mut pipeline = redis::pipe();
        pipeline.cmd("GET").arg(count_key);
        let answers = self.ask_all(&pipeline).await;
        let mut same = 0;
        let mut missing = Vec::new();
        for ((node, answer), known) in answers.into_iter().zip(&known) {
            match answer.map(|values| values.into_iter().next()) {
                Ok(Some(count)) if !matches!(count, Value::ServerError(_)) => {
                    if known.as_ref() != Some(&count) {
                        return None;
                    }
                    same += 1;
                }
                Ok(_) => missing.push((node, "no change count".to_string())),
                Err(why) => missing.push((node, why)),
            }
        }
        if same < quorum(self.nodes.len()) {
            return None;
        }
        let requests = self.last_list.lock().ok()?.as_ref()?.requests.clone();
        Some(Read {
            value: requests,
            missing,
            skipped: Vec::new(),
        })
    }
}

impl Triggers for RedisStore {
    /// Writes `request` to every node; see [`crate::store::Store::request_trigger`].
    async fn request_trigger(&self, request: &TriggerRequest) -> Result<(), QuorumFailure> {
        let keys = trigger_keys(&self.settings.key_prefix, self.per_slot);
        let expires = request.expires_at_ms().to_string();
        let mut pipeline = redis::pipe();
        pipeline.add_command(evalsha(
            &ADD,
            &keys,
            &[&request.id, &request.to_json(), &expires],
        ));
        let answers = self.ask_all(&pipeline).await;
        self.written_by_majority(answers)
    }

    /// Every request known to a majority's nodes, merged; see [`crate::store::Store::triggers`]. Listed
    /// in full only when a node's change count moved, or every [`FULL_LIST_EVERY`] (see the module).
    async fn triggers(&self) -> Result<Read<Vec<TriggerRequest>>, QuorumFailure> {
        let keys = trigger_keys(&self.settings.key_prefix, self.per_slot);
        if let Some(read) = self.unchanged(&keys[2]).await {
            return Ok(read);
        }
        let at = Instant::now();
        // The count first: a change after it moves the count, one before it is in the list.
        let mut pipeline = redis::pipe();
        pipeline.cmd("GET").arg(&keys[2]);
        pipeline.add_command(evalsha(&LIST, &keys[..2], &[]));
        let mut counts = Vec::new();
        let answers: Vec<(String, Result<Vec<Value>, String>)> = self
            .ask_all(&pipeline)
            .await
            .into_iter()
            .map(|(node, answer)| {
                let answer = answer.and_then(|values| match <[Value; 2]>::try_from(values) {
                    Ok([count, list]) => {
                        counts.push((!matches!(count, Value::ServerError(_))).then_some(count));
                        Ok(vec![list])
                    }
                    Err(values) => Err(format!("{} replies for 2 commands", values.len())),
                });
                if answer.is_err() {
                    counts.push(None);
                }
                (node, answer)
            })
            .collect();
        let mut skipped = Vec::new();
        let read = self.read_majority(answers, |node, value| {
            let mut requests = Vec::new();
            for pair in strings(value)?.chunks(2) {
                let [key, json] = pair else { break };
                let key = key.as_deref().unwrap_or("(not UTF-8)");
                let read = match json {
                    Some(json) => TriggerRequest::read(key, json).map_err(|e| e.to_string()),
                    None => Err("not UTF-8 text".to_string()),
                };
                match read {
                    Ok(request) => requests.push(request),
                    Err(why) => skipped.push(skip_note(node, "trigger request", key, &why)),
                }
            }
            Ok(requests)
        })?;
        skipped.extend(read.skipped);
        let requests = trigger::merge(read.value);
        if let Ok(mut last) = self.last_list.lock() {
            *last = Some(Listed {
                requests: requests.clone(),
                counts,
                at,
            });
        }
        Ok(Read {
            value: requests,
            missing: read.missing,
            skipped,
        })
    }

    /// Deletes the request on every node, in the background, and counts the change; see
    /// [`crate::store::Store::forget_trigger`].
    fn forget_trigger(&self, id: &str) {
        let [requests, expiry, count] = trigger_keys(&self.settings.key_prefix, self.per_slot);
        let mut pipeline = redis::pipe();
        pipeline.cmd("HDEL").arg(requests).arg(id);
        pipeline.cmd("ZREM").arg(expiry).arg(id);
        pipeline.cmd("INCR").arg(count);
        self.spawn_everywhere(pipeline);
    }
}
