//! The worker daemon: sleep until the next tick, race for it, run what was won, shut down cleanly.
//!
//! Every worker computes the same ticks from the same schedule and sleeps until the earliest one — there is
//! no polling loop and no drift accumulated from tick to tick, because each wake-up targets a scheduled
//! instant, not "now plus an interval". All jobs due at one instant are claimed in one batch
//! ([`LockStore::claim_many`]), which costs one pipelined round trip per node and round however many
//! jobs are due. Runs that were won go on in their own tasks ([`run`]), each under a lease watchdog.

mod offset;
mod run;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use tokio::task::JoinSet;
use tracing::{error, info, warn};

use crate::clock::cluster::ClusterClock;
use crate::config::{Config, JobConfig};
use crate::lock::memory::MemoryStore;
use crate::lock::redis::RedisStore;
use crate::lock::{ClaimOutcome, ClaimRequest, LockStore, Overlap};
use crate::schedule::Tick;
use crate::shutdown::Shutdown;

/// The longest single sleep: a worker re-reads the wall clock at least this often, so that a clock step
/// (NTP, a VM resumed) moves its next wake-up with it.
const MAX_SLEEP: Duration = Duration::from_secs(30);

/// The first wait before a tick that found no quorum is raced again; it doubles up to the maximum.
const NO_QUORUM_BACKOFF: Duration = Duration::from_millis(250);
const NO_QUORUM_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Failures that stop the worker before it starts.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("lock store: {0}")]
    Store(#[from] crate::lock::StoreError),
}

/// What the worker shares with its runs.
pub(crate) struct Context {
    pub(crate) store: LockStore,
    /// Cluster time, which every tick is scheduled on (kept on the nodes' clocks by [`offset`]).
    pub(crate) clock: ClusterClock,
    pub(crate) worker_id: String,
    pub(crate) shutdown: Shutdown,
    pub(crate) shutdown_grace: Duration,
    /// Jobs with `overlap: skip` that this worker is racing for or running.
    busy: Mutex<HashSet<String>>,
}

/// Runs the worker until `shutdown` is requested and every running job has ended and released its lease.
///
/// Redis nodes that are down at start or later do not stop the worker: it logs them and races again at the
/// next tick.
pub async fn run(config: Config, shutdown: Shutdown) -> Result<(), WorkerError> {
    let store = match &config.redis {
        Some(redis) => LockStore::Redis(RedisStore::new(&redis.nodes, config.lock.clone())?),
        None => {
            warn!(
                event = "worker.embedded_store",
                "No redis section in the config: using the embedded single-host store. Ticks are claimed \
                 in this process only; run a single worker, or configure Redis nodes to run several."
            );
            LockStore::Memory(MemoryStore::new(config.lock.clone()))
        }
    };
    let nodes = match &store {
        LockStore::Redis(redis) => redis.node_labels().join(","),
        LockStore::Memory(_) => "embedded".to_string(),
    };
    let jobs: Vec<JobConfig> = config
        .jobs
        .iter()
        .filter(|job| job.enabled)
        .cloned()
        .collect();
    info!(
        event = "worker.started",
        config = %config.path.display(),
        nodes = %nodes,
        jobs = %jobs.iter().map(|job| job.name.as_str()).collect::<Vec<_>>().join(","),
        ttl_ms = config.lock.ttl.as_millis() as u64,
        renew_every_ms = config.lock.renew_every.as_millis() as u64,
        pid = std::process::id(),
        "Worker started"
    );
    let context = Arc::new(Context {
        store,
        clock: ClusterClock::local(),
        worker_id: config.worker.id.clone(),
        shutdown: shutdown.clone(),
        shutdown_grace: config.worker.shutdown_grace,
        busy: Mutex::new(HashSet::new()),
    });
    // One task per batch of due ticks: it claims them and runs the ones won. The loop itself never waits
    // for Redis, so a slow race (retries, a hung node) cannot delay the next tick of another job.
    let mut races: JoinSet<()> = JoinSet::new();
    let remember_claims = matches!(context.store, LockStore::Redis(_));
    // The first ticks are scheduled on the measured cluster time (or on this host's clock, if the nodes
    // cannot be measured within about a second).
    let clock_task = offset::start(Arc::clone(&context), &config.worker).await;
    let clock = &context.clock;
    let mut agenda = Agenda::new(&jobs, clock.now(), remember_claims);

    while let Some(next) = agenda.next_tick() {
        let wait = (next.to_utc() - clock.now())
            .to_std()
            .unwrap_or(Duration::ZERO);
        tokio::select! {
            _ = shutdown.graceful() => break,
            _ = tokio::time::sleep(wait.min(MAX_SLEEP)) => {}
            Some(_) = races.join_next() => continue,
        }
        let mut batch = Vec::new();
        for (index, tick) in agenda.take_due(clock.now()) {
            let job = &jobs[index];
            let guard = match job.overlap {
                Overlap::Allow => None,
                Overlap::Skip => match BusyGuard::try_new(&context, &job.name) {
                    Some(guard) => Some(guard),
                    None => {
                        info!(event = "tick.skipped", job = %job.name, tick = %tick, reason = "overlap",
                              "Skipped: this worker is still running (or racing for) the previous tick");
                        continue;
                    }
                },
            };
            batch.push((job.clone(), tick, guard));
        }
        if !batch.is_empty() {
            races.spawn(race(Arc::clone(&context), batch));
        }
    }

    info!(
        event = "worker.stopping",
        running = context.busy_count(),
        grace_ms = context.shutdown_grace.as_millis() as u64,
        "Stopping: no new ticks; running jobs get the shutdown grace"
    );
    while races.join_next().await.is_some() {}
    if let Some(task) = clock_task {
        let _ = task.await;
    }
    info!(event = "worker.stopped", "Worker stopped");
    Ok(())
}

