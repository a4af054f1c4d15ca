//! The worker daemon: sleep until the next tick, race for it, run what was won, shut down cleanly.
//!
//! Every worker computes the same ticks from the same schedule and sleeps until the earliest one — there is
//! no polling loop and no drift accumulated from tick to tick, because each wake-up targets a scheduled
//! instant, not "now plus an interval". All jobs due at one instant are claimed in one batch
//! ([`Store::claim_many`]), which costs one pipelined round trip per node and round however many
//! jobs are due. Runs that were won go on in their own tasks ([`run`]), each under a lease watchdog.

mod agenda;
mod alerts;
mod env;
mod heartbeat;
mod missed;
mod offset;
mod recorder;
mod run;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use chrono::Utc;
use tokio::task::JoinSet;
use tracing::{error, info, warn};

use crate::clock::cluster::ClusterClock;
use crate::config::{Config, JobConfig};
use crate::control::{Control, Intent};
use crate::history::{Entry, Kind};
use crate::lock::{ClaimOutcome, ClaimRequest, Holder, Overlap};
use crate::membership::Running;
use crate::schedule::Tick;
use crate::shutdown::Shutdown;
use crate::store::Store;

use self::agenda::Agenda;
use self::recorder::Recorder;

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
    Store(#[from] crate::store::StoreError),
}

/// What the worker shares with its runs.
pub(crate) struct Context {
    pub(crate) store: Store,
    /// Cluster time, which every tick is scheduled on (kept on the nodes' clocks by [`offset`]).
    pub(crate) clock: ClusterClock,
    pub(crate) worker_id: String,
    pub(crate) shutdown: Shutdown,
    pub(crate) shutdown_grace: Duration,
    /// The variables the store's settings use (its password): kept from jobs ([`env`]).
    pub(crate) store_env_vars: BTreeSet<String>,
    /// Jobs with `overlap: skip` that this worker is racing for or running.
    busy: Mutex<HashSet<String>>,
    /// (job, other worker, its fingerprint) already warned about by `note_other_definition`.
    definitions_seen: Mutex<HashSet<(String, String, String)>>,
    /// The history writer: every fact about a tick goes to the store through it.
    pub(crate) recorder: Recorder,
    /// The runs under way on this worker, by run id (for the heartbeat).
    running: Mutex<BTreeMap<String, Running>>,
    /// The missed-tick checker, once started.
    sentinel: OnceLock<missed::Sentinel>,
    /// The fingerprint of the config in force ([`Config::fingerprint`]), for the heartbeat.
    config_fingerprint: Mutex<String>,
}

