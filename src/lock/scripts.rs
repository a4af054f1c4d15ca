//! The Lua scripts of the protocol, each beside its safety argument.
//!
//! Per job, each node holds three keys, all with the hash tag `{<job>}` so that a node may be a Redis
//! Cluster shard: `<prefix>:{<job>}:lease` (or `…:lease:<tick>` with `overlap: allow`), the lease value
//! with a TTL; `<prefix>:{<job>}:fence`, the highest fencing token this node has confirmed; and
//! `<prefix>:{<job>}:claim`, the highest tick this node has confirmed as claimed. A script runs atomically
//! on its node, so each one is a compare-and-set on that node. Numbers travel as decimal strings: tokens
//! stay below 2^53, where Lua's doubles are exact (see [`super::redis::token_floor`]).
//!
//! The protocol as a whole — why a granted claim cannot be granted again and why tokens increase — is
//! argued in `docs/protocol.md`; each script's local invariant is stated beside it.

use std::sync::LazyLock;

use redis::Script;

/// Round 1 of a claim: take the lease on this node unless the tick is already claimed or another value
/// holds the lease, and report the node's fence counter.
///
/// KEYS: lease, fence, claim. ARGV: value, ttl (ms), tick (ms).
/// Returns `{"ok", fence}`, `{"claimed", claim}` or `{"busy", holder, pttl}`.
///
/// Invariant: a node answers `ok` only if no tick ≥ this one is claimed on it and the lease is free or
/// already ours (a retried round is idempotent). `SET … PX` starts the TTL on the node's clock at the
/// moment of the write, which is after the caller started its monotonic stopwatch, so the caller's
/// validity (`ttl − elapsed − drift`) never outlives the key.
pub static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
const ACQUIRE_LUA: &str = r#"
local claimed = tonumber(redis.call('GET', KEYS[3]) or '-1')
if claimed >= tonumber(ARGV[3]) then
  return {'claimed', tostring(claimed)}
end
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return {'busy', holder, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {'ok', redis.call('GET', KEYS[2]) or '0'}
"#;

/// Round 2 of a claim: on a node where this lease still holds, raise the fence counter to the token and
/// record the tick as claimed.
///
/// KEYS: lease, fence, claim. ARGV: value, token, tick (ms).
/// Returns `"ok"`, `"lost"` (the lease is not ours here any more) or `"claimed"` (a later tick is).
///
/// Invariant: the fence counter and the claim only ever grow, and they grow only on behalf of the current
/// holder of the lease on this node. A claim equal to our tick while we hold the lease here can only be our
/// own (no two values hold one lease key on one node at once, and a holder checks the claim in round 1), so
/// it is accepted again: the round is idempotent.
pub static CONFIRM: LazyLock<Script> = LazyLock::new(|| Script::new(CONFIRM_LUA));
const CONFIRM_LUA: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 'lost'
end
local claimed = tonumber(redis.call('GET', KEYS[3]) or '-1')
if claimed > tonumber(ARGV[3]) then
  return 'claimed'
end
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if fence < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
redis.call('SET', KEYS[3], ARGV[3])
return 'ok'
"#;

/// The watchdog's renewal: compare-and-`PEXPIRE`.
///
/// KEYS: lease. ARGV: value, ttl (ms). Returns 1 if this node still held our value and was extended, else 0.
///
/// Invariant: only our own value is ever extended. A key that already expired is *not* re-created, so a
/// renewal can never resurrect a lease on a node where another holder may have taken it meanwhile.
pub static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));
const RENEW_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// Release: compare-and-delete.
///
/// KEYS: lease. ARGV: value. Returns 1 if our value was deleted, else 0.
///
/// Invariant: never deletes another holder's lease (a plain `DEL` would, after our lease expired and
/// someone else took it). The fence counter and the claim stay: they are what keeps later acquisitions
/// honest after the lease is gone.
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
const RELEASE_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// The source of every script, for `SCRIPT LOAD` after a node answered `NOSCRIPT` (it restarted, or its
/// script cache was flushed).
pub fn sources() -> [&'static str; 4] {
    [ACQUIRE_LUA, CONFIRM_LUA, RENEW_LUA, RELEASE_LUA]
}