/// Claims a batch of due ticks in one call (one pipelined round trip per node and round) and settles each
/// outcome in its own task; returns when every run (and every retry) has ended.
///
/// Ticks that found no quorum are raced again *together* — with backoff, while each is within its job's
/// misfire grace and its next tick is not yet due — so that a retry costs one round trip per node however
/// many jobs it carries, and a Redis outage shorter than the grace costs no run.
async fn race(context: Arc<Context>, batch: Vec<(JobConfig, Tick, Option<BusyGuard>)>) {
    let mut settling = JoinSet::new();
    let mut pending = batch;
    let mut backoff = NO_QUORUM_BACKOFF;
    loop {
        let claims: Vec<ClaimRequest> = pending
            .iter()
            .map(|(job, tick, _)| request(job, *tick))
            .collect();
        let outcomes = context.store.claim_many(&context.worker_id, &claims).await;
        let mut again = Vec::new();
        for ((job, tick, guard), outcome) in pending.into_iter().zip(outcomes) {
            let ClaimOutcome::NoQuorum(failure) = outcome else {
                settling.spawn(settle(Arc::clone(&context), job, tick, guard, outcome));
                continue;
            };
            let retry_at =
                context.clock.now() + chrono::Duration::from_std(backoff).unwrap_or_default();
            if context.shutdown.is_requested() || retry_at >= give_up_at(&job, tick) {
                error!(event = "tick.skipped", job = %job.name, tick = %tick, reason = "no_quorum",
                       error = %failure, "Skipped: no majority of Redis nodes answered within the grace");
            } else {
                warn!(event = "tick.retrying", job = %job.name, tick = %tick, reason = "no_quorum",
                      error = %failure, retry_in_ms = backoff.as_millis() as u64,
                      "No majority of Redis nodes answered; racing again");
                again.push((job, tick, guard));
            }
        }
        if again.is_empty() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = context.shutdown.graceful() => {}
        }
        if context.shutdown.is_requested() {
            for (job, tick, _) in &again {
                info!(event = "tick.skipped", job = %job.name, tick = %tick, reason = "shutdown",
                      "Skipped: shutdown was requested while waiting for a quorum");
            }
            break;
        }
        backoff = (backoff * 2).min(NO_QUORUM_BACKOFF_MAX);
        pending = again;
    }
    while settling.join_next().await.is_some() {}
}

fn request(job: &JobConfig, tick: Tick) -> ClaimRequest {
    ClaimRequest {
        job: job.name.clone(),
        tick,
        overlap: job.overlap,
    }
}

/// When a tick that finds no quorum stops being raced: at the job's next tick or the end of its misfire
/// grace, whichever comes first.
fn give_up_at(job: &JobConfig, tick: Tick) -> chrono::DateTime<Utc> {
    let grace = chrono::Duration::from_std(job.misfire_grace).unwrap_or_default();
    match job.schedule.next_after(tick.to_utc()) {
        Some(next) => next.to_utc().min(tick.to_utc() + grace),
        None => tick.to_utc() + grace,
    }
}

/// Acts on one claim outcome other than no quorum: runs a won tick, logs a lost one.
async fn settle(
    context: Arc<Context>,
    job: JobConfig,
    tick: Tick,
    guard: Option<BusyGuard>,
    outcome: ClaimOutcome,
) {
    match outcome {
        ClaimOutcome::Won(lease) if context.shutdown.is_requested() => {
            info!(event = "tick.skipped", job = %job.name, tick = %tick, reason = "shutdown",
                  "Skipped: shutdown was requested while racing; releasing the claim's lease");
            context.store.release(&lease).await;
        }
        ClaimOutcome::Won(lease) => {
            info!(event = "tick.won", job = %job.name, tick = %tick, token = lease.token, "Won the tick");
            run::run(Arc::clone(&context), job, lease).await;
        }
        ClaimOutcome::AlreadyClaimed => {
            info!(event = "tick.lost", job = %job.name, tick = %tick, reason = "already_claimed",
                  "Lost the tick: it was already claimed by a run");
        }
        ClaimOutcome::Busy { holder, ttl } => {
            info!(event = "tick.lost", job = %job.name, tick = %tick, reason = "busy",
                  holder = holder.as_deref().unwrap_or("unknown"),
                  holder_ttl_ms = ttl.map_or(0, |ttl| ttl.as_millis() as u64),
                  "Lost the tick: another worker holds the job");
        }
        ClaimOutcome::NoQuorum(failure) => {
            error!(event = "tick.skipped", job = %job.name, tick = %tick, reason = "no_quorum",
                   error = %failure, "Skipped: no majority of Redis nodes answered");
        }
    }
    drop(guard);
}