/// Runs the worker until `control` asks it to drain and every running job has ended and released its
/// lease; reloads the config file when `control` asks (see [`reload`]).
///
/// Redis nodes that are down at start or later do not stop the worker: it logs them and races again at the
/// next tick.
pub async fn run(config: Config, mut control: Control) -> Result<(), WorkerError> {
    let shutdown = control.shutdown().clone();
    let mut config = config;
    let store = Store::open(&config)?;
    if !store.is_shared() {
        warn!(
            event = "worker.embedded_store",
            "No redis section in the config: using the embedded single-host store. Ticks are claimed \
             in this process only; run a single worker, or configure Redis nodes to run several."
        );
    }
    let nodes = store.describe();
    let jobs = enabled_jobs(&config);
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
        store_env_vars: config.store_env_vars.clone(),
        busy: Mutex::new(HashSet::new()),
        definitions_seen: Mutex::new(HashSet::new()),
        recorder: Recorder::new(),
        running: Mutex::new(BTreeMap::new()),
        sentinel: OnceLock::new(),
        config_fingerprint: Mutex::new(config.fingerprint()),
    });
    let recorder_task = recorder::start(Arc::clone(&context));
    let heartbeat = heartbeat::Heartbeat::start(
        Arc::clone(&context),
        heartbeat::Identity {
            every: config.worker.heartbeat_every,
            started_at: context.clock.now(),
        },
    );
    // One task per batch of due ticks: it claims them and runs the ones won. The loop itself never waits
    // for Redis, so a slow race (retries, a hung node) cannot delay the next tick of another job.
    let mut races: JoinSet<()> = JoinSet::new();
    let remember_claims = context.store.is_shared();
    // The first ticks are scheduled on the measured cluster time (or on this host's clock, if the nodes
    // cannot be measured within about a second).
    let clock_task = offset::start(Arc::clone(&context), &config.worker).await;
    let clock = &context.clock;
    let (sentinel, sentinel_task) = missed::Sentinel::start(
        Arc::clone(&context),
        jobs.clone(),
        config.worker.max_clock_offset,
    );
    let _ = context.sentinel.set(sentinel);
    let mut agenda = Agenda::new(jobs, clock.now(), remember_claims);

    loop {
        let wait = agenda.next_tick().map_or(MAX_SLEEP, |next| {
            (next.to_utc() - clock.now())
                .to_std()
                .unwrap_or(Duration::ZERO)
        });
        tokio::select! {
            intent = control.next() => match intent {
                Intent::Drain => break,
                Intent::Reload { why } => {
                    if let Some(new) = reload(&context, &config, why) {
                        agenda = agenda.reload(enabled_jobs(&new), clock.now());
                        config = new;
                    }
                    continue;
                }
            },
            _ = tokio::time::sleep(wait.min(MAX_SLEEP)) => {}
            // A new clock offset moves the instant this sleep aims at: aim again.
            () = clock.moved() => continue,
            Some(_) = races.join_next() => continue,
        }
        let mut batch = Vec::new();
        let due = agenda.take_due(clock.now());
        for (index, tick, why) in due.passed {
            let job = agenda.job(index);
            context.note(job, tick, Kind::Skipped, Some(why.as_str()), None);
            if why == agenda::Passed::Misfire {
                context.suspect(job, tick);
            }
        }
        for (index, tick) in due.race {
            let job = agenda.job(index);
            let guard = match job.overlap {
                Overlap::Allow => None,
                Overlap::Skip => match BusyGuard::try_new(&context, &job.name) {
                    Some(guard) => Some(guard),
                    None => {
                        info!(event = "tick.skipped", job = %job.name, tick = %tick, reason = "overlap",
                              "Skipped: this worker is still running (or racing for) the previous tick");
                        context.note(job, tick, Kind::Skipped, Some("overlap"), None);
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
    let _ = sentinel_task.await;
    heartbeat.stop().await;
    context.recorder.close();
    if let Some(task) = recorder_task {
        let _ = task.await;
    }
    info!(event = "worker.stopped", "Worker stopped");
    Ok(())
}

/// The jobs of `config` that are raced.
fn enabled_jobs(config: &Config) -> Vec<JobConfig> {
    config
        .jobs
        .iter()
        .filter(|job| job.enabled)
        .cloned()
        .collect()
}

/// Reads the config file again for a reload asked for by `why`. A file with problems changes nothing:
/// each problem is logged (file:line:column) and `None` returned. A valid one is returned, and what
/// changed is logged; store settings (nodes, lock, history) cannot change without a restart, and say so.
fn reload(context: &Context, running: &Config, why: &'static str) -> Option<Config> {
    let new = match crate::config::load(&running.path) {
        Ok(new) => new,
        Err(e) => {
            for problem in e.problems() {
                error!(event = "config.reload_failed", why, problem = %problem,
                       "Config not reloaded: the file has a problem; the worker keeps the config it runs");
            }
            if e.problems().is_empty() {
                error!(event = "config.reload_failed", why, problem = %e,
                       "Config not reloaded: the file could not be read; the worker keeps the config it runs");
            }
            return None;
        }
    };
    for warning in &new.warnings {
        warn!(event = "config.warning", "{warning}");
    }
    if new.redis != running.redis
        || new.lock != running.lock
        || new.history != running.history
        || new.worker != running.worker
    {
        warn!(event = "config.restart_needed", why,
              "The store, lock, history or worker settings changed: they apply after a restart; jobs are reloaded now");
    }
    let names = |config: &Config| -> BTreeMap<String, String> {
        enabled_jobs(config)
            .iter()
            .map(|job| (job.name.clone(), job.fingerprint()))
            .collect()
    };
    let (before, after) = (names(running), names(&new));
    let list = |names: Vec<&String>| {
        names
            .into_iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(",")
    };
    let added = list(after.keys().filter(|n| !before.contains_key(*n)).collect());
    let removed = list(before.keys().filter(|n| !after.contains_key(*n)).collect());
    let changed = list(
        after
            .iter()
            .filter(|(n, f)| before.get(*n).is_some_and(|old| old != *f))
            .map(|(n, _)| n)
            .collect(),
    );
    *context
        .config_fingerprint
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = new.fingerprint();
    info!(event = "config.reloaded", why, added = %added, changed = %changed, removed = %removed,
          jobs = after.len() as u64, fingerprint = %new.fingerprint(),
          "Config reloaded: new and changed jobs take effect from their next tick; removed jobs are no longer raced; running jobs go on");
    Some(new)
}

/// One tick being raced: the job, its claim request (one claimant, kept across retries), and when to
/// try again.
struct Pending {
    job: JobConfig,
    request: ClaimRequest,
    guard: Option<BusyGuard>,
    retry_at: tokio::time::Instant,
    /// The next wait after a `NoQuorum` (doubles up to [`NO_QUORUM_BACKOFF_MAX`]).
    backoff: Duration,
}

/// Claims a batch of due ticks (one pipelined round trip per node and round) and settles each outcome in
/// its own task; returns when every run (and every retry) has ended.
///
/// An outcome that is not final — no quorum, a contender of the same tick between its rounds (or crashed
/// there), a claim won by a worker that was paused until its lease expired — is retried with the *same*
/// request, so the retry continues this worker's claim instead of competing with it, until the job's
/// misfire grace ends or its next tick is due. Ticks retried at one instant travel together again, so a
/// retry costs one round trip per node however many jobs it carries.
async fn race(context: Arc<Context>, batch: Vec<(JobConfig, Tick, Option<BusyGuard>)>) {
    let mut settling = JoinSet::new();
    let first_tick = batch.first().map_or(Tick(0), |(_, tick, _)| *tick);
    let now = tokio::time::Instant::now() + stagger(&context, first_tick);
    let mut pending: Vec<Pending> = batch
        .into_iter()
        .map(|(job, tick, guard)| Pending {
            request: ClaimRequest::new(
                &context.worker_id,
                &job.name,
                tick,
                job.overlap,
                &job.fingerprint(),
            ),
            retry_at: now + job.jitter_for(tick),
            job,
            guard,
            backoff: NO_QUORUM_BACKOFF,
        })
        .collect();
    while let Some(ready_at) = pending.iter().map(|p| p.retry_at).min() {
        tokio::select! {
            _ = tokio::time::sleep_until(ready_at) => {}
            _ = context.shutdown.graceful() => {}
        }
        if context.shutdown.is_requested() {
            for p in &pending {
                info!(event = "tick.skipped", job = %p.job.name, tick = %p.request.tick, reason = "shutdown",
                      "Skipped: shutdown was requested while the tick was being raced");
                context.note(
                    &p.job,
                    p.request.tick,
                    Kind::Skipped,
                    Some("shutdown"),
                    None,
                );
            }
            break;
        }
        let now = tokio::time::Instant::now();
        let (ready, waiting): (Vec<Pending>, Vec<Pending>) =
            pending.into_iter().partition(|p| p.retry_at <= now);
        pending = waiting;
        let requests: Vec<ClaimRequest> = ready.iter().map(|p| p.request.clone()).collect();
        let outcomes = context.store.claim_many(&requests).await;
        for (mut p, outcome) in ready.into_iter().zip(outcomes) {
            context.note_other_definition(&p.job, p.request.tick, outcome.other());
            let wait = match &outcome {
                // Won, but too close to (or past) the lease's deadline to start: the process was paused.
                // The same claimant claims the tick again, with a fresh lease (see `run::start`).
                ClaimOutcome::Won(lease) if lease.remaining() <= p.job.stop_grace => {
                    Some(Duration::ZERO)
                }
                ClaimOutcome::NoQuorum(_) => {
                    let wait = p.backoff;
                    p.backoff = (p.backoff * 2).min(NO_QUORUM_BACKOFF_MAX);
                    Some(wait)
                }
                other => other.retry_in(),
            };
            let Some(wait) = wait else {
                settling.spawn(settle(
                    Arc::clone(&context),
                    p.job,
                    p.request.tick,
                    p.guard,
                    outcome,
                ));
                continue;
            };
            let retry_at =
                context.clock.now() + chrono::Duration::from_std(wait).unwrap_or_default();
            if retry_at >= give_up_at(&p.job, p.request.tick) {
                give_up(&context, &p, &outcome);
                continue;
            }
            retrying(&p, &outcome, wait);
            p.retry_at = tokio::time::Instant::now() + wait;
            pending.push(p);
        }
    }
    while settling.join_next().await.is_some() {}
}

/// How long this worker waits before its first claim of a batch due at `tick`.
///
/// Workers on cluster time wake for a tick at the same instant, and contenders that reach the nodes at the
/// same moment split their votes — with a node or two down, a split can last until the tick's window ends.
/// So each worker starts after a delay of up to a quarter of `retry_delay`, drawn from a stable hash of
/// (worker id, tick): usually one worker claims the tick's jobs alone and the others find them claimed, and
/// which worker goes first changes from tick to tick. The embedded store has no contenders: no delay.
fn stagger(context: &Context, tick: Tick) -> Duration {
    if !context.store.is_shared() {
        return Duration::ZERO;
    }
    let spread = context.store.settings().retry_delay / 4;
    let key = format!("{}\n{}", context.worker_id, tick.as_millis());
    let fraction = (crate::config::fnv1a(key.as_bytes()) % 1_000_000) as f64 / 1_000_000.0;
    spread.mul_f64(fraction)
}

/// Logs a retry of a tick whose outcome was not final.
fn retrying(p: &Pending, outcome: &ClaimOutcome, wait: Duration) {
    let (job, tick, retry_in_ms) = (&p.job.name, p.request.tick, wait.as_millis() as u64);
    match outcome {
        ClaimOutcome::NoQuorum(failure) => {
            warn!(event = "tick.retrying", job = %job, tick = %tick, reason = "no_quorum", error = %failure,
                  retry_in_ms, "No majority of Redis nodes answered; racing again")
        }
        ClaimOutcome::Contended { holder, .. } => {
            info!(event = "tick.retrying", job = %job, tick = %tick, reason = "contended",
                  holder = holder.as_ref().map_or("unknown", |h| h.worker.as_str()), retry_in_ms,
                  "Another worker holds the lease for this tick without having claimed it; racing again once it has decided or its lease expired")
        }
        _ => {
            warn!(event = "tick.retrying", job = %job, tick = %tick, reason = "lease_expired",
                  retry_in_ms, "Won the tick, but the lease expired before the job could start (was this process paused?); claiming it again")
        }
    }
}

/// Logs and records a tick given up at the end of its grace, and why, and has it checked for a miss (the
/// cluster-wide ERROR, once, is `tick.missed`).
fn give_up(context: &Context, p: &Pending, outcome: &ClaimOutcome) {
    let reason = match outcome {
        ClaimOutcome::NoQuorum(_) => "no_quorum",
        ClaimOutcome::Contended { .. } => "contended",
        _ => "lease_expired",
    };
    context.note(&p.job, p.request.tick, Kind::Skipped, Some(reason), None);
    context.suspect(&p.job, p.request.tick);
    let (job, tick) = (&p.job.name, p.request.tick);
    match outcome {
        ClaimOutcome::NoQuorum(failure) => {
            warn!(event = "tick.skipped", job = %job, tick = %tick, reason = "no_quorum", error = %failure,
                   "Skipped: no majority of Redis nodes answered within the grace")
        }
        ClaimOutcome::Contended { holder, .. } => {
            warn!(event = "tick.skipped", job = %job, tick = %tick, reason = "contended",
                   holder = holder.as_ref().map_or("unknown", |h| h.worker.as_str()),
                   "Skipped: another worker held this tick's lease without claiming it until the grace ended")
        }
        _ => {
            warn!(event = "tick.skipped", job = %job, tick = %tick, reason = "lease_expired",
                   "Skipped: every lease won for this tick expired before the job could start, until the grace ended")
        }
    }
}

/// When a tick that has not been settled stops being raced: at the job's next tick or the end of its
/// misfire grace, whichever comes first.
fn give_up_at(job: &JobConfig, tick: Tick) -> chrono::DateTime<Utc> {
    let grace = chrono::Duration::from_std(job.misfire_grace).unwrap_or_default();
    match job.schedule.next_after(tick.to_utc()) {
        Some(next) => next.to_utc().min(tick.to_utc() + grace),
        None => tick.to_utc() + grace,
    }
}

/// Acts on a final claim outcome: runs a won tick, logs a lost one.
async fn settle(
    context: Arc<Context>,
    job: JobConfig,
    tick: Tick,
    guard: Option<BusyGuard>,
    outcome: ClaimOutcome,
) {
    match outcome {
        // Also when shutdown was requested while racing: the tick is granted to this worker, so no other
        // worker may run it; the run gets the shutdown grace like any running job.
        ClaimOutcome::Won(lease) => {
            info!(event = "tick.won", job = %job.name, tick = %tick, token = lease.token, "Won the tick");
            run::run(Arc::clone(&context), job, lease).await;
        }
        ClaimOutcome::AlreadyClaimed { by } => {
            info!(event = "tick.lost", job = %job.name, tick = %tick, reason = "already_claimed",
                  by = by.as_ref().map_or("unknown", |by| by.worker.as_str()),
                  "Lost the tick: another worker claimed it");
            let by = by.map(|by| by.worker);
            context.note(
                &job,
                tick,
                Kind::Lost,
                Some("already_claimed"),
                by.as_deref(),
            );
        }
        ClaimOutcome::Busy { holder, ttl } => {
            info!(event = "tick.lost", job = %job.name, tick = %tick, reason = "busy",
                  holder = holder.as_ref().map_or("unknown", |h| h.worker.as_str()),
                  holder_tick = %holder.as_ref().and_then(|h| h.tick).map_or(String::new(), |t| t.to_string()),
                  holder_ttl_ms = ttl.map_or(0, |ttl| ttl.as_millis() as u64),
                  "Lost the tick: the previous run still holds the job");
            let by = holder.map(|holder| holder.worker);
            context.note(&job, tick, Kind::Skipped, Some("overlap"), by.as_deref());
        }
        ClaimOutcome::Contended { .. } | ClaimOutcome::NoQuorum(_) => {
            // Never settled: `race` retries these until it gives up, and logs that.
        }
    }
    drop(guard);
}

impl Context {
    /// A history entry of `kind` by this worker for `(job, tick)`, stamped now (cluster time).
    pub(crate) fn entry(&self, job: &JobConfig, tick: Tick, kind: Kind) -> Entry {
        let mut entry = Entry::new(&job.name, tick, &self.worker_id, kind, self.clock.now());
        entry.fingerprint = Some(job.fingerprint());
        entry
    }

    /// Records that this worker did not run `(job, tick)`: `kind` with its reason and the other claimant.
    fn note(
        &self,
        job: &JobConfig,
        tick: Tick,
        kind: Kind,
        reason: Option<&str>,
        by: Option<&str>,
    ) {
        let mut entry = self.entry(job, tick, kind);
        entry.reason = reason.map(str::to_string);
        entry.by = by.map(str::to_string);
        self.recorder.note(entry);
    }

    /// Has `(job, tick)` checked for a miss once its window has ended.
    fn suspect(&self, job: &JobConfig, tick: Tick) {
        if let Some(sentinel) = self.sentinel.get() {
            sentinel.suspect(job, tick);
        }
    }

    /// The fingerprint of the config in force.
    fn config_fingerprint(&self) -> String {
        let fingerprint = self.config_fingerprint.lock();
        fingerprint.unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The runs under way on this worker.
    fn running_now(&self) -> Vec<Running> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.values().cloned().collect()
    }

    /// Marks a run under way (`Some`) or ended (`None`), for the heartbeat.
    pub(crate) fn set_running(&self, run_id: &str, run: Option<Running>) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        match run {
            Some(run) => running.insert(run_id.to_string(), run),
            None => running.remove(run_id),
        };
    }

    fn busy_count(&self) -> usize {
        self.busy.lock().map_or(0, |busy| busy.len())
    }

    /// Warns, once per job, other worker and definition, when another worker holds or claimed a tick of
    /// `job` with a different definition of it (a rollout in progress, or a fleet that drifted apart).
    fn note_other_definition(&self, job: &JobConfig, tick: Tick, other: Option<&Holder>) {
        let Some(other) = other else { return };
        let Some(theirs) = other.fingerprint.as_deref() else {
            return;
        };
        let ours = job.fingerprint();
        if theirs == ours {
            return;
        }
        let mut seen = self
            .definitions_seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = (job.name.clone(), other.worker.clone(), theirs.to_string());
        if seen.insert(key) {
            warn!(event = "job.config_differs", job = %job.name, tick = %tick, other_worker = %other.worker,
                  fingerprint = %ours, other_fingerprint = %theirs,
                  "Another worker runs a different definition of this job (a rollout in progress?); each tick still runs once");
        }
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
