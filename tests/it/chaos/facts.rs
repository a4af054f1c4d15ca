//! What the checker reasons about, distilled from the raw material: worker lifetimes and pauses, clock
//! offsets, unusable nodes (from the [`Timeline`]), and claims, runs and measured clock offsets (from
//! the workers' JSON logs).
//!
//! A worker races a tick when its *cluster time* — its wall clock (skewed by the plan) plus the offset
//! to the nodes' clocks it measured and logged in `clock.offset` — reads the tick ([`Facts::skew_at`]).
//! A wall-clock step therefore moves its races until its next measurement puts them back.
//!
//! All times are real time in Unix milliseconds: the timeline's entries were stamped by the harness when
//! it acted, a log event by the harness when the line arrived (not by the worker's possibly skewed
//! clock), a ledger attempt by the ledger server.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::checker::JobSpec;
use super::plan::{PROXIED_NODE, WORKERS};
use super::timeline::{Happening, Timeline};

/// "Never", as an interval end.
pub const NEVER: i64 = i64::MAX / 4;
/// A node counts as unusable this long after it is back (reconnection, script reload).
const NODE_RECOVERY_MS: i64 = 2_000;
/// A change of a worker's measured offset by more than this is a step of its cluster time.
const CORRECTION_STEP_MS: i64 = 100;
/// A measured stall is widened by this much on each side (the probe samples every 40 ms).
const STALL_MARGIN_MS: i64 = 100;
/// The proxied node counts as unusable this long after the proxy is clean again.
const PROXY_RECOVERY_MS: i64 = 1_000;

/// The log of one worker process, as the harness captured it.
#[derive(Debug, Clone, Default)]
pub struct InstanceLog {
    pub instance: usize,
    pub worker: usize,
    /// Each event with the real time its line arrived.
    pub events: Vec<(i64, Value)>,
    /// Lines that are not JSON objects.
    pub bad_lines: Vec<String>,
}

/// The life of one worker process.
#[derive(Debug, Clone)]
pub struct Life {
    pub worker: usize,
    /// The config version it runs.
    pub config: usize,
    /// When it logged `worker.started` (it races nothing before), or [`NEVER`].
    pub ready: i64,
    /// When it was killed or told to shut down, or [`NEVER`].
    pub end: i64,
    pub killed: Option<i64>,
    /// SIGSTOP .. SIGCONT intervals.
    pub stops: Vec<(i64, i64)>,
}

impl Life {
    /// Up and not paused during all of `[a, b]`.
    pub fn running_throughout(&self, a: i64, b: i64) -> bool {
        self.ready <= a && b <= self.end && self.stops.iter().all(|&(s, e)| e <= a || s >= b)
    }

    /// Paused at some point of `[a, b]`, or killed before `b`.
    pub fn disturbed_in(&self, a: i64, b: i64) -> bool {
        self.stops.iter().any(|&(s, e)| s <= b && e >= a) || self.killed.is_some_and(|k| k <= b)
    }

    /// Alive (spawned, not yet killed) but paused at some point of `[a, b]`.
    pub fn paused_in(&self, a: i64, b: i64) -> bool {
        self.stops.iter().any(|&(s, e)| s <= b && e >= a)
    }

    /// The starts of pauses, and the kill, within `[a, b]`: the moments it stopped renewing.
    pub fn disturbances_in(&self, a: i64, b: i64) -> Vec<i64> {
        let mut found: Vec<i64> = self.stops.iter().map(|&(s, _)| s).collect();
        found.extend(self.killed);
        found.retain(|&t| a <= t && t <= b);
        found
    }
}

/// A ghost contender's keys, as the harness wrote them (see `Happening::Ghost`).
#[derive(Debug, Clone)]
pub struct GhostKeys {
    pub at: i64,
    pub job: String,
    pub tick: i64,
    /// Its lease key is the job's only one (`overlap: skip`), not the tick's.
    pub skip_key: bool,
    pub ttl_ms: u64,
    pub leased: Vec<usize>,
    pub confirmed: Vec<usize>,
}

/// A garbage plant, as the harness wrote it (see `Happening::Garbage`).
#[derive(Debug, Clone)]
pub struct GarbagePlant {
    pub at: i64,
    pub tag: u8,
    pub nodes: Vec<usize>,
    /// The ids of the trigger requests and member records written.
    pub keys: Vec<String>,
    /// The job whose junk history entry was written, if it was.
    pub history: Option<String>,
    /// The writes that reported a failure. On etcd or SQL such a write may still have landed (the store
    /// committed it and the reply was lost, e.g. to a member killed just then), so a worker that skips
    /// one of these keys skipped garbage all the same.
    pub failed: Vec<String>,
}

