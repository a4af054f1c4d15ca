//! Ghost contenders: the keys a worker that crashed between the two rounds of a claim (or in the middle
//! of the second) leaves on the nodes, written straight into them for an upcoming tick.
//!
//! A real contender that crashed there leaves its lease (with its TTL running) on the nodes its first
//! round reached, and its claim of the tick (with the fence raised to its token) on the nodes its second
//! round reached — at most a minority, or it would have been granted. The ghost's script does what that
//! contender's rounds did, and no more: it takes the lease only where it is free and the tick is not
//! claimed yet, and never lowers a claim. The value has the claim protocol's format
//! (`<claimant>|<attempt>|<tick ms>|<fingerprint>`); a node whose claim is still a plain number (the
//! older format) gets a plain-number claim, as an older contender would have left.
//!
//! The nodes are reached directly (not through the proxy), each on a connection of its own with short
//! timeouts, all at once.

use std::time::Duration;

use super::{now_ms, Cluster};
use crate::chaos::faults::Ghost;
use crate::chaos::timeline::Happening;

/// How long the harness waits on one node for a ghost's write (a node known to be hung or down is not
/// written to: its late answer would land after the record says it did not).
const TIMEOUT: Duration = Duration::from_millis(500);
/// The key prefix of the workers (the default `redis.key_prefix`).
pub const KEY_PREFIX: &str = "redcron";

/// ACQUIRE, and CONFIRM where asked, in one step. KEYS: lease, fence, claim. ARGV: value, ttl (ms), tick
/// (ms), token, confirm (`1` or `0`). Returns `claimed`, `busy`, `leased` or `confirmed`.
const SCRIPT: &str = r#"
local claim = redis.call('GET', KEYS[3])
local claimed, legacy = -1, false
if claim then
  claimed = tonumber(string.match(claim, '^%d+')) or -1
  legacy = not string.find(claim, ' ', 1, true)
end
if claimed >= tonumber(ARGV[3]) then
  return 'claimed'
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 'busy'
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if ARGV[5] ~= '1' then
  return 'leased'
end
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if fence < tonumber(ARGV[4]) then
  redis.call('SET', KEYS[2], ARGV[4])
end
if legacy then
  redis.call('SET', KEYS[3], ARGV[3])
else
  redis.call('SET', KEYS[3], ARGV[3] .. ' ' .. ARGV[1])
end
return 'confirmed'
"#;

/// The lease key of `job` for `tick` (Unix ms): one per job with `overlap: skip`, one per tick with
/// `allow` (as `claim_keys` in `src/store/redis/mod.rs`).
pub fn lease_key(job: &str, skip: bool, tick: i64) -> String {
    if skip {
        format!("{KEY_PREFIX}:{{{job}}}:lease")
    } else {
        format!("{KEY_PREFIX}:{{{job}}}:lease:{tick}")
    }
}

impl Cluster {
    /// Writes ghost `index`'s keys for `tick` and records what each node took (Redis lock nodes only: no
    /// other plan has ghosts).
    pub(super) fn write_ghost(&mut self, index: usize, ghost: Ghost, tick: i64) {
        let super::nodes::Nodes::Redis(nodes) = &self.nodes else {
            return;
        };
        let spec = &crate::chaos::jobs()[ghost.job];
        let key = lease_key(&spec.name, spec.skip[ghost.version], tick);
        let keys = [
            key.clone(),
            format!("{KEY_PREFIX}:{{{}}}:fence", spec.name),
            format!("{KEY_PREFIX}:{{{}}}:claim", spec.name),
        ];
        let claimant = format!("ghost-{index}/{}", uuid::Uuid::new_v4());
        let value = format!(
            "{claimant}|1|{tick}|{:016x}",
            0x0dd_c0ffee_u64 + index as u64
        );
        let token = (tick as u64 * 1000 + 7).to_string();
        let ports: Vec<u16> = (0..nodes.len()).map(|n| nodes.port(n)).collect();
        let leased: Vec<usize> = Ghost::nodes(ghost.leased)
            .into_iter()
            .filter(|&node| nodes.is_serving(node))
            .collect();
        let confirmed = Ghost::nodes(ghost.confirmed);
        let answers: Vec<(usize, String)> = std::thread::scope(|scope| {
            let writes: Vec<_> = leased
                .iter()
                .map(|&node| {
                    let confirm = if confirmed.contains(&node) { "1" } else { "0" };
                    let (keys, value, token) = (&keys, &value, &token);
                    let ttl = ghost.ttl_ms.to_string();
                    let tick = tick.to_string();
                    let port = ports[node];
                    scope.spawn(move || {
                        let args = [value.as_str(), &ttl, &tick, token, confirm];
                        (node, run_script(port, keys, &args))
                    })
                })
                .collect();
            writes
                .into_iter()
                .map(|w| w.join().unwrap_or((usize::MAX, "panicked".into())))
                .collect()
        });
        let took = |what: &str| -> Vec<usize> {
            answers
                .iter()
                .filter(|(_, answer)| answer == what || (what == "leased" && answer == "confirmed"))
                .map(|(node, _)| *node)
                .collect()
        };
        self.timeline.push(
            now_ms(),
            Happening::Ghost {
                job: spec.name.clone(),
                tick,
                key,
                value,
                ttl_ms: ghost.ttl_ms,
                leased: took("leased"),
                confirmed: took("confirmed"),
            },
        );
    }
}

/// Runs the ghost's script on the node at `port`; the script's answer, or the error.
fn run_script(port: u16, keys: &[String; 3], args: &[&str]) -> String {
    let attempt = || -> redis::RedisResult<String> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
        let mut connection = client.get_connection_with_timeout(TIMEOUT)?;
        connection.set_read_timeout(Some(TIMEOUT))?;
        connection.set_write_timeout(Some(TIMEOUT))?;
        redis::cmd("EVAL")
            .arg(SCRIPT)
            .arg(3)
            .arg(keys.as_slice())
            .arg(args)
            .query(&mut connection)
    };
    attempt().unwrap_or_else(|e| format!("error: {e}"))
}