impl Context {
    fn busy_count(&self) -> usize {
        self.busy.lock().map_or(0, |busy| busy.len())
    }
}

/// Marks a job as racing or running on this worker (for `overlap: skip`) until dropped.
struct BusyGuard {
    context: Arc<Context>,
    job: String,
}

impl BusyGuard {
    /// `None` if the job is already busy here.
    fn try_new(context: &Arc<Context>, job: &str) -> Option<BusyGuard> {
        let mut busy = context
            .busy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        busy.insert(job.to_string()).then(|| BusyGuard {
            context: Arc::clone(context),
            job: job.to_string(),
        })
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let mut busy = self
            .context
            .busy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        busy.remove(&self.job);
    }
}

/// The next tick of every job, ordered by time.
struct Agenda<'a> {
    jobs: &'a [JobConfig],
    /// tick → indexes of the jobs due then.
    due: BTreeMap<Tick, Vec<usize>>,
}

impl<'a> Agenda<'a> {
    /// Each job's first tick: the latest one within its misfire grace (a worker that comes up late still
    /// races for it; the claim stops it if someone ran it), or else the next one.
    ///
    /// With the embedded store (`remember_claims == false`) there is nobody to ask whether an earlier
    /// process already ran a recent tick, so only ticks from now on are raced: at most once, even across
    /// restarts.
    fn new(jobs: &'a [JobConfig], now: chrono::DateTime<Utc>, remember_claims: bool) -> Agenda<'a> {
        let mut agenda = Agenda {
            jobs,
            due: BTreeMap::new(),
        };
        let now_tick = Tick(now.timestamp_millis());
        for (index, job) in jobs.iter().enumerate() {
            let grace = if remember_claims {
                chrono::Duration::from_std(job.misfire_grace).unwrap_or_default()
            } else {
                chrono::Duration::zero()
            };
            let mut first = job
                .schedule
                .next_after(now - grace - chrono::Duration::milliseconds(1));
            // Of several ticks within the grace, only the latest is raced.
            while let Some(tick) = first {
                match job.schedule.next_after(tick.to_utc()) {
                    Some(next) if next <= now_tick => first = Some(next),
                    _ => break,
                }
            }
            if let Some(tick) = first {
                agenda.due.entry(tick).or_default().push(index);
            }
        }
        agenda
    }

    fn next_tick(&self) -> Option<Tick> {
        self.due.keys().next().copied()
    }

    /// Removes and returns the ticks due at `now`, and schedules each job's next tick.
    ///
    /// When a job has several ticks due (the worker was paused, or started late), only the latest one
    /// within the misfire grace is raced — as cron does after a missed run — and the older ones are
    /// logged as skipped: racing them would only find them claimed or run stale work in a burst.
    fn take_due(&mut self, now: chrono::DateTime<Utc>) -> Vec<(usize, Tick)> {
        let now_tick = Tick(now.timestamp_millis());
        let mut taken = Vec::new();
        while let Some(entry) = self.due.first_entry() {
            if *entry.key() > now_tick {
                break;
            }
            let (tick, indexes) = entry.remove_entry();
            for index in indexes {
                let job = &self.jobs[index];
                let mut latest = tick;
                let mut superseded = 0u64;
                let mut next = job.schedule.next_after(tick.to_utc());
                while let Some(candidate) = next.filter(|t| *t <= now_tick) {
                    superseded += 1;
                    latest = candidate;
                    next = job.schedule.next_after(candidate.to_utc());
                }
                if superseded > 0 {
                    warn!(event = "tick.skipped", job = %job.name, tick = %tick, reason = "superseded",
                          count = superseded, latest = %latest,
                          "Skipped older ticks: the worker was late; racing only the latest");
                }
                let grace = chrono::Duration::from_std(job.misfire_grace).unwrap_or_default();
                if now - latest.to_utc() > grace {
                    warn!(event = "tick.skipped", job = %job.name, tick = %latest, reason = "misfire",
                          late_ms = (now - latest.to_utc()).num_milliseconds(),
                          "Skipped: the tick is older than the job's misfire grace");
                } else {
                    taken.push((index, latest));
                }
                if let Some(next) = next {
                    self.due.entry(next).or_default().push(index);
                }
            }
        }
        taken
    }
}
