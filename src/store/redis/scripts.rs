//! The Lua scripts of the protocol, each beside its safety argument.
//!
//! Per job, each node holds these keys (named in [`crate::lock::keys`]), all with the hash tag `{<job>}` so
//! that a node may be a Redis Cluster shard: the lease (`…:lease`, or `…:lease:<tick>` with `overlap:
//! allow`), whose value is one attempt of one claimant, with a TTL; the fence counter (`…:fence`), the
//! highest token this node has confirmed; the claim records (`…:claim` for the schedule, and one per
//! trigger request or retry attempt, `…:claim:trigger:<id>`, `…:claim:retry:<tick>:<n>`, see
//! [`crate::lock::series`]), `<tick ms> <lease value>`: the highest tick this node has confirmed in that
//! series, and which attempt of which claimant confirmed it; and the pause (`…:paused`), present while the
//! job is paused. A script runs atomically on its node, so each one is a compare-and-set on that node.
//! Numbers travel as decimal strings: tokens stay below 2^53, where Lua's doubles are exact (see
//! [`crate::lock::keys::token_floor`]).
//!
//! The protocol as a whole — why a tick is granted at most once, why tokens increase, why nothing is
//! granted after a pause — is argued in `docs/protocol.md`; each script's local invariant is stated beside
//! it.

use std::sync::LazyLock;

use redis::Script;

/// Reads the claim record (`KEYS[3]`) against our tick (`ARGV[3]`) and claimant (`ARGV[4]`): returns the
/// record if another claimant confirmed this tick or any later one here, else `nil`. Also `paused_or_late`:
/// the refusal of a claim while the job is paused (`KEYS[4]`) or once the window of a one-off claim
/// (`ARGV[5]`, ms; `0` for the schedule) has ended on the node's clock.
///
/// A bare number (a record written before claimants existed) counts as another claimant's; a record that
/// does not parse counts as claimed, since nothing proves the tick free.
const CLAIMED_BY_OTHER_LUA: &str = r#"
local function claimant_of(value)
  return string.match(value, '^([^|]*)')
end
local function node_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- A claim with a window (ARGV[5] > 0: a trigger or a retry) is refused once the window has ended on this
-- node's clock: its claim record expires after that, and must never be needed again.
local function too_late()
  local limit = tonumber(ARGV[5]) or 0
  return limit > 0 and node_ms() > limit
end
-- The pause (KEYS[4]) and the window refuse a claim in both rounds.
local function paused_or_late()
  local paused = redis.call('GET', KEYS[4])
  if paused then
    return {'paused', paused}
  end
  if too_late() then
    return {'claimed', 'late'}
  end
  return nil
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

/// Round 1 of a claim: take the lease on this node unless the job is paused, the claim's window has ended,
/// another claimant confirmed this tick (or a later one) here or holds the lease, and report the node's
/// fence counter.
///
/// KEYS: lease, fence, claim, paused. ARGV: value, ttl (ms), tick (ms), claimant, not after (ms, `0`: no
/// window).
/// Returns `{"ok", fence}`, `{"paused", pause}`, `{"claimed", record}` (`"late"` after the window) or
/// `{"busy", holder, pttl}`.
///
/// Invariant: a node answers `ok` only if the job is not paused here, no other claimant confirmed a tick ≥
/// ours here and the lease is free or held by an earlier attempt of our own claimant (which this one
/// replaces: a retry is idempotent). `SET … PX` starts the TTL on the node's clock at the moment of the write, which is after
/// the caller started its stopwatch, so the caller's validity (`ttl − elapsed − drift`) never outlives the
/// key under the bounded drift rate.
pub static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{CLAIMED_BY_OTHER_LUA}{ACQUIRE_BODY}")));
const ACQUIRE_BODY: &str = r#"
local refusal = paused_or_late()
if refusal then
  return refusal
end
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

/// Round 2 of a claim: on a node where this attempt still holds the lease, the job is not paused, the
/// claim's window has not ended and no other claimant confirmed this tick or a later one, raise the fence
/// counter to the token and record the tick as confirmed by us.
///
/// KEYS: lease, fence, claim, paused. ARGV: value, token, tick (ms), claimant, not after (ms, `0`: no
/// window), record expiry (ms since the epoch, `0`: never).
/// Returns `{"ok"}`, `{"lost"}` (the lease is not this attempt's here any more), `{"paused", pause}` or
/// `{"claimed", record}` (`"late"` after the window).
///
/// The pause is checked here too, not only in round 1: a claim whose round 1 ran before the pause reached
/// this node and whose round 2 arrives after it is refused, so once the pause is on a majority no claim is
/// granted whose confirmation had not reached a node of that majority before it (every grant needs a
/// majority of confirmations, and two majorities meet).
///
/// A one-off claim's record (a trigger's, a retry's) expires at `ARGV[6]`, after the window: until then
/// the rule below holds on this node, and after it every claim is refused by `too_late`, so the node still
/// confirms at most one claimant per claim instance, ever — as long as its clock does not step back by more
/// than the margin between the two ([`crate::lock::ONE_OFF_RECORD_KEEP`]).
///
/// Invariant — the heart of G1: a node confirms at most one claimant per `(job, series, tick)`, ever. The record's
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
local refusal = paused_or_late()
if refusal then
  return refusal
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
local expires = tonumber(ARGV[6]) or 0
if expires > 0 then
  redis.call('PEXPIREAT', KEYS[3], expires)
end
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
