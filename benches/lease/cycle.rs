//! Items 1 and 2: one lease cycle (acquire + release of a fresh key, one contender) by each contender.
//!
//! The contenders run on the same Redis nodes, in the same process and runtime, **interleaved**: cycle `i`
//! of every contender runs before cycle `i + 1` of any, so a burst of noise on this shared 2-core machine
//! lands on all of them alike and the ratios stay fair.
//!
//! Every call is bounded by the plan's call timeout. A peer that does not return in time is reported as a
//! timeout and not called again in that scenario (its call may never return: `redlock` blocks on a hung
//! node forever), and a peer that is merely slow is measured until its time budget is spent.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redcron::lock::{ClaimOutcome, ClaimRequest, LockSettings, Overlap};
use redcron::schedule::Tick;
use redcron::store::redis::RedisStore;
use redcron::store::{Claims, Leases};
use tokio::sync::oneshot;

use super::stats::Samples;

/// The lease TTL of every contender: long enough that no cycle comes near it.
pub const TTL: Duration = Duration::from_secs(10);

/// Who performs the cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One `SET NX PX` and one `DEL` on a single node, through redis-rs's multiplexed connection.
    Floor,
    /// The same on all 5 nodes at once, waiting for every answer: the least that any Redlock on this
    /// client and these nodes pays, without lock logic. Not a lock (it never counts a quorum).
    FanOut,
    /// `RedisStore::acquire_lease` + `release`: plain Redlock, one round trip each.
    Lease,
    /// `RedisStore::claim_many` of one request + `release`: lease, tick claim and fencing token.
    Claim,
    /// The `rslock` crate (async, redis-rs 1.x), retries 1.
    Rslock,
    /// The `redlock` crate (blocking, a new connection per call), retries 1.
    Redlock,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::Floor,
        Kind::FanOut,
        Kind::Lease,
        Kind::Claim,
        Kind::Rslock,
        Kind::Redlock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Floor => "floor: SET NX PX + DEL, 1 node",
            Kind::FanOut => "fan-out: the same on 5 nodes at once",
            Kind::Lease => "redcron lease (acquire_lease)",
            Kind::Claim => "redcron full claim (claim_many)",
            Kind::Rslock => "rslock 0.10",
            Kind::Redlock => "redlock 2.0",
        }
    }

    /// The name for `--only`.
    pub fn short(self) -> &'static str {
        match self {
            Kind::Floor => "floor",
            Kind::FanOut => "fanout",
            Kind::Lease => "lease",
            Kind::Claim => "claim",
            Kind::Rslock => "rslock",
            Kind::Redlock => "redlock",
        }
    }

    /// Whether this is a lock crate that redcron is compared with.
    pub fn is_peer(self) -> bool {
        matches!(self, Kind::Rslock | Kind::Redlock)
    }
}

/// Why a cycle did not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    Timeout,
    /// The lock was refused or the client failed; the text says how.
    Refused(String),
}

/// A client ready to run cycles.
pub enum Contender {
    Floor(redis::aio::MultiplexedConnection),
    FanOut(Vec<redis::aio::MultiplexedConnection>),
    Lease(RedisStore),
    Claim(RedisStore),
    Rslock(rslock::LockManager),
    Redlock(RedlockThread),
}

/// The lock settings of the redcron contenders: the shipped defaults, with the TTL of all contenders and
/// one retry like the peers.
pub fn settings() -> LockSettings {
    LockSettings {
        ttl: TTL,
        retries: 1,
        key_prefix: "bench".to_string(),
        ..LockSettings::default()
    }
}

async fn connection(url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())
}

impl Contender {
    /// Connects `kind` to `urls` (the floor to the first one). Must run inside the runtime.
    pub async fn connect(kind: Kind, urls: &[String]) -> Result<Contender, String> {
        let store = || RedisStore::new(urls, settings()).map_err(|e| e.to_string());
        Ok(match kind {
            Kind::Floor => Contender::Floor(connection(&urls[0]).await?),
            Kind::FanOut => {
                let mut connections = Vec::new();
                for url in urls {
                    connections.push(connection(url).await?);
                }
                Contender::FanOut(connections)
            }
            Kind::Lease => Contender::Lease(store()?),
            Kind::Claim => Contender::Claim(store()?),
            Kind::Rslock => {
                let mut manager = rslock::LockManager::new(urls.to_vec());
                manager.set_retry(1, Duration::from_millis(200));
                Contender::Rslock(manager)
            }
            Kind::Redlock => Contender::Redlock(RedlockThread::start(urls.to_vec())),
        })
    }

