//! The Lua scripts of the protocol, each beside its safety argument.
//!
//! Per job, each node holds these keys (named in [`crate::lock::keys`]), all with the hash tag `{<job>}`:
//! the lease (`…:lease`, or `…:lease:<tick>` with `overlap: allow`), whose value is one attempt of one
//! claimant, with a TTL; the fence counter (`…:fence`), the highest token this node has confirmed; the
//! claim records (`…:claim` for the schedule, and one per trigger request or retry attempt,
//! `…:claim:trigger:<id>`, `…:claim:retry:<tick>:<n>`, see [`crate::lock::series`]), `<tick ms> <lease
//! value>`: the highest tick this node has confirmed in that series, and which attempt of which claimant
//! confirmed it; and the pause (`…:paused`), present while the job is paused. A script runs atomically on
//! its node, so each one is a compare-and-set on that node.
//!
//! **One call, many claims.** Each script takes a batch of claims (of leases, for `RENEW` and `RELEASE`)
//! and applies them one after the other, in the order given, replying with one array of the per-claim
//! replies; a batch of one is the single claim. The keys of the whole call are read with one `MGET` into a
//! per-call cache that every write updates, so a later claim of the batch reads what an earlier one wrote
//! (a job's schedule tick and a trigger of it share the lease and fence keys), and the node's clock is
//! read (`TIME`) at most once per call. So a call is exactly the same scripts run back to back with nothing
//! in between: a script is atomic on its node (no other command runs between its reads and its writes, and
//! no key expires during it), the cache holds what the node holds at every step, and the claims are
//! applied in order. Each claim's checks, in their order, and its reply are those of the single-claim
//! script stated below, and every local invariant below holds after each claim of the batch; G1 and G2
//! (`docs/protocol.md`) rest only on those, so they stand. Reading the clock once means every claim of the
//! call sees the instant of the call's first read instead of one a few microseconds later: what the same
//! scripts would see when run at that instant.
//!
//! Keys of several jobs in one call: **each node must be a standalone Redis server** (or a primary
//! holding every key), not a Redis Cluster shard — redcron follows no `MOVED` redirection anyway, and the
//! hash tags keep a job's own keys together only.
//!
//! Numbers travel as decimal strings, and fence counters and ticks are compared as such (`compare_int`),
//! never as Lua numbers: those are doubles, exact only below 2^53, and a token past it compared as one
//! stood still (`fence + 1 == fence`). Tokens go up to [`crate::lock::keys::MAX_TOKEN`].
//!
//! The protocol as a whole — why a tick is granted at most once, why tokens increase, why nothing is
//! granted after a pause — is argued in `docs/protocol.md`; each script's local invariant is stated beside
//! it.

use std::sync::LazyLock;

use redis::Script;

/// The most claims (leases) in one script call: a node runs a call of 64 in well under a millisecond, so a
/// big batch is cut into calls that other clients' commands can come between, and a call's keys stay far
/// below Lua's limit on `unpack`.
pub const CLAIMS_PER_CALL: usize = 64;

/// The most claims in one attempt (its two rounds): a larger batch goes in attempts one after the other,
/// each sent as soon as the one before it is decided. A round's pipeline is encoded for every node and
/// copied into each connection's write buffer, which keeps the size of the largest message it sent, and
/// each node's replies are read and parsed whole: a worker that claimed a tick's 1,000 jobs in one
/// attempt peaked ~6 MB higher than with this bound (docs/scaling.md, "A sixth look"). The first jobs of a
/// large batch also start sooner (~30 ms after the tick instead of ~150 ms for a lone worker's 1,000),
/// while the last start when they did: spawning 1,000 processes, not claiming them, sets that.
pub const CLAIMS_PER_ATTEMPT: usize = 2 * CLAIMS_PER_CALL;

