//! Membership: the worker announces itself to the store every `worker.heartbeat_every`, until it stops.
//!
//! An announcement ([`Member`]) carries who the worker is, the commands it obeys (`honours`: every
//! [`Capability`] of this release), the fingerprint of its whole schedule (so that
//! `redcron status` can point at a worker whose config differs), its clock offset and the runs under way.
//! The store stamps it with its own clock and lets it expire after a few missed heartbeats, so a worker that
//! dies disappears from the live members by itself. While the worker drains at shutdown it goes on
//! announcing (`stopping`); its last announcement says `stopped`.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tracing::{info, warn};

use super::Context;
use crate::logging::events;
use crate::membership::{Capability, Member, Sharer, MOST_SHARERS};

/// How soon the live workers are read again after the view changed, or while the worker is young.
const VIEW_SETTLING: Duration = Duration::from_secs(1);
/// How long after its start a worker reads the live workers every [`VIEW_SETTLING`].
const VIEW_SETTLING_AT_START: Duration = Duration::from_secs(10);

/// The heartbeat task's handle: stop it, then announce the worker stopped.
pub(crate) struct Heartbeat {
    context: Arc<Context>,
    member: Member,
    stop: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

/// What a worker says about itself that does not change while it runs (its config may: it is read at
/// every heartbeat).
pub(crate) struct Identity {
    pub(crate) every: Duration,
    pub(crate) started_at: DateTime<Utc>,
}

impl Heartbeat {
    /// Announces the worker now and every `identity.every` after, in a supervised task
    /// ([`super::background`]).
    pub(crate) fn start(context: Arc<Context>, identity: Identity) -> Heartbeat {
        let member = Member {
            id: context.worker_id.clone(),
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            config_fingerprint: String::new(),
            clock_offset_ms: None,
            started_at: identity.started_at,
            running: Vec::new(),
            heartbeat_ms: identity.every.as_millis() as u64,
            honours: Some(
                Capability::ALL
                    .iter()
                    .map(|capability| capability.name().to_string())
                    .collect(),
            ),
            state: "running".to_string(),
            seen_at: None,
            alive: true,
            shared_with: Vec::new(),
        };
        let stop = Arc::new(Notify::new());
        let task = super::background::spawn("heartbeat", context.shutdown.clone(), {
            let (context, member, stop) = (Arc::clone(&context), member.clone(), Arc::clone(&stop));
            move || {
                let (context, member, stop) =
                    (Arc::clone(&context), member.clone(), Arc::clone(&stop));
                beat(context, member, identity.every, stop)
            }
        });
        Heartbeat {
            context,
            member,
            stop,
            task,
        }
    }