    pub fn kind(&self) -> Kind {
        match self {
            Contender::Floor(_) => Kind::Floor,
            Contender::FanOut(_) => Kind::FanOut,
            Contender::Lease(_) => Kind::Lease,
            Contender::Claim(_) => Kind::Claim,
            Contender::Rslock(_) => Kind::Rslock,
            Contender::Redlock(_) => Kind::Redlock,
        }
    }

    /// One acquire + release of the fresh resource `key`, bounded by `timeout`; the time it took.
    pub async fn cycle(&mut self, key: &str, timeout: Duration) -> Result<Duration, Failure> {
        if let Contender::Redlock(thread) = self {
            // Timed on its own thread: the hand-off is not the crate's cost.
            return thread.cycle(key, timeout).await;
        }
        let start = Instant::now();
        match tokio::time::timeout(timeout, self.cycle_inner(key)).await {
            Ok(Ok(())) => Ok(start.elapsed()),
            Ok(Err(why)) => Err(Failure::Refused(why)),
            Err(_) => Err(Failure::Timeout),
        }
    }

    async fn cycle_inner(&mut self, key: &str) -> Result<(), String> {
        match self {
            Contender::Floor(connection) => {
                set_nx(connection, key).await?;
                del(connection, key).await
            }
            Contender::FanOut(connections) => {
                let sets = join_all(connections.iter_mut().map(|c| set_nx(c, key))).await;
                sets.into_iter().collect::<Result<Vec<()>, String>>()?;
                let dels = join_all(connections.iter_mut().map(|c| del(c, key))).await;
                dels.into_iter().collect()
            }
            Contender::Lease(store) => match store.acquire_lease("bench", key).await {
                ClaimOutcome::Won(lease) => {
                    store.release(&lease).await;
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            },
            Contender::Claim(store) => {
                let now = chrono::Utc::now().timestamp_millis();
                let request = ClaimRequest::new("bench", key, Tick(now), Overlap::Skip, "bench");
                match store.claim_many(std::slice::from_ref(&request)).await.pop() {
                    Some(ClaimOutcome::Won(lease)) => {
                        store.release(&lease).await;
                        Ok(())
                    }
                    other => Err(format!("{other:?}")),
                }
            }
            Contender::Rslock(manager) => {
                let lock = manager
                    .lock(key.as_bytes(), TTL)
                    .await
                    .map_err(|e| e.to_string())?;
                manager.unlock(&lock).await;
                Ok(())
            }
            Contender::Redlock(_) => unreachable!("redlock cycles run on their own thread"),
        }
    }
}

async fn set_nx(
    connection: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> Result<(), String> {
    let ttl = TTL.as_millis() as u64;
    let set: redis::Value = redis::cmd("SET")
        .arg(key)
        .arg("x")
        .arg("NX")
        .arg("PX")
        .arg(ttl)
        .query_async(connection)
        .await
        .map_err(|e| e.to_string())?;
    if set != redis::Value::Okay {
        return Err(format!("SET NX answered {set:?}"));
    }
    Ok(())
}

async fn del(connection: &mut redis::aio::MultiplexedConnection, key: &str) -> Result<(), String> {
    let _: i64 = redis::cmd("DEL")
        .arg(key)
        .query_async(connection)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

type RedlockJob = (String, oneshot::Sender<Result<Duration, String>>);

/// The blocking `redlock` client on a thread of its own, so that a call that never returns (a hung node:
/// the crate sets no socket timeout) blocks that thread and not the benchmark.
pub struct RedlockThread {
    jobs: std::sync::mpsc::Sender<RedlockJob>,
}

impl RedlockThread {
    fn start(urls: Vec<String>) -> RedlockThread {
        let (jobs, inbox) = std::sync::mpsc::channel::<RedlockJob>();
        std::thread::spawn(move || {
            let mut manager = redlock::RedLock::new(urls);
            manager.set_retry(1, 1);
            for (key, reply) in inbox {
                let start = Instant::now();
                let outcome = match manager.lock(key.as_bytes(), TTL.as_millis() as usize) {
                    Ok(Some(lock)) => {
                        manager.unlock(&lock);
                        Ok(start.elapsed())
                    }
                    Ok(None) => Err("not acquired".to_string()),
                    Err(error) => Err(error.to_string()),
                };
                let _ = reply.send(outcome);
            }
        });
        RedlockThread { jobs }
    }

    async fn cycle(&self, key: &str, timeout: Duration) -> Result<Duration, Failure> {
        let (reply, answer) = oneshot::channel();
        if self.jobs.send((key.to_string(), reply)).is_err() {
            return Err(Failure::Refused("redlock thread ended".to_string()));
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(Ok(elapsed))) => Ok(elapsed),
            Ok(Ok(Err(why))) => Err(Failure::Refused(why)),
            Ok(Err(_)) => Err(Failure::Refused("redlock thread panicked".to_string())),
            Err(_) => Err(Failure::Timeout),
        }
    }
}

/// How many cycles, and how each call and each contender is bounded.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub cycles: usize,
    pub call_timeout: Duration,
    /// Total time a contender may spend in one scenario; a slow peer stops early, with fewer samples.
    pub budget: Duration,
    /// Unmeasured cycles first (connections, script caches).
    pub warm: usize,
    /// A contender stops after this many failed cycles.
    pub max_refusals: u32,
}

/// One contender's results in one scenario.
#[derive(Debug, Clone)]
pub struct Series {
    pub kind: Kind,
    pub samples: Samples,
    pub timeouts: u32,
    pub refusals: u32,
    pub first_refusal: Option<String>,
    /// Why it stopped before the planned cycles, if it did.
    pub stopped: Option<String>,
}

/// Runs `rounds` unmeasured cycles of every contender (connections, script caches).
pub async fn warm_up(contenders: &mut [Contender], rounds: usize, tag: &str, timeout: Duration) {
    for round in 0..rounds {
        for contender in contenders.iter_mut() {
            let key = format!("{tag}:warm:{:?}:{round}", contender.kind());
            let _ = contender.cycle(&key, timeout).await;
        }
    }
}

/// Runs the plan's cycles, interleaved, and returns one series per contender in the given order.
pub async fn measure(contenders: &mut [Contender], plan: Plan, tag: &str) -> Vec<Series> {
    let mut series: Vec<Series> = contenders
        .iter()
        .map(|c| Series {
            kind: c.kind(),
            samples: Samples::default(),
            timeouts: 0,
            refusals: 0,
            first_refusal: None,
            stopped: None,
        })
        .collect();
    let mut spent = vec![Duration::ZERO; contenders.len()];
    for round in 0..plan.cycles {
        let mut active = 0;
        for (index, contender) in contenders.iter_mut().enumerate() {
            let s = &mut series[index];
            if s.stopped.is_some() {
                continue;
            }
            active += 1;
            let key = format!("{tag}:{:?}:{round}", s.kind);
            let started = Instant::now();
            match contender.cycle(&key, plan.call_timeout).await {
                Ok(elapsed) => s.samples.push(elapsed),
                Err(Failure::Timeout) => {
                    s.timeouts += 1;
                    s.stopped = Some(format!(
                        "no answer within {} ms",
                        plan.call_timeout.as_millis()
                    ));
                }
                Err(Failure::Refused(why)) => {
                    s.refusals += 1;
                    s.first_refusal.get_or_insert(why);
                    if s.refusals >= plan.max_refusals {
                        s.stopped = Some(format!("{} failed cycles", s.refusals));
                    }
                }
            }
            spent[index] += started.elapsed();
            if s.stopped.is_none() && spent[index] >= plan.budget && round + 1 < plan.cycles {
                s.stopped = Some(format!(
                    "time budget of {} s spent",
                    plan.budget.as_secs_f64()
                ));
            }
        }
        if active == 0 {
            break;
        }
    }
    series
}
