//! The worker daemon: sleep until the next tick, race for it, run what was won, shut down cleanly.
//!
//! Every worker computes the same ticks from the same schedule and sleeps until the earliest one — there is
//! no polling loop and no drift accumulated from tick to tick, because each wake-up targets a scheduled
//! instant, not "now plus an interval". All jobs due at one instant are claimed in one batch
//! ([`Store::claim_each`]), which costs a pipelined round trip per node and round for every 128 jobs
//! due (on Redis; on etcd a write transaction per 124), not one per job. Runs that were won go on in
//! their own tasks ([`run`]), each under a lease watchdog.
//!
//! Files: `agenda.rs` which ticks are due; `race.rs` the race for a batch and what becomes of each tick;
//! `run.rs` one run under its watchdog; `env.rs` a job's environment; `recorder.rs` the history writer;
//! `slots.rs` how many children may run at once; `heartbeat.rs` membership; `missed.rs` the missed-tick alarm; `alerts.rs` the failure and recovery hooks;
//! `offset.rs` the clock offset to the nodes; `reload.rs` a reload of the config file; `retry.rs` the retries of a failed run; `triggers.rs` the
//! trigger requests of `redcron trigger`; `http.rs` the `/metrics`, `/healthz` and `/readyz` listener; `background.rs` the restart of a
//! background task that panicked; `memory.rs` how malloc hands a burst's memory back. Outside intent (reload, drain, stop) arrives through one [`Control`].

mod agenda;
mod alerts;
mod background;
mod env;
mod heartbeat;
mod http;
pub(crate) mod memory;
mod missed;
mod offset;
mod race;
mod recorder;
mod reload;
mod retry;
mod run;
mod slots;
mod triggers;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::clock::cluster::ClusterClock;
use crate::config::{Config, JobConfig, StoreConfig};
use crate::control::{Control, Intent};
use crate::history::{Entry, Kind};
use crate::lock::{Holder, Overlap, Series};
use crate::logging::events;
use crate::membership::Running;
use crate::schedule::Tick;
use crate::shutdown::Shutdown;
use crate::store::Store;

use self::agenda::Agenda;
use self::recorder::Recorder;

/// The longest single sleep: a worker re-reads the wall clock at least this often, so that a clock step
/// (NTP, a VM resumed) moves its next wake-up with it.
const MAX_SLEEP: Duration = Duration::from_secs(30);

/// How often a worker that schedules nothing until the store's clocks are measured looks whether they
/// have been (it is also woken when they are).
const UNMEASURED_POLL: Duration = Duration::from_millis(250);

/// Failures that stop the worker before it starts.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("lock store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("cannot listen on {address} (worker.listen): {source}")]
    Listen {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
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
    pub(crate) secret_env_vars: BTreeSet<String>,
    /// This process's environment, read once at start (nothing here changes it): what a job may inherit
    /// ([`env`]), without reading and copying the whole environment again for every run.
    pub(crate) worker_env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    /// Jobs with `overlap: skip` that this worker is running, with how many runs of each are under way
    /// (more than one only while a run whose lease was lost is still being stopped).
    busy: Mutex<HashMap<String, usize>>,
    /// (job, other worker, its fingerprint) already warned about by `note_other_definition`.
    definitions_seen: Mutex<HashSet<(String, String, String)>>,
    /// The store entries already warned about by `warn_skipped`.
    skipped_seen: Mutex<HashSet<String>>,
    /// The history writer: every fact about a tick goes to the store through it.
    pub(crate) recorder: Recorder,
    /// The runs under way on this worker, by run id (for the heartbeat).
    running: Mutex<BTreeMap<String, Running>>,
    /// The missed-tick checker, once started.
    sentinel: OnceLock<missed::Sentinel>,
    /// The fingerprint of the config in force ([`Config::fingerprint`]), for the heartbeat.
    config_fingerprint: Mutex<String>,
    /// The jobs of the config in force (the disabled ones too), for the trigger requests and the retries,
    /// which look their job up when they are due.
    jobs: Mutex<Vec<Arc<JobConfig>>>,
    /// What `/metrics` serves: each fact is recorded where it is logged.
    pub(crate) metrics: crate::metrics::Metrics,
    /// The slots for running children (a run waits for one before it spawns).
    pub(crate) child_slots: slots::ChildSlots,
    /// The live workers, as last read from the store after a heartbeat (`None` until then): the claim
    /// order ranks them ([`crate::lock::order`]).
    live_members: Mutex<Option<Vec<String>>>,
    /// The config in force, for the dashboard, which shows its jobs and takes its tokens.
    config: Mutex<Arc<Config>>,
    /// Who asked for each trigger request this worker raced (its `by`), by request id, while the request
    /// is remembered ([`triggers`]): the run's entry names them, so the history keeps who triggered it.
    requesters: Mutex<HashMap<String, String>>,
}

