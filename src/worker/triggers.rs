//! The trigger requests of `redcron trigger`: read from the store once a second, each raced once by this
//! worker, as a claim of the request's own series — so exactly one worker in the cluster runs it, obeying the
//! job's `overlap` rule, with a token above every earlier run's (see [`crate::trigger`]).
//!
//! A request is raced by every live worker that runs its job (enabled, in the config in force) while its
//! window lasts; this worker remembers the requests it raced until their window is over, so a request that
//! another worker won but has not deleted yet is not raced twice here.
//!
//! A request out of bounds ([`TriggerRequest::fits`]: its time more than [`crate::trigger::MAX_AHEAD`]
//! ahead of this worker's cluster time, or an absurd window) is never claimed: it is logged once
//! (`trigger.refused`) and deleted from the store. Claimed, its token would take the floor of its time
//! and raise the tokens of every later run of the job by as far as its clock was ahead. A worker whose
//! store has clocks reads no request before it has measured them once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::task::JoinSet;
use tracing::{info, warn};

use super::race::{self, Due};
use super::Context;
use crate::lock::Series;
use crate::logging::events;
use crate::trigger::{TriggerRequest, KEEP_AFTER_WINDOW};

/// How often the requests are read (the Redis store answers most reads from a `GET` of a change count per
/// node, listing the requests only when it moved: `store::redis::triggers`).
pub(crate) const POLL_EVERY: Duration = Duration::from_secs(1);

/// Starts the poller (supervised: [`super::background`]); it returns at shutdown, once the requests it
/// races have been settled.
pub(super) fn start(context: Arc<Context>) -> tokio::task::JoinHandle<()> {
    let shutdown = context.shutdown.clone();
    super::background::spawn("trigger_poller", shutdown, move || {
        poll(Arc::clone(&context))
    })
}

async fn poll(context: Arc<Context>) {
    // Request id → the end of its window: raced here already.
    let mut raced: HashMap<String, DateTime<Utc>> = HashMap::new();
    let mut races: JoinSet<()> = JoinSet::new();
    let mut failing = false;
    loop {
        tokio::select! {
            () = context.shutdown.graceful() => break,
            () = tokio::time::sleep(POLL_EVERY) => {}
            Some(ended) = races.join_next() => {
                super::background::log_panic("trigger_race", ended);
                continue;
            }
        }
        // A request's window and bounds are judged on cluster time: not before the store's clocks were
        // measured once (this host's clock, off by more than the bound, would delete a sound request).
        if !context.clock.is_known() {
            continue;
        }
        let requests = match context.store.triggers().await {
            Ok(read) => {
                failing = false;
                context.warn_skipped(&read.skipped);
                read.value
            }
            Err(failure) => {
                if !failing {
                    warn!(event = events::trigger::POLL_FAILED, error = %failure,
                          "Trigger requests could not be read from a majority of nodes; retrying every second");
                }
                failing = true;
                continue;
            }
        };
        let now = context.clock.now();
        let keep = chrono::Duration::from_std(KEEP_AFTER_WINDOW).unwrap_or_default();
        // A request's window was checked when it was read ([`TriggerRequest::check`]); checked anyway.
        raced.retain(|_, until| {
            until
                .checked_add_signed(keep)
                .is_some_and(|gone| gone > now)
        });
        context
            .requesters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| raced.contains_key(id));
        let batch = due(&context, requests, &mut raced, now);
        if !batch.is_empty() {
            races.spawn(race::race(Arc::clone(&context), batch));
        }
    }
    while let Some(ended) = races.join_next().await {
        super::background::log_panic("trigger_race", ended);
    }
}

/// The requests of `requests` to race now: of a job this worker runs, in their window, not raced yet, and
/// within bounds — those that are not are refused and deleted.
fn due(
    context: &Context,
    requests: Vec<TriggerRequest>,
    raced: &mut HashMap<String, DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Vec<Due> {
    let mut batch = Vec::new();
    for request in requests {
        if request.not_after <= now || raced.contains_key(&request.id) {
            continue;
        }
        let Some(job) = context.job(&request.job) else {
            continue;
        };
        if let Err(unfit) = request.fits(now) {
            warn!(event = events::trigger::REFUSED, job = %job.name, trigger = %request.id, reason = unfit.reason(),
                  requested_by = %request.by, error = %unfit,
                  "A trigger request out of bounds: not claimed, and deleted from the store");
            // Remembered for KEEP_AFTER_WINDOW, by which time its deletion has landed: warned of once.
            raced.insert(request.id.clone(), now);
            context.store.forget_trigger(&request.id);
            continue;
        }
        info!(event = events::trigger::RECEIVED, job = %job.name, trigger = %request.id, tick = %request.tick(),
              requested_by = %request.by, not_after = %request.not_after.to_rfc3339(),
              "A trigger request for this job: claiming it");
        raced.insert(request.id.clone(), request.not_after);
        if !request.by.is_empty() {
            let mut requesters = context.requesters.lock().unwrap_or_else(|p| p.into_inner());
            requesters.insert(request.id.clone(), request.by.clone());
        }
        batch.push(Due {
            job,
            tick: request.tick(),
            series: Series::Trigger(request.id),
            until: request.not_after,
            delay: Duration::ZERO,
        });
    }
    batch
}