    /// Stops the heartbeat and announces the worker `stopped` (not alive from now on).
    pub(crate) async fn stop(self) {
        self.stop.notify_one();
        let _ = self.task.await;
        let last = now_member(&self.context, &self.member, "stopped");
        if let Err(failure) = self.context.store.announce(&last).await {
            warn!(event = events::worker::HEARTBEAT_FAILED, error = %failure,
                  "Could not announce that this worker stopped; it will show as dead once its heartbeat expires");
        }
    }
}

async fn beat(context: Arc<Context>, member: Member, every: Duration, stop: Arc<Notify>) {
    let mut failing = false;
    let mut sharers = Sharers::default();
    let mut announced = false;
    let born = tokio::time::Instant::now();
    loop {
        let state = if context.shutdown.is_requested() {
            "stopping"
        } else {
            "running"
        };
        let reads_view = state == "running" && context.store.is_shared();
        // The view is read before each announcement but the first: the record under this worker's id
        // is then the last one written since its previous announcement — another process's, if one
        // shares the id ([`Sharers::note`]), whatever the two heartbeats' phases.
        let mut changed =
            reads_view && announced && read_members(&context, &member, &mut sharers).await;
        let mut now = now_member(&context, &member, state);
        now.shared_with = sharers.listed(&member);
        match context.store.announce(&now).await {
            Ok(()) if failing => {
                failing = false;
                info!(
                    event = events::worker::HEARTBEAT_RECOVERED,
                    "Announcing this worker to the store again"
                );
            }
            Ok(()) => {}
            Err(failure) if !failing => {
                failing = true;
                warn!(event = events::worker::HEARTBEAT_FAILED, error = %failure,
                      "Could not announce this worker to a majority of nodes; `redcron status` may show it dead");
            }
            Err(_) => {}
        }
        // While the view of the live workers is changing (when workers join or leave), and for the first
        // seconds of this worker's life, look again after a second instead of a whole heartbeat: workers
        // started together each see only the ones announced before them at first, and would claim as if
        // first for every tick until they looked again.
        if !announced {
            announced = true;
            changed = reads_view && read_members(&context, &member, &mut sharers).await;
        }
        let settling = changed || born.elapsed() < VIEW_SETTLING_AT_START;
        let pause = if settling {
            every.min(VIEW_SETTLING)
        } else {
            every
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = stop.notified() => return,
        }
    }
}

/// Reads the live workers back for the claim order ([`crate::lock::order`]): those alive and `running` (a
/// draining worker takes no new ticks). A failed read keeps the last view. Returns whether the view
/// changed. Notes another process under this worker's id ([`Sharers::note`]).
async fn read_members(context: &Context, ours: &Member, sharers: &mut Sharers) -> bool {
    let Ok(read) = context.store.members().await else {
        return false;
    };
    context.warn_skipped(&read.skipped);
    sharers.note(ours, &read.value);
    let mut live: Vec<String> = read
        .value
        .into_iter()
        .filter(|member| member.alive && member.state == "running")
        .map(|member| member.id)
        .collect();
    live.sort();
    live.dedup();
    let count = live.len();
    let names = live.join(",");
    let changed = context.set_live_members(live);
    if changed {
        info!(event = events::members::CHANGED, count, members = %names,
              "The live workers changed; the claim order now ranks these");
    }
    changed
}

/// The other live processes found announcing themselves under this worker's id: two workers share
/// `worker.id` (a file every host shares that sets it) and overwrite each other's record, so the claim
/// order ranks them as one, and `status` would show only the last to announce — unless each lists the
/// others in its own announcement (`shared_with`), which this keeps.
#[derive(Default)]
struct Sharers {
    /// Each other process, as last read from the store; at most [`MOST_SHARERS`].
    seen: Vec<Sharer>,
    /// The processes already warned about (`host pid N`), each once; at most 64.
    warned: Vec<String>,
}

impl Sharers {
    /// Notes the store's record of this worker's id when it is a live announcement of another process
    /// (read before this worker announces again, it is the last written since its previous one), and
    /// warns once per other process.
    fn note(&mut self, ours: &Member, members: &[Member]) {
        const MOST_WARNED: usize = 64;
        for member in members {
            let same_process = member.host == ours.host && member.pid == ours.pid;
            if member.id != ours.id || !member.alive || same_process {
                continue;
            }
            let seen_at = member.seen_at.unwrap_or_else(Utc::now);
            let known = self
                .seen
                .iter()
                .position(|s| s.host == member.host && s.pid == member.pid);
            match known {
                Some(i) => self.seen[i].seen_at = self.seen[i].seen_at.max(seen_at),
                None if self.seen.len() < MOST_SHARERS => self.seen.push(Sharer {
                    host: member.host.clone(),
                    pid: member.pid,
                    seen_at,
                }),
                None => {}
            }
            let other = format!("{} pid {}", member.host, member.pid);
            if self.warned.contains(&other) {
                continue;
            }
            if self.warned.len() < MOST_WARNED {
                self.warned.push(other.clone());
            }
            warn!(event = events::worker::ID_SHARED, id = %ours.id, other = %other,
                  "Another live process announces itself under this worker's id: each worker needs its own \
                   worker.id (or none: the default is unique); `redcron status` lists them on one id");
        }
    }

    /// The other processes heard from within two of this worker's heartbeat TTLs (one that stopped or
    /// died drops out), for this worker's announcement.
    fn listed(&mut self, ours: &Member) -> Vec<Sharer> {
        let horizon = chrono::Duration::from_std(ours.ttl() * 2).unwrap_or(chrono::Duration::MAX);
        let now = Utc::now();
        self.seen.retain(|s| now - s.seen_at <= horizon);
        self.seen.clone()
    }
}

/// `member` as it stands now: its state, clock offset and runs under way.
fn now_member(context: &Context, member: &Member, state: &str) -> Member {
    let mut member = member.clone();
    member.state = state.to_string();
    member.clock_offset_ms = context
        .clock
        .is_measured()
        .then(|| context.clock.offset().num_milliseconds());
    member.running = context.running_now();
    member.config_fingerprint = context.config_fingerprint();
    member
}