/// A `tick.won`, and the run that followed it, if any.
#[derive(Debug, Clone)]
pub struct Run {
    pub instance: usize,
    pub worker: usize,
    pub job: String,
    pub tick: i64,
    pub token: u64,
    pub won_at: i64,
    /// From `run.started`.
    pub run_id: Option<String>,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub outcome: Option<String>,
    pub duration_ms: Option<u64>,
    /// The claim's series when it is not the schedule: `trigger <id>` or `attempt <n>` (fields of
    /// `tick.won`).
    pub series: Option<String>,
}

/// What one process logged about one job: per tick, each `event:reason` with its arrival time.
pub type Logged = BTreeMap<i64, Vec<(String, i64)>>;

/// The tick-level facts in the logs, with the instance that logged them.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The store's nodes (Redis) or members (etcd): a majority of them is a quorum.
    pub nodes: usize,
    pub lives: Vec<Life>,
    /// Per worker: `(from, offset)` steps of its wall clock, in time order.
    pub offsets: Vec<Vec<(i64, i64)>>,
    /// Per worker: `(from, offset_ms)` of its measured offset to the nodes' clocks (`clock.offset`;
    /// `None` from each `worker.started` until the process measured), in time order.
    pub measured: Vec<Vec<(i64, Option<i64>)>>,
    /// Per worker: `(at, size)` of each change of its measured offset by more than
    /// [`CORRECTION_STEP_MS`] within one process: a step of its cluster time.
    pub corrections: Vec<Vec<(i64, i64)>>,
    /// Per node: intervals when it could not be counted on, from the plan's faults.
    pub unusable: Vec<Vec<(i64, i64)>>,
    /// Per node: stalls the probe measured.
    pub stalled: Vec<Vec<(i64, i64)>>,
    /// Every `tick.won`, with its run.
    pub runs: Vec<Run>,
    /// `run.started` events that no `tick.won` of the same instance announced (should not happen).
    pub orphan_starts: Vec<String>,
    /// Per `(instance, job)`, per tick: the events logged for it (`tick.lost:busy`,
    /// `tick.skipped:overlap`…) with their arrival times.
    pub outcomes: HashMap<(usize, String), Logged>,
    /// Events that could not be read (missing or malformed fields).
    pub malformed: Vec<String>,
    /// Ghost contenders' keys.
    pub ghosts: Vec<GhostKeys>,
    /// Garbage plants.
    pub garbage: Vec<GarbagePlant>,
    /// Per instance: the `error` of each `store.entry_skipped` it logged, with its arrival time.
    pub entries_skipped: HashMap<usize, Vec<(i64, String)>>,
    /// Kills aimed at a race: `(at, instance, tick)`.
    pub aimed: Vec<(i64, usize, i64)>,
    /// Per instance: when it logged `clock.unmeasured` (it could not measure its offset to the store).
    pub unmeasured: HashMap<usize, Vec<i64>>,
    /// Per `(instance, job, tick)`: the holders that `tick.lost: busy` named, with the tick each held
    /// the job's lease for (what the nodes answered).
    pub busy: HashMap<(usize, String, i64), Vec<BusyAnswer>>,
    /// The node serving on each client port (`Happening::NodePort`).
    pub ports: HashMap<u16, usize>,
    /// Per instance: `(at, node)` each time its ZooKeeper client established its session on a member
    /// (the client's own log line), in time order. Every request of the session goes to that member
    /// until the next.
    pub sessions: HashMap<usize, Vec<(i64, usize)>>,
    /// Per instance: `(from, until)` of each hold-off it logged (`store.node_restarted` with a
    /// `held_ms` over 0): its answers from the node under that label (on a Sentinel group, node 0)
    /// did not count until then.
    pub held_off: HashMap<usize, Vec<(i64, i64)>>,
    /// Per instance: `(from, to, node)` for each failed try of its ZooKeeper client to establish its
    /// disconnected session on a member (`fails to establish session to tcp://…`, logged at `to`), from
    /// the client's line before it (the `enter state Disconnected …` that began the move, or the
    /// previous try's end). During a try the session rides no member: every request waits for that
    /// one member to answer the connect.
    pub session_tries: HashMap<usize, Vec<(i64, i64, usize)>>,
}

