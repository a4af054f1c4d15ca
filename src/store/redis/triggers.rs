//! Trigger requests on the Redis nodes: `<prefix>:triggers` (a hash, request id → request JSON) and
//! `<prefix>:triggers:expiry` (a sorted set of request ids by when the store drops them). Every write and
//! every read drops the requests past their expiry on the node's own clock, in the same atomic step, so the
//! hash holds only the requests still in (or just past) their window.

use std::sync::LazyLock;

use redis::Script;

use super::history::strings;
use super::round::evalsha;
use super::RedisStore;
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

/// Adds a request. KEYS: requests (hash), expiry (sorted set). ARGV: id, json, expiry (ms since the epoch).
pub static ADD: LazyLock<Script> = LazyLock::new(|| Script::new(&add_source()));
fn add_source() -> String {
    format!(
        "{DROP_EXPIRED_LUA}
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
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

/// The trigger keys: requests, expiry.
fn trigger_keys(prefix: &str) -> [String; 2] {
    let base = format!("{prefix}:triggers");
    [base.clone(), format!("{base}:expiry")]
}

impl Triggers for RedisStore {
    /// Writes `request` to every node; see [`crate::store::Store::request_trigger`].
    async fn request_trigger(&self, request: &TriggerRequest) -> Result<(), QuorumFailure> {
        let keys = trigger_keys(&self.settings.key_prefix);
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

    /// Every request known to a majority's nodes, merged; see [`crate::store::Store::triggers`].
    async fn triggers(&self) -> Result<Read<Vec<TriggerRequest>>, QuorumFailure> {
        let keys = trigger_keys(&self.settings.key_prefix);
        let mut pipeline = redis::pipe();
        pipeline.add_command(evalsha(&LIST, &keys, &[]));
        let answers = self.ask_all(&pipeline).await;
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
        Ok(Read {
            value: trigger::merge(read.value),
            missing: read.missing,
            skipped,
        })
    }

    /// Deletes the request on every node, in the background; see [`crate::store::Store::forget_trigger`].
    fn forget_trigger(&self, id: &str) {
        let [requests, expiry] = trigger_keys(&self.settings.key_prefix);
        let mut pipeline = redis::pipe();
        pipeline.cmd("HDEL").arg(requests).arg(id);
        pipeline.cmd("ZREM").arg(expiry).arg(id);
        self.spawn_everywhere(pipeline);
    }
}
