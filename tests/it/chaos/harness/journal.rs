//! The journal: every worker process's events, stamped with the real time they arrived.
//!
//! A recorder thread per process follows its stdout and records each event as it arrives. The executor
//! asks the journal who is running the long job right now; the checker places every claim and run in
//! real time by it, whatever the worker's own clock said.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

use super::{now_ms, LONG_JOB};
use crate::support::Worker;

/// Events of every worker process, stamped with their arrival time.
#[derive(Default)]
pub struct Journal {
    state: Mutex<JournalState>,
}

#[derive(Default)]
struct JournalState {
    /// Per instance, in arrival order.
    events: Vec<Vec<(i64, Value)>>,
    /// Runs of the long job: run id → (instance, started at, finished).
    long_runs: HashMap<String, (usize, i64, bool)>,
}

impl Journal {
    fn lock(&self) -> MutexGuard<'_, JournalState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn record(&self, instance: usize, event: &Value) {
        let at = now_ms();
        let mut state = self.lock();
        if state.events.len() <= instance {
            state.events.resize(instance + 1, Vec::new());
        }
        state.events[instance].push((at, event.clone()));
        if event["job"] == LONG_JOB {
            let run_id = event["run_id"].as_str().unwrap_or_default().to_string();
            match event["event"].as_str() {
                Some("run.started") => {
                    state.long_runs.insert(run_id, (instance, at, false));
                }
                Some("run.finished") => {
                    if let Some(run) = state.long_runs.get_mut(&run_id) {
                        run.2 = true;
                    }
                }
                _ => {}
            }
        }
    }

    /// A long run in progress on one of `candidates`, started at or after `since`: `(instance, run id)`.
    pub(super) fn long_run(&self, candidates: &[usize], since: i64) -> Option<(usize, String)> {
        let state = self.lock();
        let mut found: Vec<(&String, &(usize, i64, bool))> = state
            .long_runs
            .iter()
            .filter(|(_, (instance, started, finished))| {
                !finished && *started >= since && candidates.contains(instance)
            })
            .collect();
        found.sort_by_key(|(_, (_, started, _))| Reverse(*started));
        found
            .first()
            .map(|(id, (instance, _, _))| (*instance, (*id).clone()))
    }

    /// The offset to the nodes' clocks that `instance` last measured (`clock.offset`), 0 before it did.
    pub(super) fn measured_offset(&self, instance: usize) -> i64 {
        self.lock().events.get(instance).map_or(0, |events| {
            events
                .iter()
                .rev()
                .find(|(_, e)| e["event"] == "clock.offset")
                .and_then(|(_, e)| e["offset_ms"].as_i64())
                .unwrap_or(0)
        })
    }

    /// Whether `instance` has logged an event named `name`.
    pub(super) fn has(&self, instance: usize, name: &str) -> bool {
        self.lock()
            .events
            .get(instance)
            .is_some_and(|events| events.iter().any(|(_, e)| e["event"] == name))
    }

    pub(super) fn events(&self, instance: usize) -> Vec<(i64, Value)> {
        self.lock()
            .events
            .get(instance)
            .cloned()
            .unwrap_or_default()
    }
}

/// Follows `worker`'s stdout into `journal` as process `instance`, until the stdout closes.
pub(super) fn follow(
    worker: Arc<Worker>,
    instance: usize,
    journal: Arc<Journal>,
) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name(format!("chaos-recorder-{instance}"))
        .spawn(move || {
            // The predicate sees each new line once, as it arrives; it never matches, so this returns
            // when the worker's stdout closes. A non-JSON line panics this thread (and fails the check).
            worker.wait_for(Duration::from_secs(7 * 24 * 3600), |event| {
                journal.record(instance, event);
                false
            });
        })
        .expect("cannot start a recorder thread")
}