/// Runs the worker until `control` asks it to drain and every running job has ended and released its
/// lease; reloads the config file when `control` asks.
///
/// A store's nodes (Redis nodes, etcd members) that are down at start or later do not stop the worker: it
/// logs them and races again at the next tick. What stops it at start: a store that can never be used,
/// and a `worker.listen` address it cannot bind.
pub async fn run(config: Config, control: Control) -> Result<(), WorkerError> {
    apply_process_settings();
    // One copy of the config, shared with the context (the dashboard, `/readyz`): a copy each held its
    // jobs' definitions a second time.
    let config = Arc::new(config);
    let store = open_store(&config).await?;
    if let Err(error) = crate::clock::boot::start_alarm() {
        warn!(
            event = events::clock::ALARM_UNAVAILABLE,
            error = %error,
            "Cannot make the boot-clock timer (a timerfd and its thread): lease deadlines are checked once a \
             second instead, so a job may outlive its lease by up to a second after a suspend"
        );
    }
    let listener = http::bind(config.worker.listen).await?;
    serve(config, store, listener, control).await;
    Ok(())
}

/// Before any job runs: jobs must neither read the worker's memory nor leave processes behind. A setting
/// the host refuses is logged (docs/logs.md says what is lost) and the worker goes on.
fn apply_process_settings() {
    let settings = [
        ("not_dumpable", env::hide_from_jobs()),
        (
            "child_subreaper",
            crate::process::reaper::become_subreaper(),
        ),
    ];
    for (setting, result) in settings {
        if let Err(error) = result {
            warn!(event = events::worker::SETTING_FAILED, setting, error = %error,
                  "Cannot apply a process setting of the worker (docs/logs.md says what is lost)");
        }
    }
}

/// The store `config` names, prepared: a store that can never be used (the SQL server refused the
/// login, …) is an error; one that does not answer yet is retried by every call, as nodes down at start
/// are. The embedded store is used with a warning that it is no shared store.
async fn open_store(config: &Config) -> Result<Store, WorkerError> {
    let store = Store::open(config)?;
    store.prepare().await?;
    if let StoreConfig::Embedded(embedded) = &config.store {
        warn!(
            event = events::worker::EMBEDDED_STORE,
            path = %embedded.path.display(),
            "No shared store in the config (redis:, etcd:, zookeeper:, postgres: or mysql:): every host that runs this file runs every job. \
             The embedded store is a database file of this host, which the workers on this host share; configure Redis nodes, \
             an etcd cluster, a ZooKeeper ensemble or a SQL server to run each job once across several hosts."
        );
    }
    Ok(store)
}

/// Runs the worker on `store`, answering on `listener` (if `worker.listen` is set), until `control`
/// drains it: starts the background tasks, schedules and races the ticks, then stops everything in the
/// order that lets running jobs finish and their history reach the store.
async fn serve(
    config: Arc<Config>,
    store: Store,
    listener: Option<tokio::net::TcpListener>,
    mut control: Control,
) {
    let (context, limits) = start_context(&config, store, control.shutdown(), listener.is_some());
    let server = http::Server::start(listener, &context, &config.worker, limits);
    let recorder_task = recorder::start(Arc::clone(&context));
    let heartbeat = heartbeat::Heartbeat::start(
        Arc::clone(&context),
        heartbeat::Identity {
            every: config.worker.heartbeat_every,
            started_at: context.clock.now(),
        },
    );
    // The first ticks are scheduled on the measured cluster time (the start waits about a second for the
    // first measurement; if the store's clocks cannot be measured by then, see `schedule`).
    let clock_task = offset::start(Arc::clone(&context), &config.worker).await;
    let (sentinel, sentinel_task) = missed::Sentinel::start(
        Arc::clone(&context),
        enabled_jobs(&context.jobs()),
        config.worker.max_clock_offset,
    );
    let _ = context.sentinel.set(sentinel);
    let triggers_task = triggers::start(Arc::clone(&context));

    schedule(&context, config, &mut control).await;

    if let Some(task) = clock_task {
        let _ = task.await;
    }
    let _ = sentinel_task.await;
    let _ = triggers_task.await;
    // Every run has ended its own processes; what none of them could tell was its own goes now.
    crate::process::reaper::sweep(Duration::from_secs(2)).await;
    heartbeat.stop().await;
    context.recorder.close();
    let _ = recorder_task.await;
    server.stop().await;
    info!(event = events::worker::STOPPED, "Worker stopped");
}

