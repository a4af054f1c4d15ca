//! Pauses on the Redis nodes: `…:{<job>}:paused` on every node, written and deleted by `redcron pause` and
//! `redcron resume`, read by both rounds of every claim of the job (`ACQUIRE`, `CONFIRM`) and by
//! `redcron status`. A pause with an end carries it as the key's TTL, so each node drops it by itself.
//! The write is the `PAUSE` script, so that a shorter pause never replaces a longer one in force by
//! accident ([`crate::lock::pause`]).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use chrono::Utc;
use redis::{Script, Value};

use super::history::strings;
use super::round::evalsha;
use super::RedisStore;
use crate::lock::keys::pause_key;
use crate::lock::{InForce, Pause, PauseOutcome, PauseRead, QuorumFailure};
use crate::store::Pauses;
use crate::store::Read;

/// Writes a pause unless a pause in force outlasts it, or it has ended: [`Pause::decide`], atomically on
/// the node.
///
/// KEYS: paused. ARGV: value, until (ms, `0`: no end), now (ms, the writer's clock: the clock that set
/// `until`), `keep` or `replace` ([`InForce::as_arg`]).
/// Returns `{"paused"}`, `{"kept", value in force}` or `{"over"}`.
///
/// Invariant: with `keep`, a pause in force that outlasts the new one — without end while the new one has
/// one, or ending later than it and than `now` — is left as it is, value and TTL: the check and the write
/// are one step on the node, so no other write comes between. A stored value that does not parse counts
/// as a pause without end, as [`Pause::from_value`] reads it. A pause whose end is not after `now` is never
/// written (it would stop nothing, and must not replace anything); the TTL of one that is written is what
/// it has left at `now`, so it ends by itself on every node.
pub static PAUSE: LazyLock<Script> = LazyLock::new(|| Script::new(PAUSE_LUA));
const PAUSE_LUA: &str = r#"
local until_ms = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
if ARGV[4] ~= 'replace' and until_ms > 0 then
  local current = redis.call('GET', KEYS[1])
  if current then
    local digits = string.match(current, '^(%d+)|[^|]*|')
    local current_until = digits and tonumber(digits) or 0
    if current_until == 0 or (current_until > now and current_until > until_ms) then
      return {'kept', current}
    end
  end
end
if until_ms > 0 then
  if until_ms <= now then
    return {'over'}
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', until_ms - now)
else
  redis.call('SET', KEYS[1], ARGV[1])
end
return {'paused'}
"#;

/// The sources of this module's scripts, for `SCRIPT LOAD` after a `NOSCRIPT`.
pub(super) fn sources() -> [&'static str; 1] {
    [PAUSE_LUA]
}

impl Pauses for RedisStore {
    /// Writes the pause to every node, unless a pause in force outlasts it there (with
    /// [`InForce::KeepLonger`]) or it has ended; see [`crate::store::Store::pause`].
    async fn pause(
        &self,
        job: &str,
        pause: &Pause,
        in_force: InForce,
    ) -> Result<PauseOutcome, QuorumFailure> {
        let keys = [pause_key(&self.settings.key_prefix, job)];
        let value = pause.to_value();
        let until = pause.until.map_or(0, |until| until.timestamp_millis());
        let (until, now) = (until.to_string(), Utc::now().timestamp_millis().to_string());
        let mut pipeline = redis::pipe();
        pipeline.add_command(evalsha(
            &PAUSE,
            &keys,
            &[&value, &until, &now, in_force.as_arg()],
        ));
        let answers = self.ask_all(&pipeline).await;
        let read = self.read_majority(answers, |_, reply| node_outcome(reply))?;
        Ok(outcome(read.value))
    }

    /// Deletes the pause on every node; whether a node held it; see [`crate::store::Store::resume`].
    async fn resume(&self, job: &str) -> Result<bool, QuorumFailure> {
        let mut pipeline = redis::pipe();
        pipeline
            .cmd("DEL")
            .arg(pause_key(&self.settings.key_prefix, job));
        let answers = self.ask_all(&pipeline).await;
        let was = answers.iter().any(|(_, answer)| {
            matches!(answer, Ok(values) if matches!(values.first(), Some(Value::Int(n)) if *n > 0))
        });
        self.written_by_majority(answers)?;
        Ok(was)
    }

