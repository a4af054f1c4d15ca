//! The history view: the entries of the run history — runs and ticks not run — of several jobs, newest
//! first.
//!
//! The store answers per job ([`Store::history`]); [`read`] asks for every job at once and [`history`]
//! merges the answers, so the newest `limit` entries of all of them come out in tick order, whichever jobs
//! they belong to.

use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use serde::Serialize;

use super::time;
use super::Notes;
use crate::history::{Entry, Query};
use crate::lock::QuorumFailure;
use crate::schedule::Tick;
use crate::store::Store;

/// What the history view is computed from, as read from the store.
#[derive(Debug, Clone, Default)]
pub struct HistoryInputs {
    /// The newest entries of each job asked for, newest first.
    pub histories: Vec<Vec<Entry>>,
    pub notes: Notes,
}

/// Reads the newest `limit` entries of each of `jobs` whose tick is at or after `since` from `store` (from
/// a majority of its nodes).
pub async fn read(
    store: &Store,
    jobs: &[String],
    since: Option<DateTime<Utc>>,
    limit: usize,
) -> Result<HistoryInputs, QuorumFailure> {
    let queries: Vec<Query> = jobs
        .iter()
        .map(|job| Query {
            job: job.clone(),
            since: since.map(|t| Tick(t.timestamp_millis())),
            until: None,
            limit,
        })
        .collect();
    let mut notes = Notes::new(store);
    let mut histories = Vec::with_capacity(queries.len());
    for read in join_all(queries.iter().map(|query| store.history(query))).await {
        histories.push(notes.keep(read?));
    }
    Ok(HistoryInputs { histories, notes })
}

/// What `history` reports. Field names are stable (docs/history.md).
#[derive(Debug, Serialize)]
pub struct History {
    /// The entries as stored (each with `tick_rfc3339`), newest tick first.
    #[serde(serialize_with = "time::entries")]
    pub entries: Vec<Entry>,
    #[serde(flatten)]
    pub notes: Notes,
}

/// The newest `limit` entries of what [`read`] gathered.
pub fn history(inputs: HistoryInputs, limit: usize) -> History {
    History {
        entries: newest(inputs.histories, limit),
        notes: inputs.notes,
    }
}

/// The newest `limit` of the entries of several jobs: by tick, newest first, then by job, worker and kind.
fn newest(histories: Vec<Vec<Entry>>, limit: usize) -> Vec<Entry> {
    let mut entries: Vec<Entry> = histories.into_iter().flatten().collect();
    entries.sort_by(|a, b| {
        b.tick
            .cmp(&a.tick)
            .then_with(|| a.job.cmp(&b.job))
            .then_with(|| a.worker.cmp(&b.worker))
            .then_with(|| a.kind.as_str().cmp(b.kind.as_str()))
    });
    entries.truncate(limit);
    entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Kind;

    fn entry(job: &str, tick: i64, worker: &str) -> Entry {
        Entry::new(job, Tick(tick), worker, Kind::Run, DateTime::UNIX_EPOCH)
    }

    /// Several jobs' entries come out as one list, newest tick first, cut at the limit.
    #[test]
    fn the_jobs_are_merged_newest_tick_first_and_limited() {
        let a = vec![entry("a", 3000, "w1"), entry("a", 1000, "w1")];
        let b = vec![entry("b", 3000, "w2"), entry("b", 2000, "w1")];
        let inputs = HistoryInputs {
            histories: vec![a, b],
            notes: Notes::default(),
        };
        let merged = history(inputs, 3).entries;
        let seen: Vec<(&str, i64)> = merged.iter().map(|e| (e.job.as_str(), e.tick)).collect();
        assert_eq!(seen, [("a", 3000), ("b", 3000), ("b", 2000)]);
    }

    /// The JSON lists each entry as stored, with its tick also in RFC 3339, and the notes flat.
    #[test]
    fn each_entry_carries_its_tick_in_rfc_3339() {
        let inputs = HistoryInputs {
            histories: vec![vec![entry("a", 1_795_436_705_012, "w1")]],
            notes: Notes {
                store: "embedded:/tmp/x".to_string(),
                ..Notes::default()
            },
        };
        let json = serde_json::to_value(history(inputs, 20)).expect("json");
        assert_eq!(json["entries"][0]["tick"], 1_795_436_705_012_i64);
        assert_eq!(
            json["entries"][0]["tick_rfc3339"],
            "2026-11-23T12:25:05.012Z"
        );
        assert_eq!(json["entries"][0]["worker"], "w1");
        assert_eq!(json["store"], "embedded:/tmp/x");
        assert_eq!(json["missing_nodes"], serde_json::json!([]));
    }
}