/// The worker's shared state on `store` for `config`, and the listener's limits: the children's slots
/// are what the open-file limit (raised as far as allowed) leaves beside the listener's connections
/// (none set aside when the worker does not listen). Logs `worker.started`.
fn start_context(
    config: &Arc<Config>,
    store: Store,
    shutdown: &Shutdown,
    listening: bool,
) -> (Arc<Context>, http::Limits) {
    let all_jobs = shared_jobs(config);
    let jobs = enabled_jobs(&all_jobs);
    let fd_limit = slots::raise_fd_limit();
    let fds = fd_limit.map_or(1_024, |l| l.after);
    let connections = if listening {
        slots::listener_connections(fds)
    } else {
        0
    };
    let listener_fds = if listening {
        slots::listener_fds(connections)
    } else {
        0
    };
    let child_slots = slots::ChildSlots::new(slots::slots_for(fds, listener_fds));
    info!(
        event = events::worker::STARTED,
        config = %config.path.display(),
        nodes = %store.describe(),
        jobs = %jobs.iter().map(|job| job.name.as_str()).collect::<Vec<_>>().join(","),
        ttl_ms = config.lock.ttl.as_millis() as u64,
        renew_every_ms = config.lock.renew_every.as_millis() as u64,
        pid = std::process::id(),
        fd_limit = fd_limit.map_or(0, |l| l.after),
        max_children = child_slots.capacity(),
        max_connections = connections as u64,
        "Worker started"
    );
    let context = Arc::new(Context {
        store,
        clock: ClusterClock::local(),
        worker_id: config.worker.id.clone(),
        shutdown: shutdown.clone(),
        shutdown_grace: config.worker.shutdown_grace,
        secret_env_vars: config.secret_env_vars.clone(),
        worker_env: std::env::vars_os().collect(),
        busy: Mutex::new(HashMap::new()),
        definitions_seen: Mutex::new(HashSet::new()),
        skipped_seen: Mutex::new(HashSet::new()),
        recorder: Recorder::new(),
        running: Mutex::new(BTreeMap::new()),
        sentinel: OnceLock::new(),
        config_fingerprint: Mutex::new(config.fingerprint()),
        jobs: Mutex::new(all_jobs),
        metrics: crate::metrics::Metrics::new(jobs.iter().map(|job| job.name.as_str())),
        child_slots,
        live_members: Mutex::new(None),
        config: Mutex::new(Arc::clone(config)),
        requesters: Mutex::new(HashMap::new()),
    });
    let limits = http::Limits {
        connections,
        header_timeout: http::HEADER_TIMEOUT,
        request_timeout: http::REQUEST_TIMEOUT,
    };
    (context, limits)
}