    /// The pause of each of `jobs` found on the most nodes, with their number, read from a majority; see
    /// [`crate::store::Store::pauses`].
    async fn pauses(&self, jobs: &[String]) -> Result<Read<Vec<Option<PauseRead>>>, QuorumFailure> {
        if jobs.is_empty() {
            return Ok(Read {
                value: Vec::new(),
                missing: Vec::new(),
                skipped: Vec::new(),
            });
        }
        let mut pipeline = redis::pipe();
        for job in jobs {
            pipeline
                .cmd("GET")
                .arg(pause_key(&self.settings.key_prefix, job));
        }
        // One reply per job and node: read as one array per node, so that a node counts once.
        let answers = self
            .ask_all(&pipeline)
            .await
            .into_iter()
            .map(|(node, answer)| (node, answer.map(|values| vec![Value::Array(values)])))
            .collect();
        let read = self.read_majority(answers, |_, value| strings(value))?;
        let value = (0..jobs.len())
            .map(|index| {
                let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
                for node in &read.value {
                    if let Some(Some(value)) = node.get(index) {
                        *counts.entry(value.as_str()).or_default() += 1;
                    }
                }
                let (value, nodes) = counts.into_iter().max_by_key(|(_, count)| *count)?;
                Some(PauseRead {
                    pause: Pause::from_value(value),
                    nodes,
                })
            })
            .collect();
        Ok(Read {
            value,
            missing: read.missing,
            skipped: read.skipped,
        })
    }
}

/// One node's answer to `PAUSE`.
fn node_outcome(reply: Value) -> Result<PauseOutcome, String> {
    let items = strings(reply)?;
    match items.as_slice() {
        [Some(word)] if word == "paused" => Ok(PauseOutcome::Paused),
        [Some(word)] if word == "over" => Ok(PauseOutcome::AlreadyOver),
        [Some(word), Some(value)] if word == "kept" => {
            Ok(PauseOutcome::LongerKept(Pause::from_value(value)))
        }
        other => Err(format!("unexpected PAUSE reply {other:?}")),
    }
}

/// The outcome of the majority's answers: the longer pause kept if at least as many nodes kept it as
/// took the new one (the pause found on the most of them), else paused if any node took it, else over.
/// Nodes disagree only when their pauses had diverged (one missed an earlier pause or resume); the
/// command then reads the pause back and says on how many nodes it stands.
fn outcome(answers: Vec<PauseOutcome>) -> PauseOutcome {
    let paused = answers
        .iter()
        .filter(|a| **a == PauseOutcome::Paused)
        .count();
    let mut kept: Vec<(Pause, usize)> = Vec::new();
    for answer in answers {
        if let PauseOutcome::LongerKept(pause) = answer {
            match kept.iter_mut().find(|(seen, _)| *seen == pause) {
                Some((_, count)) => *count += 1,
                None => kept.push((pause, 1)),
            }
        }
    }
    let kept_nodes: usize = kept.iter().map(|(_, count)| count).sum();
    match kept.into_iter().max_by_key(|(_, count)| *count) {
        Some((pause, _)) if kept_nodes >= paused => PauseOutcome::LongerKept(pause),
        _ if paused > 0 => PauseOutcome::Paused,
        _ => PauseOutcome::AlreadyOver,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_majority_outcome_prefers_the_pause_kept() {
        let long = Pause::from_value("9000000000000|ops|long");
        let kept = || PauseOutcome::LongerKept(long.clone());
        assert_eq!(outcome(vec![kept(), kept(), PauseOutcome::Paused]), kept());
        assert_eq!(
            outcome(vec![kept(), PauseOutcome::Paused, PauseOutcome::Paused]),
            PauseOutcome::Paused
        );
        assert_eq!(
            outcome(vec![PauseOutcome::AlreadyOver, PauseOutcome::AlreadyOver]),
            PauseOutcome::AlreadyOver
        );
        assert_eq!(outcome(vec![kept(), PauseOutcome::AlreadyOver]), kept());
    }
}