/// The helpers every claim script shares: [`COMPARE_INT_LUA`], the per-call key cache, the node's clock
/// read once per call, and the checks of a claim — `claimed_by_other`: the claim record against our tick
/// and claimant, the record if another claimant confirmed this tick or any later one here, else `nil`;
/// `refusal`: the refusal of a claim while the job is paused, or once the window of a one-off claim
/// (`not_after`, ms; `0` for the schedule) has ended on the node's clock; and `ahead`: the refusal of a
/// tick more than [`crate::lock::MAX_TICK_AHEAD`] ahead of the node's clock.
///
/// A bare number (a record written before claimants existed) counts as another claimant's; a record that
/// does not parse — or a key of another type in its place, which `MGET` reads as absent — counts as
/// claimed, since nothing proves the tick free.
static CLAIM_HELPERS_LUA: LazyLock<String> = LazyLock::new(|| {
    let ahead_ms = crate::lock::MAX_TICK_AHEAD.as_millis();
    format!("local MAX_AHEAD_MS = {ahead_ms}\n{COMPARE_INT_LUA}{CACHE_LUA}{CLAIM_CHECKS_LUA}")
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

/// The per-call key cache: every key of the call (`KEYS`, each once) read with one `MGET`; `get` answers
/// from the cache, `put` writes through to it and marks the key for the call's one `MSET` (`flush`, at
/// the end: keys without a TTL), `forget` marks a key deleted. Writes with a TTL (`SET … PX`) and
/// deletions go to the node at once and only update the cache. `node_ms`: the node's clock, read at most
/// once per call.
const CACHE_LUA: &str = r#"
local cache = {}
do
  local distinct, seen = {}, {}
  for i = 1, #KEYS do
    if not seen[KEYS[i]] then
      seen[KEYS[i]] = true
      distinct[#distinct + 1] = KEYS[i]
    end
  end
  local values = redis.call('MGET', unpack(distinct))
  for i = 1, #distinct do
    cache[distinct[i]] = values[i]
  end
end
local function get(key)
  local value = cache[key]
  if value == false or value == nil then
    return nil
  end
  return value
end
local dirty, dirty_order = {}, {}
local function put(key, value)
  cache[key] = value
  if not dirty[key] then
    dirty[key] = true
    dirty_order[#dirty_order + 1] = key
  end
end
local function flush()
  if #dirty_order == 0 then
    return
  end
  local pairs_ = {}
  for i = 1, #dirty_order do
    pairs_[#pairs_ + 1] = dirty_order[i]
    pairs_[#pairs_ + 1] = cache[dirty_order[i]]
  end
  redis.call('MSET', unpack(pairs_))
end
local function forget(key)
  cache[key] = false
end
local now_ms
local function node_ms()
  if not now_ms then
    local t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_ms
end
"#;

const CLAIM_CHECKS_LUA: &str = r#"
local function claimant_of(value)
  return string.match(value, '^([^|]*)')
end
-- The pause and the window refuse a claim in both rounds. A claim with a window (not_after > 0: a trigger
-- or a retry) is refused once the window has ended on this node's clock: its claim record expires after
-- that, and must never be needed again.
local function refusal(paused_key, not_after)
  local paused = get(paused_key)
  if paused then
    return {'paused', paused}
  end
  local limit = tonumber(not_after) or 0
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
local function ahead(tick)
  local now = node_ms()
  if (tonumber(tick) or math.huge) > now + MAX_AHEAD_MS then
    return {'ahead', string.format('%d', now)}
  end
  return nil
end
local function claimed_by_other(claim_key, tick, claimant)
  local record = get(claim_key)
  if not record then
    -- MGET reads a key of another type as absent; such a key (written by hand) proves no tick free, like
    -- a record that does not parse. Checked only when the record is missing: once per series.
    if cache[claim_key] == false and redis.call('TYPE', claim_key).ok ~= 'none' then
      return '(not a string)'
    end
    return nil
  end
  local claimed, value = string.match(record, '^(%-?%d+) (.+)$')
  if claimed then
    local order = compare_int(claimed, tick) or 1
    if order > 0 or (order == 0 and claimant_of(value) ~= claimant) then
      return record
    end
    return nil
  end
  local legacy = compare_int(record, tick)
  if legacy == nil or legacy >= 0 then
    return record
  end
  return nil
end
"#;

/// Round 1 of a batch of claims; per claim: take the lease on this node unless the job is paused, the
/// claim's window has ended, its tick is far ahead of the node's clock, another claimant confirmed this
/// tick (or a later one) here or holds the lease, and report the node's fence counter (as stored: decimal
/// text).
///
/// Per claim, four KEYS: lease, fence, claim, paused; five ARGV: value, ttl (ms), tick (ms), claimant, not
/// after (ms, `0`: no window). Returns one reply per claim, in order: `{"ok", fence}`, `{"paused",
/// pause}`, `{"claimed", record}` (`"late"` after the window), `{"ahead", node ms}` or `{"busy", holder,
/// pttl}`.
///
/// Invariant: a node answers `ok` only if the job is not paused here, no other claimant confirmed a tick ≥
/// ours here and the lease is free or held by an earlier attempt of our own claimant (which this one
/// replaces: a retry is idempotent). `SET … PX` starts the TTL on the node's clock at the moment of the
/// write, which is after the caller started its stopwatch, so the caller's validity (`ttl − elapsed −
/// drift`) never outlives the key under the bounded drift rate.
pub static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(&acquire_source()));
fn acquire_source() -> String {
    format!("{}{ACQUIRE_BODY}", *CLAIM_HELPERS_LUA)
}
const ACQUIRE_BODY: &str = r#"
local function acquire(lease, fence, claim, paused, value, ttl, tick, claimant, not_after)
  local refused = refusal(paused, not_after)
  if refused then
    return refused
  end
  -- The claim record before the clock: a claim that finds its tick confirmed by another (every backup
  -- claimant of a routine tick) is answered without reading the node's clock. Both answers refuse and write
  -- nothing; they meet only for a tick far ahead that another claimant confirmed, which only a tick at
  -- least as far ahead can be, and either answer then says why the claim cannot be granted.
  local record = claimed_by_other(claim, tick, claimant)
  if record then
    return {'claimed', record}
  end
  refused = ahead(tick)
  if refused then
    return refused
  end
  local holder = get(lease)
  if holder and holder ~= value and claimant_of(holder) ~= claimant then
    return {'busy', holder, redis.call('PTTL', lease)}
  end
  redis.call('SET', lease, value, 'PX', ttl)
  cache[lease] = value
  return {'ok', get(fence) or '0'}
end
local replies = {}
for i = 0, #KEYS / 4 - 1 do
  local k, a = 4 * i, 5 * i
  replies[i + 1] = acquire(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4],
    ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5])
end
return replies
"#;

/// Round 2 of a batch of claims; per claim: on a node where this attempt still holds the lease, the job is
/// not paused, the claim's window has not ended and no other claimant confirmed this tick or a later one,
/// raise the fence counter to the token and record the tick as confirmed by us. (A tick far ahead of the
/// node's clock was refused in round 1.) The fence counters and claim records of the call are written by
/// one `MSET` at its end (then `PEXPIREAT` on the records that expire): the claims after a write read it
/// from the cache, and nothing else runs before the `MSET`, so this is the single-claim script's `SET`s.
///
/// Per claim, four KEYS: lease, fence, claim, paused; six ARGV: value, token, tick (ms), claimant, not
/// after (ms, `0`: no window), record expiry (ms since the epoch, `0`: never). Returns one reply per
/// claim, in order: `{"ok"}`, `{"lost"}` (the lease is not this attempt's here any more), `{"paused",
/// pause}` or `{"claimed", record}` (`"late"` after the window).
///
/// The pause is checked here too, not only in round 1: a claim whose round 1 ran before the pause reached
/// this node and whose round 2 arrives after it is refused, so once the pause is on a majority no claim is
/// granted whose confirmation had not reached a node of that majority before it (every grant needs a
/// majority of confirmations, and two majorities meet).
///
/// A one-off claim's record (a trigger's, a retry's) expires at its record expiry, after the window: until
/// then the rule below holds on this node, and after it every claim is refused by the window, so the node
/// still confirms at most one claimant per claim instance, ever — as long as its clock does not step back
/// by more than the margin between the two ([`crate::lock::ONE_OFF_RECORD_KEEP`]).
///
/// Invariant — the heart of G1: a node confirms at most one claimant per `(job, series, tick)`, ever. The
/// record's tick only grows, and a record of our tick is overwritten only by the claimant that wrote it.
/// So two claimants can never both be confirmed by a majority, whatever lease keys they hold (workers that
/// disagree on `overlap` hold different ones) and however their messages are delayed. A claimant that
/// retries after an ambiguous round finds its own record and goes on: the round is idempotent.
///
/// The fence counter only grows: it is raised to the token when the token is higher, compared as decimal
/// text (exact at any size; a counter that is no integer — garbage — is overwritten, as `0` would be).
pub static CONFIRM: LazyLock<Script> = LazyLock::new(|| Script::new(&confirm_source()));
fn confirm_source() -> String {
    format!("{}{CONFIRM_BODY}", *CLAIM_HELPERS_LUA)
}
const CONFIRM_BODY: &str = r#"
-- Record key -> its expiry (ms since the epoch, 0: none) as the last claim that wrote it asked.
local expiry, expiry_order = {}, {}
local function confirm(lease, fence, claim, paused, value, token, tick, claimant, not_after, expires)
  if get(lease) ~= value then
    return {'lost'}
  end
  local refused = refusal(paused, not_after)
  if refused then
    return refused
  end
  local record = claimed_by_other(claim, tick, claimant)
  if record then
    return {'claimed', record}
  end
  if (compare_int(get(fence), token) or -1) < 0 then
    put(fence, token)
  end
  put(claim, tick .. ' ' .. value)
  if expiry[claim] == nil then
    expiry_order[#expiry_order + 1] = claim
  end
  expiry[claim] = tonumber(expires) or 0
  return {'ok'}
end
local replies = {}
for i = 0, #KEYS / 4 - 1 do
  local k, a = 4 * i, 6 * i
  replies[i + 1] = confirm(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4],
    ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6])
end
flush()
for i = 1, #expiry_order do
  local claim = expiry_order[i]
  if expiry[claim] > 0 then
    redis.call('PEXPIREAT', claim, expiry[claim])
  end
end
return replies
"#;

/// The watchdog's renewals: per lease, compare-and-`PEXPIRE`, and the lease put back where the node
/// forgot it.
///
/// Per lease, three KEYS: the lease, the fence, the claim record; four ARGV: value, ttl (ms), the lease's
/// token, and its tick (ms) for a scheduled run (empty for a one-off: its record is not put back).
/// Returns per lease, in order, 1 if this node still held our value and it was extended; 2 if it held
/// nothing and its fence was below our token — it forgot our grant (restarted empty, flushed) — and the
/// lease, the fence (raised to our token) and, for a scheduled run, our claim record (unless another
/// claimant confirmed this tick or a later one here since) were put back; else 0. Only 1 counts as held.
///
/// Invariants: only our own value is ever extended. A key is put back only where nothing holds it and the
/// fence is below our token: where our grant never reached (its confirmation went to others) or was
/// forgotten. Where our grant did reach, an expired lease stays expired, so a late renewal never
/// resurrects a lease on a node where another holder may have taken it meanwhile; elsewhere what is put
/// back is what a confirmation of our grant would have written, and it blocks others for one TTL at most.
/// A forgotten lease of a run under way is so back on every node after one renewal, its record and
/// fence with it: a node that restarted empty answers as before once its hold ends (`admission`), and a
/// later claimant of the tick finds it claimed, with a token above ours
/// (`lock::nodes_restarted_empty_one_after_another_never_grant_a_running_tick_again`).
pub static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(&renew_source()));
fn renew_source() -> String {
    format!("{}{RENEW_BODY}", *CLAIM_HELPERS_LUA)
}
const RENEW_BODY: &str = r#"
local function renew(lease, fence, claim, value, ttl, token, tick)
  local held = get(lease)
  if held == value then
    return redis.call('PEXPIRE', lease, ttl)
  end
  if held or (compare_int(get(fence), token) or -1) >= 0 or redis.call('EXISTS', lease) == 1 then
    return 0
  end
  redis.call('SET', lease, value, 'PX', ttl)
  cache[lease] = value
  put(fence, token)
  if tick ~= '' and not claimed_by_other(claim, tick, claimant_of(value)) then
    put(claim, tick .. ' ' .. value)
  end
  return 2
end
local replies = {}
for i = 0, #KEYS / 3 - 1 do
  local k, a = 3 * i, 4 * i
  replies[i + 1] = renew(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3],
    ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
end
flush()
return replies
"#;

/// Release: per lease, compare-and-delete; the leases still ours are deleted with one `DEL`.
///
/// Per lease, one KEY: the lease; one ARGV: value. Returns per lease, in order, 1 if our value was deleted,
/// else 0.
///
/// Invariant: never deletes another holder's lease (a plain `DEL` would, after our lease expired and
/// someone else took it). The fence counter and the claim stay: they are what keeps later acquisitions
/// honest after the lease is gone.
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(&release_source()));
fn release_source() -> String {
    format!("{CACHE_LUA}{RELEASE_BODY}")
}
const RELEASE_BODY: &str = r#"
local replies, gone = {}, {}
for i = 1, #KEYS do
  if get(KEYS[i]) == ARGV[i] then
    gone[#gone + 1] = KEYS[i]
    forget(KEYS[i])
    replies[i] = 1
  else
    replies[i] = 0
  end
end
if #gone > 0 then
  redis.call('DEL', unpack(gone))
end
return replies
"#;

/// A batch of claims (or leases) for one script, cut into calls of at most [`CLAIMS_PER_CALL`]: the
/// `EVALSHA`s of a pipeline, and how many claims each call carries, so that each call's array reply can be
/// unpacked into the per-claim replies ([`super::round::Shape::Calls`]).
pub(super) struct Calls {
    pub(super) pipeline: redis::Pipeline,
    pub(super) sizes: Vec<usize>,
}

impl Calls {
    /// The pipeline, and its shape for a round.
    pub(super) fn for_round(self) -> (redis::Pipeline, super::round::Shape) {
        (self.pipeline, super::round::Shape::Calls(self.sizes))
    }

    /// The calls of `script` for `items`, each its keys and its arguments, in order. With `per_slot`
    /// (a Redis Cluster), a call also ends where the next item's keys hash to another slot: a cluster
    /// master runs only calls whose keys are all on one slot, and each item's keys share its job's
    /// `{job}` hash tag.
    pub(super) fn new<'a, K, A>(
        script: &Script,
        items: impl IntoIterator<Item = (K, A)>,
        per_slot: bool,
    ) -> Calls
    where
        K: AsRef<[String]>,
        A: IntoIterator<Item = &'a str>,
    {
        let mut calls = Calls {
            pipeline: redis::pipe(),
            sizes: Vec::new(),
        };
        let (mut keys, mut args, mut size) = (Vec::<String>::new(), Vec::<&str>::new(), 0);
        let mut call_slot = None;
        for (item_keys, item_args) in items {
            if per_slot {
                let slot = item_keys
                    .as_ref()
                    .first()
                    .map(|key| super::cluster::slot(key.as_bytes()));
                if size > 0 && slot != call_slot {
                    calls.push(script, &mut keys, &mut args, &mut size);
                }
                call_slot = slot;
            }
            keys.extend_from_slice(item_keys.as_ref());
            args.extend(item_args);
            size += 1;
            if size == CLAIMS_PER_CALL {
                calls.push(script, &mut keys, &mut args, &mut size);
            }
        }
        if size > 0 {
            calls.push(script, &mut keys, &mut args, &mut size);
        }
        calls
    }

    fn push(
        &mut self,
        script: &Script,
        keys: &mut Vec<String>,
        args: &mut Vec<&str>,
        size: &mut usize,
    ) {
        self.pipeline
            .add_command(super::round::evalsha(script, keys, args));
        self.sizes.push(*size);
        keys.clear();
        args.clear();
        *size = 0;
    }
}

/// The source of every script, for `SCRIPT LOAD` after a node answered `NOSCRIPT` (it restarted, or its
/// script cache was flushed).
pub fn sources() -> [String; 4] {
    [
        acquire_source(),
        confirm_source(),
        renew_source(),
        release_source(),
    ]
}