/// Sleeps until each next tick and races the ticks due, reloading the config when `control` asks, until
/// it asks to drain; then waits for every race (and the runs they started) to end.
async fn schedule(context: &Arc<Context>, mut config: Arc<Config>, control: &mut Control) {
    let clock = &context.clock;
    // One task per batch of due ticks: it claims them and runs the ones won. The loop itself never waits
    // for the store, so a slow race (retries, a hung node) cannot delay the next tick of another job.
    let mut races: JoinSet<()> = JoinSet::new();
    let mut agenda = Agenda::new(enabled_jobs(&context.jobs()), clock.now());
    say_ticks_from_before_start(&agenda, clock.now());
    // A store with clocks that could not be measured at start: no tick is scheduled until they are, since
    // this host's clock may be seconds ahead of them, and a tick raced on it would be claimed that early
    // (and make the job's earlier ticks unclaimable for every worker, G1′). The ticks of that stretch are
    // the other workers' to run, and the missed-tick checker's to look back at (a worker restarted 3 s
    // ahead while its store was down would otherwise race on its own clock).
    let mut scheduling = clock.is_known();

    loop {
        if !scheduling && clock.is_known() {
            scheduling = true;
            agenda = agenda.restart(clock.now());
            say_ticks_from_before_start(&agenda, clock.now());
        }
        let wait = match agenda.next_tick() {
            _ if !scheduling => UNMEASURED_POLL,
            None => MAX_SLEEP,
            Some(next) => (next.to_utc() - clock.now())
                .to_std()
                .unwrap_or(Duration::ZERO),
        };
        tokio::select! {
            intent = control.next() => match intent {
                Intent::Drain => break,
                Intent::Reload { why } => {
                    // The ticks due by now belong to the config they came due under: raced (or passed
                    // over, with a word) before a changed job starts again from its next tick.
                    if scheduling {
                        start_due(context, &mut agenda, &mut races);
                    }
                    if let Some(new) = reload::reload(context, &config, why) {
                        let all_jobs = shared_jobs(&new);
                        agenda = agenda.reload(enabled_jobs(&all_jobs), clock.now());
                        context.set_jobs(all_jobs);
                        config = new;
                    }
                    continue;
                }
            },
            _ = tokio::time::sleep(wait.min(MAX_SLEEP)) => {}
            // A new clock offset moves the instant this sleep aims at: aim again.
            () = clock.moved() => continue,
            Some(ended) = races.join_next() => {
                background::log_panic("race", ended);
                continue;
            }
        }
        if scheduling {
            start_due(context, &mut agenda, &mut races);
        }
    }

    info!(
        event = events::worker::STOPPING,
        running = context.busy_count(),
        grace_ms = context.shutdown_grace.as_millis() as u64,
        "Stopping: no new ticks; running jobs get the shutdown grace"
    );
    while let Some(ended) = races.join_next().await {
        background::log_panic("race", ended);
    }
}

/// Takes the ticks of `agenda` due by now (cluster time): logs and records those passed over, skips those
/// of a job still running here (`overlap: skip`), and races the rest as one batch.
fn start_due(context: &Arc<Context>, agenda: &mut Agenda, races: &mut JoinSet<()>) {
    let mut batch = Vec::new();
    let due = agenda.take_due(context.clock.now());
    for (index, tick, why) in due.passed {
        let job = agenda.job(index);
        context.note(
            job,
            tick,
            &Series::Schedule,
            Kind::Skipped,
            Some(why.as_str()),
            None,
        );
        if why == agenda::Passed::Misfire {
            context.suspect(job, tick);
        }
    }
    for (index, tick) in due.race {
        let job = agenda.job(index);
        // Only a run under way here makes a tick skip for overlap: a tick whose claim is still being
        // raced (a slow batch, retries) holds nothing, and the nodes decide between it and the next.
        if job.overlap == Overlap::Skip && context.runs_here(&job.name) {
            info!(event = events::tick::SKIPPED, job = %job.name, tick = %tick, reason = "overlap",
                      "Skipped: this worker is still running the previous tick");
            // Any other live worker races the tick and finds the job busy, and records that (once, naming
            // this worker): written here only when no other worker is there to.
            if context.races_alone(&job.name, tick) {
                context.note(
                    job,
                    tick,
                    &Series::Schedule,
                    Kind::Skipped,
                    Some("overlap"),
                    None,
                );
            } else {
                context.metrics.tick_skipped(&job.name, "overlap");
            }
            continue;
        }
        batch.push(race::Due::scheduled(job, tick));
    }
    if !batch.is_empty() {
        races.spawn(race::race(Arc::clone(context), batch));
    }
}

/// The jobs of `config` (the disabled ones too), each held once and shared by the agenda, the context and
/// every claim of it: a tick clones a pointer, not the job's definition.
fn shared_jobs(config: &Config) -> Vec<Arc<JobConfig>> {
    config.jobs.iter().cloned().map(Arc::new).collect()
}

/// The jobs of `jobs` that are raced.
fn enabled_jobs(jobs: &[Arc<JobConfig>]) -> Vec<Arc<JobConfig>> {
    jobs.iter().filter(|job| job.enabled).cloned().collect()
}

/// `members` and `me` (counted even if the view does not list it yet, as the claim order does), in
/// the claim order of `(job, tick)`: index `i` is the worker whose [`crate::lock::order::rank`] is `i`.
fn in_claim_order(mut members: Vec<String>, me: &str, job: &str, tick: Tick) -> Vec<String> {
    if !members.iter().any(|member| member == me) {
        members.push(me.to_string());
    }
    let mut placed: Vec<(usize, String)> = members
        .iter()
        .map(|member| {
            (
                crate::lock::order::rank(&members, member, job, tick),
                member.clone(),
            )
        })
        .collect();
    placed.sort();
    placed.into_iter().map(|(_, member)| member).collect()
}