/// What the ZooKeeper client logs (target `zookeeper_client::session`) when its session is established
/// on a member, or moved to another: `… to tcp://127.0.0.1:2181` (`tcp+tls://` with TLS).
const SESSION_ESTABLISHED: &str = "succeeds to establish session to ";

/// What the ZooKeeper client logs when a try to establish its session on a member failed:
/// `… to tcp://127.0.0.1:2181 due to <why>`.
const SESSION_NOT_ESTABLISHED: &str = "fails to establish session to ";

/// The target of the ZooKeeper client's session lines (`event` in the worker's JSON log).
const SESSION_TARGET: &str = "zookeeper_client::session";

/// A holder named by `tick.lost: busy`, and the tick it held the lease for.
pub type BusyAnswer = (String, Option<i64>);

/// An RFC 3339 instant as Unix ms.
pub fn parse_instant(text: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis())
}

impl Facts {
    /// The facts of a run on `nodes` nodes (or members).
    pub fn gather(timeline: &Timeline, logs: &[InstanceLog], nodes: usize) -> Facts {
        let mut facts = Facts {
            nodes,
            offsets: vec![Vec::new(); WORKERS],
            measured: vec![Vec::new(); WORKERS],
            corrections: vec![Vec::new(); WORKERS],
            unusable: vec![Vec::new(); nodes],
            stalled: vec![Vec::new(); nodes],
            ..Facts::default()
        };
        let mut down_since: Vec<Option<i64>> = vec![None; nodes];
        // Faults of a node under way: each `NodeDown` is answered by one `NodeUp`, and a node whose
        // faults overlap (a Sentinel group's replica hung while it still recovers from its master's)
        // is out of reach from the first until the last is over.
        let mut down_depth: Vec<usize> = vec![0; nodes];
        let mut proxy_since: Option<i64> = None;
        for (at, happening) in &timeline.entries {
            let at = *at;
            match happening {
                Happening::WorkerSpawned {
                    worker,
                    instance,
                    config,
                } => {
                    if facts.lives.len() <= *instance {
                        facts.lives.resize(
                            instance + 1,
                            Life {
                                worker: 0,
                                config: 0,
                                ready: NEVER,
                                end: NEVER,
                                killed: None,
                                stops: Vec::new(),
                            },
                        );
                    }
                    facts.lives[*instance].worker = *worker;
                    facts.lives[*instance].config = *config;
                }
                Happening::WorkerStopped { instance } => {
                    facts.lives[*instance].stops.push((at, NEVER))
                }
                Happening::WorkerContinued { instance } => {
                    if let Some(stop) = facts.lives[*instance].stops.last_mut() {
                        stop.1 = stop.1.min(at);
                    }
                }
                Happening::WorkerKilled { instance } => {
                    let life = &mut facts.lives[*instance];
                    life.killed = Some(at);
                    life.end = life.end.min(at);
                }
                Happening::WorkerShutdown { instance } => {
                    let life = &mut facts.lives[*instance];
                    life.end = life.end.min(at);
                }
                Happening::NodePort { node, port } => {
                    facts.ports.insert(*port, *node);
                }
                Happening::NodeDown { node, .. } => {
                    down_depth[*node] += 1;
                    down_since[*node].get_or_insert(at);
                }
                Happening::NodeUp { node } => {
                    down_depth[*node] = down_depth[*node].saturating_sub(1);
                    if down_depth[*node] == 0 {
                        if let Some(since) = down_since[*node].take() {
                            facts.unusable[*node].push((since, at + NODE_RECOVERY_MS));
                        }
                    }
                }
                Happening::NodeStalled { node, until } => {
                    facts.stalled[*node].push((at - STALL_MARGIN_MS, until + STALL_MARGIN_MS));
                }
                Happening::Proxy { mode } => match (mode.is_clean(), proxy_since) {
                    (false, None) => proxy_since = Some(at),
                    (true, Some(since)) => {
                        facts.unusable[PROXIED_NODE].push((since, at + PROXY_RECOVERY_MS));
                        proxy_since = None;
                    }
                    _ => {}
                },
                Happening::Clock { worker, offset_ms } => {
                    facts.offsets[*worker].push((at, *offset_ms))
                }
                Happening::Ghost {
                    job,
                    tick,
                    key,
                    ttl_ms,
                    leased,
                    confirmed,
                    ..
                } => facts.ghosts.push(GhostKeys {
                    at,
                    job: job.clone(),
                    tick: *tick,
                    skip_key: key.ends_with(":lease"),
                    ttl_ms: *ttl_ms,
                    leased: leased.clone(),
                    confirmed: confirmed.clone(),
                }),
                Happening::AimedKill { instance, tick } => facts.aimed.push((at, *instance, *tick)),
                Happening::Garbage {
                    tag,
                    nodes,
                    requests,
                    members,
                    history,
                    failed,
                } => facts.garbage.push(GarbagePlant {
                    at,
                    tag: *tag,
                    nodes: nodes.clone(),
                    keys: requests.iter().chain(members).cloned().collect(),
                    history: history.clone(),
                    failed: failed.clone(),
                }),
                // A group's data nodes are not nodes of the majority: what a fault of its master does
                // to the group, node 0, comes as `NodeDown` and `NodeUp` of node 0.
                Happening::CaseBegan { .. }
                | Happening::Skipped { .. }
                | Happening::Rollout { .. }
                | Happening::DataNodeDown { .. }
                | Happening::DataNodeUp { .. }
                | Happening::FailoverAsked { .. }
                | Happening::GroupServes { .. } => {}
            }
        }
        for (node, since) in down_since.iter().enumerate() {
            if let Some(since) = since {
                facts.unusable[node].push((*since, NEVER));
            }
        }
        if let Some(since) = proxy_since {
            facts.unusable[PROXIED_NODE].push((since, NEVER));
        }
        for log in logs {
            facts.read_log(log);
        }
        for list in &mut facts.measured {
            list.sort_by_key(|&(at, _)| at);
        }
        for list in &mut facts.corrections {
            list.sort_by_key(|&(at, _)| at);
        }
        for list in facts.sessions.values_mut() {
            list.sort_by_key(|&(at, _)| at);
        }
        facts
    }

