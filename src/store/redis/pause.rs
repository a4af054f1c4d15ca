//! Pauses on the Redis nodes: `…:{<job>}:paused` on every node, written and deleted by `redcron pause` and
//! `redcron resume`, read by both rounds of every claim of the job (`ACQUIRE`, `CONFIRM`) and by
//! `redcron status`. A pause with an end carries it as the key's TTL, so each node drops it by itself.

use std::collections::BTreeMap;

use chrono::Utc;
use redis::Value;

use super::history::strings;
use super::RedisStore;
use crate::lock::keys::pause_key;
use crate::lock::{Pause, PauseRead, QuorumFailure};
use crate::store::Read;

impl RedisStore {
    /// Writes the pause to every node; see [`crate::store::Store::pause`].
    pub async fn pause(&self, job: &str, pause: &Pause) -> Result<(), QuorumFailure> {
        let mut pipeline = redis::pipe();
        let set = pipeline
            .cmd("SET")
            .arg(pause_key(&self.settings.key_prefix, job))
            .arg(pause.to_value());
        if let Some(left) = pause.left(Utc::now()) {
            set.arg("PX").arg(left.as_millis().max(1) as u64);
        }
        let answers = self.ask_all(&pipeline).await;
        self.written_by_majority(answers)
    }

    /// Deletes the pause on every node; whether a node held it; see [`crate::store::Store::resume`].
    pub async fn resume(&self, job: &str) -> Result<bool, QuorumFailure> {
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
    pub async fn pauses(
        &self,
        jobs: &[String],
    ) -> Result<Read<Vec<Option<PauseRead>>>, QuorumFailure> {
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