impl Context {
    /// A history entry of `kind` by this worker for `(job, tick)` in `series`, stamped now (cluster time).
    pub(crate) fn entry(&self, job: &JobConfig, tick: Tick, series: &Series, kind: Kind) -> Entry {
        let mut entry = Entry::new(&job.name, tick, &self.worker_id, kind, self.clock.now());
        entry.fingerprint = Some(job.fingerprint());
        if let (Kind::Run, Some(id)) = (kind, series.trigger()) {
            let requesters = self.requesters.lock().unwrap_or_else(|p| p.into_inner());
            entry.by = requesters.get(id).cloned();
        }
        entry.in_series(series)
    }

    /// Records that this worker did not run `(job, tick)` of `series`: `kind` with its reason and the other
    /// claimant.
    fn note(
        &self,
        job: &JobConfig,
        tick: Tick,
        series: &Series,
        kind: Kind,
        reason: Option<&str>,
        by: Option<&str>,
    ) {
        if kind == Kind::Skipped {
            let reason = reason.unwrap_or("unknown");
            self.metrics.tick_skipped(&job.name, reason);
        }
        let mut entry = self.entry(job, tick, series, kind);
        entry.reason = reason.map(str::to_string);
        entry.by = by.map(str::to_string);
        self.recorder.note(entry);
    }

    /// The workers ranked for `(job, tick)` as this worker's claim order ranks them
    /// ([`crate::lock::order::rank`] over its view of the live members, itself included): place 0 claims
    /// first. `None` before the first view. A winner's run entry names them (`raced`); a loser finds
    /// out from it whether its loss was routine.
    pub(crate) fn ranked(&self, job: &str, tick: Tick) -> Option<Vec<String>> {
        let members = self.live_members()?;
        Some(in_claim_order(members, &self.worker_id, job, tick))
    }

    /// Whether no other worker races `(job, tick)`: the store is not shared, or this worker's view of
    /// the live members is itself alone. A skip only this worker sees is then the tick's only account.
    fn races_alone(&self, job: &str, tick: Tick) -> bool {
        !self.store.is_shared()
            || self
                .ranked(job, tick)
                .is_none_or(|ranked| ranked.iter().all(|member| *member == self.worker_id))
    }

    /// Warns about each entry a read of the store skipped ([`crate::store::Read::skipped`]: garbage, or a
    /// request no `redcron` wrote), once per entry and node: the readers that find it again every second
    /// do not repeat it.
    pub(crate) fn warn_skipped(&self, skipped: &[String]) {
        /// Beyond this many entries warned about, the memory of them starts afresh.
        const REMEMBERED: usize = 10_000;
        if skipped.is_empty() {
            return;
        }
        let mut seen = self.skipped_seen.lock().unwrap_or_else(|p| p.into_inner());
        for note in skipped {
            if seen.len() >= REMEMBERED {
                seen.clear();
            }
            if seen.insert(note.clone()) {
                warn!(event = events::store::ENTRY_SKIPPED, error = %note,
                      "An entry in the store cannot be read (or is not one redcron can have written): skipped");
            }
        }
    }

    /// Has `(job, tick)` checked for a miss once its window has ended.
    fn suspect(&self, job: &Arc<JobConfig>, tick: Tick) {
        if let Some(sentinel) = self.sentinel.get() {
            sentinel.suspect(job, tick);
        }
    }

    /// The enabled job `name` of the config in force, if there is one.
    fn job(&self, name: &str) -> Option<Arc<JobConfig>> {
        self.job_now(name).ok()
    }