    fn read_log(&mut self, log: &InstanceLog) {
        let instance = log.instance;
        let mut open: HashMap<(String, i64), usize> = HashMap::new();
        let mut by_run_id: HashMap<String, usize> = HashMap::new();
        let mut last_measured: Option<i64> = None;
        // When the ZooKeeper client last logged a session line: a failed try began there.
        let mut last_session_line: Option<i64> = None;
        for (at, event) in &log.events {
            let name = event["event"].as_str().unwrap_or_default();
            if name == SESSION_TARGET {
                let since = last_session_line.replace(*at);
                if let Some(tried) = event["message"]
                    .as_str()
                    .and_then(|message| message.strip_prefix(SESSION_NOT_ESTABLISHED))
                {
                    if self.ports.is_empty() {
                        continue;
                    }
                    let endpoint = tried.split(' ').next().unwrap_or_default();
                    let port = endpoint.rsplit(':').next().and_then(|p| p.parse().ok());
                    match port.and_then(|port: u16| self.ports.get(&port)) {
                        Some(&node) => {
                            if let Some(from) = since {
                                self.session_tries
                                    .entry(instance)
                                    .or_default()
                                    .push((from, *at, node));
                            }
                        }
                        None => self.malformed.push(format!(
                            "instance {instance}: a session tried on an unknown member: {event}"
                        )),
                    }
                    continue;
                }
            }
            if name == "worker.started" && instance < self.lives.len() {
                self.lives[instance].ready = self.lives[instance].ready.min(*at);
                self.measured[log.worker].push((*at, None));
            }
            if let Some(endpoint) = event["message"]
                .as_str()
                .and_then(|message| message.strip_prefix(SESSION_ESTABLISHED))
            {
                // A run saved before the timeline recorded ports knows no member's port.
                if self.ports.is_empty() {
                    continue;
                }
                let port = endpoint.rsplit(':').next().and_then(|p| p.parse().ok());
                match port.and_then(|port: u16| self.ports.get(&port)) {
                    Some(&node) => self.sessions.entry(instance).or_default().push((*at, node)),
                    None => self.malformed.push(format!(
                        "instance {instance}: a session on an unknown member: {event}"
                    )),
                }
                continue;
            }
            if name == "clock.unmeasured" {
                self.unmeasured.entry(instance).or_default().push(*at);
            }
            if name == "clock.offset" {
                let Some(offset) = event["offset_ms"].as_i64() else {
                    self.malformed.push(format!("instance {instance}: {event}"));
                    continue;
                };
                self.measured[log.worker].push((*at, Some(offset)));
                let change = last_measured.map_or(0, |last| (offset - last).abs());
                if change > CORRECTION_STEP_MS {
                    self.corrections[log.worker].push((*at, change));
                }
                last_measured = Some(offset);
            }
            if name == "store.node_restarted" {
                let held = event["held_ms"].as_i64().unwrap_or(0);
                if held > 0 {
                    self.held_off
                        .entry(instance)
                        .or_default()
                        .push((*at, *at + held));
                }
                continue;
            }
            if name == "store.entry_skipped" {
                let error = event["error"].as_str().unwrap_or_default().to_string();
                self.entries_skipped
                    .entry(instance)
                    .or_default()
                    .push((*at, error));
                continue;
            }
            // `tick.missed_check_failed` is about a job's history as a whole (read at start), not a tick.
            if !name.starts_with("tick.") && !name.starts_with("run.")
                || name == "tick.missed_check_failed"
            {
                continue;
            }
            let job = event["job"].as_str().map(str::to_owned);
            let tick = event["tick"].as_str().and_then(parse_instant);
            let (Some(job), Some(tick)) = (job, tick) else {
                self.malformed.push(format!("instance {instance}: {event}"));
                continue;
            };
            let reason = event["reason"].as_str().unwrap_or_default();
            if name == "tick.lost" && reason == "busy" {
                let holder = event["holder"].as_str().unwrap_or("unknown").to_string();
                let held = event["holder_tick"].as_str().and_then(parse_instant);
                self.busy
                    .entry((instance, job.clone(), tick))
                    .or_default()
                    .push((holder, held));
            }
            let label = if reason.is_empty() {
                name.to_string()
            } else {
                format!("{name}:{reason}")
            };
            self.outcomes
                .entry((instance, job.clone()))
                .or_default()
                .entry(tick)
                .or_default()
                .push((label, *at));
            match name {
                "tick.won" => {
                    let Some(token) = event["token"].as_u64() else {
                        self.malformed.push(format!("instance {instance}: {event}"));
                        continue;
                    };
                    let series = match (event.get("trigger"), event.get("attempt")) {
                        (Some(id), _) => Some(format!("trigger {id}")),
                        (None, Some(attempt)) => Some(format!("attempt {attempt}")),
                        (None, None) => None,
                    };
                    open.insert((job.clone(), tick), self.runs.len());
                    self.runs.push(Run {
                        instance,
                        worker: log.worker,
                        job,
                        tick,
                        token,
                        won_at: *at,
                        run_id: None,
                        started_at: None,
                        finished_at: None,
                        outcome: None,
                        duration_ms: None,
                        series,
                    });
                }
                "run.started" => {
                    let run_id = event["run_id"].as_str().unwrap_or_default().to_string();
                    match open.get(&(job.clone(), tick)) {
                        Some(&index) => {
                            self.runs[index].run_id = Some(run_id.clone());
                            self.runs[index].started_at = Some(*at);
                            by_run_id.insert(run_id, index);
                        }
                        None => self
                            .orphan_starts
                            .push(format!("instance {instance}: {event}")),
                    }
                }
                "run.finished" => {
                    let run_id = event["run_id"].as_str().unwrap_or_default();
                    // A child that could not be spawned ends without run.started (and without run_id
                    // in the index): attach it to the open win.
                    let index = by_run_id
                        .get(run_id)
                        .or_else(|| open.get(&(job.clone(), tick)))
                        .copied();
                    if let Some(index) = index {
                        let run = &mut self.runs[index];
                        run.finished_at = Some(*at);
                        run.outcome = event["outcome"].as_str().map(str::to_owned);
                        run.duration_ms = event["duration_ms"].as_u64();
                    }
                }
                _ => {}
            }
        }
    }

