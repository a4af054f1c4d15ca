//! The Lua scripts of the protocol, each beside its safety argument.
//!
//! Per job, each node holds three keys (named in [`crate::lock::keys`]), all with the hash tag `{<job>}` so that
//! a node may be a Redis Cluster shard: the lease (`…:lease`, or `…:lease:<tick>` with `overlap: allow`),
//! whose value is one attempt of one claimant, with a TTL; the fence counter (`…:fence`), the highest token
//! this node has confirmed; and the claim record (`…:claim`), `<tick ms> <lease value>`: the highest tick
//! this node has confirmed, and which attempt of which claimant confirmed it. A script runs atomically on
//! its node, so each one is a compare-and-set on that node. Numbers travel as decimal strings: tokens stay
//! below 2^53, where Lua's doubles are exact (see [`crate::lock::keys::token_floor`]).
//!
//! The protocol as a whole — why a tick is granted at most once, why tokens increase — is argued in
//! `docs/protocol.md`; each script's local invariant is stated beside it.

use std::sync::LazyLock;

use redis::Script;

/// Reads the claim record (`KEYS[3]`) against our tick (`ARGV[3]`) and claimant (`ARGV[4]`): returns the
/// record if another claimant confirmed this tick or any later one here, else `nil`.
///
/// A bare number (a record written before claimants existed) counts as another claimant's; a record that
/// does not parse counts as claimed, since nothing proves the tick free.
const CLAIMED_BY_OTHER_LUA: &str = r#"
local function claimant_of(value)
  return string.match(value, '^([^|]*)')
end
local function claimed_by_other()
  local record = redis.call('GET', KEYS[3])
  if not record then
    return nil
  end
  local tick = tonumber(ARGV[3])
  local claimed, value = string.match(record, '^(%-?%d+) (.+)$')
  if claimed then
    claimed = tonumber(claimed)
    if claimed > tick or (claimed == tick and claimant_of(value) ~= ARGV[4]) then
      return record
    end
    return nil
  end
  local legacy = tonumber(record)
  if legacy == nil or legacy >= tick then
    return record
  end
  return nil
end
"#;

/// Round 1 of a claim: take the lease on this node unless another claimant confirmed this tick (or a later
/// one) here or holds the lease, and report the node's fence counter.
///
/// KEYS: lease, fence, claim. ARGV: value, ttl (ms), tick (ms), claimant.
/// Returns `{"ok", fence}`, `{"claimed", record}` or `{"busy", holder, pttl}`.
///
/// Invariant: a node answers `ok` only if no other claimant confirmed a tick ≥ ours here and the lease is
/// free or held by an earlier attempt of our own claimant (which this one replaces: a retry is
/// idempotent). `SET … PX` starts the TTL on the node's clock at the moment of the write, which is after
/// the caller started its stopwatch, so the caller's validity (`ttl − elapsed − drift`) never outlives the
/// key under the bounded drift rate.
pub static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{CLAIMED_BY_OTHER_LUA}{ACQUIRE_BODY}")));
const ACQUIRE_BODY: &str = r#"
local record = claimed_by_other()
if record then
  return {'claimed', record}
end
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] and claimant_of(holder) ~= ARGV[4] then
  return {'busy', holder, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {'ok', redis.call('GET', KEYS[2]) or '0'}
"#;

/// Round 2 of a claim: on a node where this attempt still holds the lease and no other claimant confirmed
/// this tick or a later one, raise the fence counter to the token and record the tick as confirmed by us.
///
/// KEYS: lease, fence, claim. ARGV: value, token, tick (ms), claimant.
/// Returns `{"ok"}`, `{"lost"}` (the lease is not this attempt's here any more) or `{"claimed", record}`.
///
/// Invariant — the heart of G1: a node confirms at most one claimant per `(job, tick)`, ever. The record's
/// tick only grows, and a record of our tick is overwritten only by the claimant that wrote it. So two
/// claimants can never both be confirmed by a majority, whatever lease keys they hold (workers that
/// disagree on `overlap` hold different ones) and however their messages are delayed. A claimant that
/// retries after an ambiguous round finds its own record and goes on: the round is idempotent.
pub static CONFIRM: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{CLAIMED_BY_OTHER_LUA}{CONFIRM_BODY}")));
const CONFIRM_BODY: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {'lost'}
end
local record = claimed_by_other()
if record then
  return {'claimed', record}
end
local fence = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if fence < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
redis.call('SET', KEYS[3], ARGV[3] .. ' ' .. ARGV[1])
return {'ok'}
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
pub fn sources() -> [String; 4] {
    [
        format!("{CLAIMED_BY_OTHER_LUA}{ACQUIRE_BODY}"),
        format!("{CLAIMED_BY_OTHER_LUA}{CONFIRM_BODY}"),
        RENEW_LUA.to_string(),
        RELEASE_LUA.to_string(),
    ]
}