    /// The job `name` as the config in force defines it now, if it is enabled; else why not: `removed`
    /// (no such job: removed or renamed by a reload) or `disabled`. The definition is shared, not copied:
    /// the trigger poller asks every second, and a worker may run thousands of jobs.
    fn job_now(&self, name: &str) -> Result<Arc<JobConfig>, &'static str> {
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        match jobs.iter().find(|job| job.name == name) {
            Some(job) if job.enabled => Ok(Arc::clone(job)),
            Some(_) => Err("disabled"),
            None => Err("removed"),
        }
    }

    /// The config in force.
    pub(crate) fn config(&self) -> Arc<Config> {
        Arc::clone(&self.config.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Replaces the config in force after a reload (shared with the worker's loop, not copied).
    fn set_config(&self, config: Arc<Config>) {
        *self.config.lock().unwrap_or_else(|p| p.into_inner()) = config;
    }

    /// The jobs of the config in force, the disabled ones too.
    fn jobs(&self) -> Vec<Arc<JobConfig>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the jobs after a reload.
    fn set_jobs(&self, jobs: Vec<Arc<JobConfig>>) {
        *self.jobs.lock().unwrap_or_else(|p| p.into_inner()) = jobs;
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
        self.busy.lock().map_or(0, |busy| busy.values().sum())
    }

    /// The live workers as last read, sorted (`None` before the first read).
    fn live_members(&self) -> Option<Vec<String>> {
        self.live_members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the view of the live workers; `true` if it changed.
    fn set_live_members(&self, members: Vec<String>) -> bool {
        let mut view = self.live_members.lock().unwrap_or_else(|p| p.into_inner());
        let changed = view.as_ref() != Some(&members);
        *view = Some(members);
        changed
    }

    /// Whether a run of `job` is under way on this worker.
    fn runs_here(&self, job: &str) -> bool {
        self.busy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .contains_key(job)
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
            warn!(event = events::job::CONFIG_DIFFERS, job = %job.name, tick = %tick, other_worker = %other.worker,
                  fingerprint = %ours, other_fingerprint = %theirs,
                  "Another worker runs a different definition of this job (a rollout in progress?); each tick still runs once");
        }
    }
}

/// Marks a job as running on this worker (for `overlap: skip`) until dropped.
struct BusyGuard {
    context: Arc<Context>,
    job: String,
}

impl BusyGuard {
    /// Counts one more run of `job` under way here.
    fn enter(context: &Arc<Context>, job: &str) -> BusyGuard {
        let mut busy = context
            .busy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *busy.entry(job.to_string()).or_default() += 1;
        BusyGuard {
            context: Arc::clone(context),
            job: job.to_string(),
        }
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let mut busy = self
            .context
            .busy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(runs) = busy.get_mut(&self.job) {
            *runs -= 1;
            if *runs == 0 {
                busy.remove(&self.job);
            }
        }
    }
}

/// Says of each tick from before the start that the agenda races (within its job's misfire grace) that
/// it does and why: a first start that ran a tick of a minute ago without a word looked like a bug. One
/// event a job for the first [`FROM_BEFORE_START_SAID`], then one for the rest (a fleet of jobs every
/// second has one such tick each).
fn say_ticks_from_before_start(agenda: &Agenda, now: chrono::DateTime<chrono::Utc>) {
    let ticks = agenda.before(now);
    for (job, tick) in ticks.iter().take(FROM_BEFORE_START_SAID) {
        let late_ms = (now.timestamp_millis() - tick.as_millis()).max(0) as u64;
        info!(event = events::tick::FROM_BEFORE_START, job = %job.name, tick = %tick, late_ms,
              misfire_grace_ms = job.misfire_grace.as_millis() as u64, count = 1u64,
              "Racing a tick from before this worker started: it is within the job's misfire_grace (if another worker ran it, the claim says so; misfire_grace: 0s races only the ticks to come)");
    }
    if let Some(rest) = ticks
        .len()
        .checked_sub(FROM_BEFORE_START_SAID)
        .filter(|n| *n > 0)
    {
        info!(event = events::tick::FROM_BEFORE_START, count = rest as u64,
              "Racing ticks from before this worker started for {rest} more jobs: each is within its job's misfire_grace");
    }
}

/// How many jobs' ticks from before the start are logged one by one.
const FROM_BEFORE_START_SAID: usize = 10;

#[cfg(test)]
mod tests {
    use super::*;

    /// The order a run entry names (`raced`) is the claim order itself: each worker's index is the place
    /// from which it claims, on its own view and on every other worker's with the same members.
    #[test]
    fn the_raced_order_is_the_claim_order() {
        let members: Vec<String> = ["a", "b", "c", "d"].iter().map(|m| m.to_string()).collect();
        for tick in [Tick(1_000), Tick(2_000), Tick(3_000)] {
            let ordered = in_claim_order(members[..3].to_vec(), "d", "job", tick);
            assert_eq!(ordered.len(), 4);
            for (place, member) in ordered.iter().enumerate() {
                assert_eq!(
                    crate::lock::order::rank(&members, member, "job", tick),
                    place
                );
            }
            assert_eq!(ordered, in_claim_order(members.clone(), "a", "job", tick));
        }
    }
}