    /// Worker `w`'s wall-clock offset at real time `t`.
    pub fn offset_at(&self, worker: usize, t: i64) -> i64 {
        self.offsets[worker]
            .iter()
            .take_while(|(from, _)| *from <= t)
            .last()
            .map_or(0, |&(_, o)| o)
    }

    /// How far worker `w`'s cluster time is ahead of real time at real time `t`: until its process
    /// measured, its wall clock's offset; after, its wall clock's offset *at the latest measurement* plus
    /// the offset it measured then (within the 50 ms by which a measurement may change before it is
    /// logged again) — cluster time goes on from a measurement on the boot clock, so a step of the wall
    /// clock since moves nothing (`clock::cluster`).
    pub fn skew_at(&self, worker: usize, t: i64) -> i64 {
        let latest = self.measured[worker]
            .iter()
            .take_while(|(from, _)| *from <= t)
            .last();
        match latest {
            Some(&(at, Some(offset))) => self.offset_at(worker, at) + offset,
            _ => self.offset_at(worker, t),
        }
    }

    /// The real time at which worker `w`'s cluster time reads `tick`: when it races that tick.
    pub fn race_time(&self, worker: usize, tick: i64) -> i64 {
        let first = tick - self.skew_at(worker, tick);
        tick - self.skew_at(worker, first)
    }

