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
//! Numbers travel as decimal strings, and fence counters and ticks are compared as such (`compare_int`),
//! never as Lua numbers: those are doubles, exact only below 2^53, and a token past it compared as one
//! stood still (`fence + 1 == fence`). Tokens go up to [`crate::lock::keys::MAX_TOKEN`].
//!
//! The protocol as a whole — why a tick is granted at most once, why tokens increase, why nothing is
//! granted after a pause — is argued in `docs/protocol.md`; each script's local invariant is stated beside
//! it.

use std::sync::LazyLock;

use redis::Script;

/// Reads the claim record (`KEYS[3]`) against our tick (`ARGV[3]`) and claimant (`ARGV[4]`): returns the
/// record if another claimant confirmed this tick or any later one here, else `nil`. Also `refusal`: the
/// refusal of a claim while the job is paused (`KEYS[4]`), or once the window of a one-off claim
/// (`ARGV[5]`, ms; `0` for the schedule) has ended on the node's clock; and `ahead`: the refusal of a tick
/// more than [`crate::lock::MAX_TICK_AHEAD`] ahead of the node's clock.
///
/// A bare number (a record written before claimants existed) counts as another claimant's; a record that
/// does not parse counts as claimed, since nothing proves the tick free.
static CLAIMED_BY_OTHER_LUA: LazyLock<String> = LazyLock::new(|| {
    let ahead_ms = crate::lock::MAX_TICK_AHEAD.as_millis();
    format!("local MAX_AHEAD_MS = {ahead_ms}\n{COMPARE_INT_LUA}{CLAIMED_BY_OTHER_BODY}")
});

/// `compare_int(a, b)`: -1, 0 or 1 as the integer written `a` (decimal, an optional `-`, leading zeros
/// allowed) is below, equal to or above `b`; `nil` if either is not such an integer. Exact at any size:
/// digit strings of different lengths differ by their length, and equal lengths are compared 15 digits
/// at a time, each chunk below 10^15 < 2^53 and so exact as a Lua number (not as text: Lua compares
/// strings by the locale's collation).
const COMPARE_INT_LUA: &str = r#"
local function int_parts(s)
  if type(s) ~= 'string' then
    return nil
  end
  local sign, digits = string.match(s, '^(%-?)0*(%d+)$')
  if not digits then
    return nil
  end
  return sign == '-' and digits ~= '0', digits
end
local function compare_int(a, b)
  local a_neg, a_digits = int_parts(a)
  local b_neg, b_digits = int_parts(b)
  if a_digits == nil or b_digits == nil then
    return nil
  end
  if a_neg ~= b_neg then
    return a_neg and -1 or 1
  end
  local order = 0
  if #a_digits ~= #b_digits then
    order = #a_digits < #b_digits and -1 or 1
  else
    for i = 1, #a_digits, 15 do
      local x = tonumber(string.sub(a_digits, i, i + 14))
      local y = tonumber(string.sub(b_digits, i, i + 14))
      if x ~= y then
        order = x < y and -1 or 1
        break
      end
    end
  end
  if a_neg then
    return -order
  end
  return order
end
"#;

const CLAIMED_BY_OTHER_BODY: &str = r#"
local function claimant_of(value)
  return string.match(value, '^([^|]*)')
end
local function node_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- The pause (KEYS[4]) and the window refuse a claim in both rounds. A claim with a window (ARGV[5] > 0: a
-- trigger or a retry) is refused once the window has ended on this node's clock: its claim record expires
-- after that, and must never be needed again.
local function refusal()
  local paused = redis.call('GET', KEYS[4])
  if paused then
    return {'paused', paused}
  end
  local limit = tonumber(ARGV[5]) or 0
  if limit > 0 and node_ms() > limit then
    return {'claimed', 'late'}
  end
  return nil
end
-- A tick more than MAX_AHEAD_MS ahead of this node's clock comes from a clock far off, and would push the
-- job's token floor up by as much (and, claimed, make the earlier ticks unclaimable): refused in round 1,
-- saying the node's time (round 2 follows a round 1 that a majority passed). Compared as numbers, and
-- still exactly: the node's time plus the margin is below 2^53, and a tick that is not rounds to a number
-- at least 2^53, above it all the same.
local function ahead()
  local now = node_ms()
  if (tonumber(ARGV[3]) or math.huge) > now + MAX_AHEAD_MS then
    return {'ahead', string.format('%d', now)}
  end
  return nil
end
local function claimed_by_other()
  local record = redis.call('GET', KEYS[3])
  if not record then
    return nil
  end
  local claimed, value = string.match(record, '^(%-?%d+) (.+)$')
  if claimed then
    local order = compare_int(claimed, ARGV[3]) or 1
    if order > 0 or (order == 0 and claimant_of(value) ~= ARGV[4]) then
      return record
    end
    return nil
  end
  local legacy = compare_int(record, ARGV[3])
  if legacy == nil or legacy >= 0 then
    return record
  end
  return nil
end
"#;

/// Round 1 of a claim: take the lease on this node unless the job is paused, the claim's window has ended,
/// its tick is far ahead of the node's clock, another claimant confirmed this tick (or a later one) here or
/// holds the lease, and report the node's fence counter (as stored: decimal text).
///
/// KEYS: lease, fence, claim, paused. ARGV: value, ttl (ms), tick (ms), claimant, not after (ms, `0`: no
/// window).
/// Returns `{"ok", fence}`, `{"paused", pause}`, `{"claimed", record}` (`"late"` after the window),
/// `{"ahead", node ms}` or `{"busy", holder, pttl}`.
///
/// Invariant: a node answers `ok` only if the job is not paused here, no other claimant confirmed a tick ≥
/// ours here and the lease is free or held by an earlier attempt of our own claimant (which this one
/// replaces: a retry is idempotent). `SET … PX` starts the TTL on the node's clock at the moment of the write, which is after
/// the caller started its stopwatch, so the caller's validity (`ttl − elapsed − drift`) never outlives the
/// key under the bounded drift rate.
pub static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(&acquire_source()));
fn acquire_source() -> String {
    format!("{}{ACQUIRE_BODY}", *CLAIMED_BY_OTHER_LUA)
}
const ACQUIRE_BODY: &str = r#"
local refused = refusal() or ahead()
if refused then
  return refused
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
/// counter to the token and record the tick as confirmed by us. (A tick far ahead of the node's clock was
/// refused in round 1.)
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
///
/// The fence counter only grows: it is raised to the token when the token is higher, compared as decimal
/// text (exact at any size; a counter that is no integer — garbage — is overwritten, as `0` would be).
pub static CONFIRM: LazyLock<Script> = LazyLock::new(|| Script::new(&confirm_source()));
fn confirm_source() -> String {
    format!("{}{CONFIRM_BODY}", *CLAIMED_BY_OTHER_LUA)
}
const CONFIRM_BODY: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {'lost'}
end
local refused = refusal()
if refused then
  return refused
end
local record = claimed_by_other()
if record then
  return {'claimed', record}
end
if (compare_int(redis.call('GET', KEYS[2]), ARGV[2]) or -1) < 0 then
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
        acquire_source(),
        confirm_source(),
        RENEW_LUA.to_string(),
        RELEASE_LUA.to_string(),
    ]
}