    /// Whether a step of worker `w`'s clock lies between the real instant `tick` and the instant its
    /// cluster time read `tick` before the step: the two estimates of [`Facts::race_time`] then disagree,
    /// because the step jumped the worker's clock over the tick (or made it come twice). E.g. a clock at
    /// −0.47 s stepped to +2.45 s at 16.38: it would have read 16.000 at 16.47, after the step, and the
    /// estimate with the new skew (13.55) lies before the step; the worker raced the tick late, at the
    /// step, or not at all.
    pub fn straddles_step(&self, worker: usize, tick: i64) -> bool {
        let first = tick - self.skew_at(worker, tick);
        first != self.race_time(worker, tick) && self.near_clock_step(worker, first)
    }

    /// Whether `t` is near a step of worker `w`'s cluster time (it skips or repeats ticks around a
    /// step): a step of its wall clock, or the measurement that corrects it.
    pub fn near_clock_step(&self, worker: usize, t: i64) -> bool {
        let wall_steps = self.offsets[worker]
            .windows(2)
            .map(|pair| (pair[1].0, (pair[1].1 - pair[0].1).abs()));
        let mut steps = wall_steps.chain(self.corrections[worker].iter().copied());
        // libfaketime re-reads its file within a second of the change; the worker measures its offset
        // again within `clock_check_every` (1 s) after that.
        steps.any(|(at, step)| at - 1_000 <= t && t <= at + 2_500 + step)
    }

    /// Whether process `instance` of worker `worker` was still taking its first measurement of the
    /// store's clock at real time `t`: it had started, and neither its first `clock.offset` nor its first
    /// `clock.unmeasured` had come. A starting worker schedules its first ticks on the clock that
    /// measurement gives (docs/guarantees.md, *Clocks*), so a tick due meanwhile is not its to race.
    pub fn starting_at(&self, instance: usize, worker: usize, t: i64) -> bool {
        let ready = self.lives[instance].ready;
        let measured = self.measured[worker]
            .iter()
            .filter(|(at, offset)| *at >= ready && offset.is_some())
            .map(|(at, _)| *at);
        let failed = self
            .unmeasured
            .get(&instance)
            .into_iter()
            .flatten()
            .copied()
            .filter(|&at| at >= ready);
        measured
            .chain(failed)
            .min()
            .is_some_and(|first| ready <= t && t < first)
    }

    /// Whether process `instance` of worker `w` had no measured offset to the store's clock at real time
    /// `t` and failed to measure it: it started (which forgets the last measurement), had not logged
    /// `clock.offset` since, and logged `clock.unmeasured` before its next `clock.offset`. Such a
    /// process races nothing: it does not know its cluster time.
    pub fn unmeasured_at(&self, instance: usize, worker: usize, t: i64) -> bool {
        let last = self.measured[worker]
            .iter()
            .filter(|(at, _)| *at <= t)
            .max_by_key(|(at, _)| *at);
        let Some(&(since, None)) = last else {
            return false;
        };
        let measured = self.measured[worker]
            .iter()
            .filter(|(at, offset)| *at > t && offset.is_some())
            .map(|(at, _)| *at)
            .min()
            .unwrap_or(NEVER);
        self.unmeasured
            .get(&instance)
            .is_some_and(|failed| failed.iter().any(|&at| since <= at && at <= measured))
    }

    /// Whether a majority of the configured nodes was unusable at some instant of `[a, b]`, counting as
    /// unusable also each node `n` of `extra` during its `[from, to]`: `None` if never, else `Some(true)`
    /// when the plan's faults and `extra` alone took the majority out, `Some(false)` when measured stalls
    /// were needed for it.
    pub fn no_quorum_in(&self, a: i64, b: i64, extra: &[(usize, i64, i64)]) -> Option<bool> {
        let needed = self.nodes / 2 + 1;
        let within =
            |intervals: &Vec<(i64, i64)>, p: i64| intervals.iter().any(|&(s, e)| s <= p && p <= e);
        let out = |n: usize, p: i64| {
            within(&self.unusable[n], p)
                || extra
                    .iter()
                    .any(|&(node, s, e)| node == n && s <= p && p <= e)
        };
        let mut points = vec![a];
        let starts = self
            .unusable
            .iter()
            .chain(&self.stalled)
            .flatten()
            .map(|&(s, _)| s)
            .chain(extra.iter().map(|&(_, s, _)| s));
        points.extend(starts.filter(|&s| a <= s && s <= b));
        let mut lost = None;
        for p in points {
            let planned = (0..self.nodes).filter(|&n| out(n, p)).count();
            let any = (0..self.nodes)
                .filter(|&n| out(n, p) || within(&self.stalled[n], p))
                .count();
            if planned >= needed {
                return Some(true);
            }
            if any >= needed {
                lost = Some(false);
            }
        }
        lost
    }

    /// The intervals during which every request of `instance` went to a member out of reach: its
    /// ZooKeeper session rode a member that was killed, hung or stalled, and its client had not yet
    /// moved the session to another (it does so only after its connection timeout without an answer,
    /// or when the connection breaks). The other members answering is no help then: a session talks
    /// to one member at a time. So also while its client, the session disconnected, was trying to
    /// establish it on a member out of reach (a hung member takes the connection and answers nothing
    /// until the connection timeout): the session rode no member then. Empty on the other stores,
    /// whose clients log no session.
    pub fn session_cut_off(&self, instance: usize) -> Vec<(i64, i64)> {
        let mut cut_off = Vec::new();
        for &(from, to, node) in self.session_tries.get(&instance).into_iter().flatten() {
            let out = self.unusable[node].iter().chain(&self.stalled[node]);
            cut_off.extend(
                out.map(|&(s, e)| (s.max(from), e.min(to)))
                    .filter(|(s, e)| s < e),
            );
        }
        let Some(sessions) = self.sessions.get(&instance) else {
            return cut_off;
        };
        for (k, &(from, node)) in sessions.iter().enumerate() {
            let to = sessions.get(k + 1).map_or(NEVER, |&(next, _)| next);
            let out = self.unusable[node].iter().chain(&self.stalled[node]);
            cut_off.extend(
                out.map(|&(s, e)| (s.max(from), e.min(to)))
                    .filter(|(s, e)| s < e),
            );
        }
        cut_off
    }

    /// What `instance` logged for `(job, tick)`.
    pub fn logged(&self, instance: usize, job: &str, tick: i64) -> Vec<String> {
        self.outcomes
            .get(&(instance, job.to_string()))
            .and_then(|ticks| ticks.get(&tick))
            .map(|events| events.iter().map(|(label, _)| label.clone()).collect())
            .unwrap_or_default()
    }

    /// Whether `instance` runs `job` with `overlap: skip` (its config version decides).
    pub fn skips(&self, instance: usize, job: &JobSpec) -> bool {
        job.skip[self.lives[instance].config]
    }

    /// When `instance` logged `label` (`event` or `event:reason`) for `(job, tick)`.
    pub fn logged_at(&self, instance: usize, job: &str, tick: i64, label: &str) -> Vec<i64> {
        self.outcomes
            .get(&(instance, job.to_string()))
            .and_then(|ticks| ticks.get(&tick))
            .map(|events| {
                events
                    .iter()
                    .filter(|(l, _)| l == label)
                    .map(|&(_, at)| at)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every instance of worker `w`.
    pub fn instances_of(&self, worker: usize) -> impl Iterator<Item = (usize, &Life)> {
        self.lives
            .iter()
            .enumerate()
            .filter(move |(_, life)| life.worker == worker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::faults::ProxyMode;

    /// Node faults and the degraded proxy add up to "no quorum" only when a majority is out at once.
    #[test]
    fn quorum_is_lost_only_when_a_majority_is_out() {
        let mut timeline = Timeline::default();
        timeline.push(
            1_000,
            Happening::NodeDown {
                node: 0,
                hung: false,
            },
        );
        timeline.push(
            1_500,
            Happening::NodeDown {
                node: 1,
                hung: true,
            },
        );
        timeline.push(3_000, Happening::NodeUp { node: 0 });
        timeline.push(3_000, Happening::NodeUp { node: 1 });
        timeline.push(
            4_000,
            Happening::Proxy {
                mode: ProxyMode::Slow { max_ms: 50 },
            },
        );
        timeline.push(
            8_000,
            Happening::Proxy {
                mode: ProxyMode::Clean,
            },
        );
        for node in 2..5 {
            timeline.push(
                20_000,
                Happening::NodeStalled {
                    node,
                    until: 20_150,
                },
            );
        }
        let facts = Facts::gather(&timeline, &[], crate::chaos::plan::NODES);
        let none = [];
        assert_eq!(facts.no_quorum_in(0, 3_900, &none), None, "two nodes out");
        assert_eq!(
            facts.no_quorum_in(4_000, 4_100, &none),
            Some(true),
            "two recovering nodes and the proxy"
        );
        assert_eq!(facts.no_quorum_in(5_001, 9_000, &none), None, "recovered");
        assert_eq!(
            facts.no_quorum_in(19_000, 21_000, &none),
            Some(false),
            "a measured stall of three nodes"
        );
    }

    /// A worker's race time follows its clock offset, including a step.
    #[test]
    fn race_times_follow_clock_offsets() {
        let mut timeline = Timeline::default();
        timeline.push(
            0,
            Happening::Clock {
                worker: 1,
                offset_ms: 2_000,
            },
        );
        timeline.push(
            0,
            Happening::Clock {
                worker: 3,
                offset_ms: 0,
            },
        );
        timeline.push(
            50_000,
            Happening::Clock {
                worker: 3,
                offset_ms: -3_000,
            },
        );
        let facts = Facts::gather(&timeline, &[], crate::chaos::plan::NODES);
        assert_eq!(facts.race_time(1, 10_000), 8_000);
        assert_eq!(facts.race_time(0, 10_000), 10_000);
        assert_eq!(facts.race_time(3, 40_000), 40_000);
        assert_eq!(facts.race_time(3, 60_000), 63_000);
        assert!(facts.near_clock_step(3, 51_000) && !facts.near_clock_step(3, 40_000));
    }

    /// The etcd chaos run of seed 1795471668647927923: w3's clock at −469 ms stepped to +2452 ms at
    /// 16.376; tick 16.000 would have come at 16.469 on the old clock, and the new skew puts it at 13.548,
    /// before the step. The tick was jumped over: a clock step, not a worker that could have run it.
    #[test]
    fn a_tick_jumped_over_by_a_clock_step_straddles_it() {
        let mut timeline = Timeline::default();
        for (at, offset_ms) in [(0, -469), (16_376, 2_452)] {
            timeline.push(
                at,
                Happening::Clock {
                    worker: 3,
                    offset_ms,
                },
            );
        }
        let facts = Facts::gather(&timeline, &[], crate::chaos::plan::NODES);
        assert_eq!(facts.race_time(3, 16_000), 13_548);
        assert!(!facts.near_clock_step(3, 13_548));
        assert!(facts.straddles_step(3, 16_000));
        assert!(!facts.straddles_step(3, 10_000) && !facts.straddles_step(3, 30_000));
    }

    /// A worker that measured its offset races on the nodes' time; a step of its wall clock moves none of
    /// its races (cluster time goes on from the measurement on the boot clock), and the measurement after
    /// it is logged as a correction.
    #[test]
    fn race_times_follow_measured_offsets() {
        let mut timeline = Timeline::default();
        for (at, offset_ms) in [(0, 2_000), (30_000, 4_000)] {
            timeline.push(
                at,
                Happening::Clock {
                    worker: 1,
                    offset_ms,
                },
            );
        }
        let event =
            |name: &str, offset_ms: i64| serde_json::json!({"event": name, "offset_ms": offset_ms});
        let log = InstanceLog {
            instance: 0,
            worker: 1,
            events: vec![
                (1_000, event("worker.started", 0)),
                (1_010, event("clock.offset", -2_000)),
                (31_500, event("clock.offset", -4_000)),
            ],
            bad_lines: Vec::new(),
        };
        let facts = Facts::gather(&timeline, &[log], crate::chaos::plan::NODES);
        assert_eq!(facts.skew_at(1, 500), 2_000, "before it measured");
        assert_eq!(facts.race_time(1, 10_000), 10_000);
        assert_eq!(
            facts.skew_at(1, 31_000),
            0,
            "stepped, not yet measured: cluster time goes on from the measurement"
        );
        assert_eq!(facts.race_time(1, 40_000), 40_000);
        assert_eq!(facts.corrections[1], vec![(31_500, 2_000)]);
        assert!(facts.near_clock_step(1, 35_000) && !facts.near_clock_step(1, 10_000));
    }
}
