//! The etcd members as the store reaches them: one client per member, and a request that fails over from
//! a member that is down or hung to the next, so the store works while any majority of members serves.
//!
//! etcd is one consensus group: any member that serves answers for the whole cluster (a write is
//! forwarded to the leader and committed by a majority; a read is linearizable, confirmed by the leader
//! through a majority; with `require_leader` a member that lost its leader refuses instead of waiting).
//! So one healthy member suffices, and a request goes to one member: first to the member that
//! answered last, and on a transport error, a refusal for want of a leader, or no answer within half the
//! node timeout, to the next. A hung member (SIGSTOP: its kernel still accepts connections, nobody
//! answers) shows only as silence, so at that point the next member is asked while the first request
//! stays pending; whichever answers first decides, and the member that answered is asked first next
//! time. An answer that is etcd's (a key or lease not found, bad arguments, permission) is final on any
//! member and not tried elsewhere. A member that failed is asked again after a short pause (during an
//! election every member refuses), until the request's limit.
//!
//! A request's limit follows the cluster: it stretches, up to 10×, while the cluster answers slowly as a
//! whole ([`crate::store::pace`], as the Redis store's rounds do), learned from how long the member that gave
//! each request's first answer took — also an answer that came after the request gave up, which its attempts,
//! each a task of its own, still listen for in the background. A request whose limit comes reads the pace
//! again and waits on if answers that came meanwhile stretched it: a herd's batch goes out before any answer
//! could teach the pace, and its first answers, late but in time, then extend the wait of the others. The
//! silence before the next member is asked stretches with it, up to twice (not a renewal's, whose slack
//! counts on half a node timeout; `lock::renewal_slack`): a stretch learned from the burst of late answers
//! after an election must not make a hung member cost long. Members that do not answer at all stretch
//! nothing. Without it, three members starved of CPU by a herd's spawns answered every request of a few
//! hundred claims after the 500 ms limit; each was raced again (and copied to a second member after 250 ms),
//! feeding the queue that made them late, for the claims' whole window (docs/scaling.md).
//!
//! A request may thus be sent twice. Every request the store makes tolerates that: the claim's write is
//! a compare-and-swap that a second copy cannot apply (the compared revisions changed), so are pauses
//! and resumes (`pause_guard.rs`: a late copy must not undo a later command), puts of history and
//! triggers write the same value, a keep-alive or revoke of the same etcd lease twice is one,
//! and a second lease grant leaves an etcd lease with nothing bound to it, which expires at its TTL.
//!
//! etcd's Go client (its *client design* document) fails over with gRPC's balancer: it finds a hung
//! member by HTTP/2 pings and retries a request refused as unavailable on another endpoint, a write only
//! if it was never sent (at most once for mutations in general); the store's writes are all safe to send
//! twice (above), so they fail over too. The Rust client's channel balanced over all endpoints keeps
//! choosing a hung member until its connection is torn down, longer than a lease's slack: hence one
//! client per member, and the choice made here.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::OnceCell;
use tokio::task::AbortHandle;
use tokio::time::{sleep_until, Instant};
use tonic::Code;

use crate::store::pace::{Pace, MAX_STRETCH};

/// How long after a member failed it may be asked again within the same request (all of them refuse
/// during an election, which takes a few heartbeats).
const ROUND_PAUSE: Duration = Duration::from_millis(50);

/// One client per etcd member, which member answered last, and how slowly the cluster answers.
pub(super) struct Cluster {
    members: Vec<Member>,
    options: ConnectOptions,
    /// The configured wait for one member: a request's limit is measured against it by the pace, and a
    /// request that gets no answer from a member within half of it (stretched) also goes to the next.
    node_timeout: Duration,
    /// How much longer than configured requests wait while the cluster answers slowly
    /// ([`crate::store::pace`]).
    pace: Arc<Pace>,
    /// The member asked first: the one that answered last.
    preferred: AtomicUsize,
}

/// One member: its endpoint and its client, connected (and authenticated) on first use.
struct Member {
    endpoint: String,
    client: OnceCell<Client>,
}

/// How long a request waits in silence before it also goes to the next member.
#[derive(Clone, Copy)]
enum Hedge {
    /// Half the node timeout as the pace stretches it, at most a whole one. Silence from a slow cluster
    /// is not a hung member, and a copy adds to what made it slow; but a stretch learned from a burst of
    /// late answers (an election) must not keep a hung member waited for long.
    Paced,
    /// Half the configured node timeout (a renewal's: [`Cluster::call_renewal`]).
    Configured,
}

/// How one member's attempt at a request ended.
enum Attempt<T> {
    /// The member answered: with the result, or with an error that is etcd's answer.
    Answered(Result<T, String>),
    /// The member could not be reached, refused to serve, or its connection broke: ask another.
    Failed(String),
}

/// What the attempts of one request share: whether one has answered yet (only the first answer tells the
/// pace how slowly the cluster answers; a hedged copy that answers later does not).
struct Listening {
    answered: AtomicBool,
    /// Whether an attempt dropped unanswered is aborted (while the request waits) or left to finish in
    /// the background (once the request gave up, so that its late answer still reaches the pace).
    abort_unanswered: AtomicBool,
}

/// Aborts an attempt's request when the attempt is dropped unanswered, unless its request gave up.
struct AbortUnanswered {
    handle: AbortHandle,
    listening: Arc<Listening>,
}

impl Drop for AbortUnanswered {
    fn drop(&mut self) {
        if self.listening.abort_unanswered.load(Ordering::Relaxed) {
            self.handle.abort();
        }
    }
}

impl Cluster {
    /// The members of `endpoints` (at least one), reached with `options`; a member silent for half of
    /// `node_timeout` (stretched by the pace) is passed over.
    pub fn new(endpoints: &[String], options: ConnectOptions, node_timeout: Duration) -> Cluster {
        Cluster {
            members: endpoints
                .iter()
                .map(|endpoint| Member {
                    endpoint: endpoint.clone(),
                    client: OnceCell::new(),
                })
                .collect(),
            options,
            node_timeout,
            pace: Arc::default(),
            preferred: AtomicUsize::new(0),
        }
    }

    /// Runs `request` on one member after another (see the module's doc) until one answers, for at most
    /// `limit` as the pace stretches it; the error names what each member did.
    pub async fn call<T, F, Fut>(&self, limit: Duration, request: F) -> Result<T, String>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
        T: Send + 'static,
    {
        self.request(limit, Duration::MAX, Hedge::Paced, request)
            .await
    }

    /// A renewal's [`Cluster::call`]: for at most `cap` however much the pace stretches `limit` (a
    /// renewal must be confirmed before the lease's deadline), and sent to the next member after half
    /// the *configured* node timeout of silence, however slowly the cluster answers: the lease's slack
    /// ([`crate::lock::renewal_slack`]) counts on a hung member costing a renewal no more, and one job's
    /// renewal copied adds little to a slow cluster's work.
    pub async fn call_renewal<T, F, Fut>(
        &self,
        limit: Duration,
        cap: Duration,
        request: F,
    ) -> Result<T, String>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
        T: Send + 'static,
    {
        self.request(limit, cap, Hedge::Configured, request).await
    }

    /// A request, for at most `cap` however much the pace stretches `limit`, sent to the next member
    /// after `hedge`'s silence.
    ///
    /// Each attempt's request runs as a task of its own. Once one member answered, the others' are
    /// aborted; once the request gave up, they go on in the background for at most [`MAX_STRETCH`] node
    /// timeouts (or times the request's limit, the longer), so that an answer that was on its way tells
    /// the pace how late the cluster answers (see [`crate::store::pace`]) — the request itself has
    /// failed, as it would have without them.
    async fn request<T, F, Fut>(
        &self,
        limit: Duration,
        cap: Duration,
        hedge: Hedge,
        request: F,
    ) -> Result<T, String>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
        T: Send + 'static,
    {
        let n = self.members.len();
        if n == 0 {
            return Err("no etcd endpoints".to_string());
        }
        let started = Instant::now();
        let listening = Arc::new(Listening {
            answered: AtomicBool::new(false),
            abort_unanswered: AtomicBool::new(true),
        });
        let configured = limit;
        let limit = self.pace.budget(configured).min(cap);
        let mut deadline = started + limit;
        let hedge_after = match hedge {
            Hedge::Paced => (self.pace.budget(self.node_timeout) / 2).min(self.node_timeout),
            Hedge::Configured => self.node_timeout / 2,
        }
        .min(limit / 2);
        // How long an attempt's request may go on: the request's longest limit, and after it the longest
        // that still tells the pace something.
        let bound =
            (configured.mul_f64(MAX_STRETCH).min(cap)).max(self.node_timeout.mul_f64(MAX_STRETCH));
        let mut next = self.preferred.load(Ordering::Relaxed) % n;
        let mut failures: Vec<Option<String>> = vec![None; n];
        let mut failed_at: Vec<Option<Instant>> = vec![None; n];
        let mut in_flight = vec![false; n];
        let mut pending = FuturesUnordered::new();
        // When to ask one more member: at once, then after silence or a failure.
        let mut ask_at = Instant::now();
        loop {
            tokio::select! {
                biased;
                () = sleep_until(deadline) => {
                    // Answers that came meanwhile may have stretched the pace (a herd's batch goes out
                    // at once, before any answer could; its first answers come late but in time): the
                    // request then waits as long as one sent now would.
                    let stretched = started + self.pace.budget(configured).min(cap);
                    if stretched <= deadline {
                        break;
                    }
                    deadline = stretched;
                }
                Some((i, attempt)) = pending.next() => {
                    in_flight[i] = false;
                    match attempt {
                        Attempt::Answered(result) => {
                            self.preferred.store(i, Ordering::Relaxed);
                            return result;
                        }
                        Attempt::Failed(why) => {
                            failures[i] = Some(why);
                            failed_at[i] = Some(Instant::now());
                            ask_at = Instant::now();
                        }
                    }
                }
                () = sleep_until(ask_at) => {
                    // The next member not being asked, and not failed within the last ROUND_PAUSE.
                    let now = Instant::now();
                    let ready = |i: usize| {
                        !in_flight[i] && failed_at[i].is_none_or(|at| at + ROUND_PAUSE <= now)
                    };
                    match (0..n).map(|k| (next + k) % n).find(|&i| ready(i)) {
                        Some(i) => {
                            pending.push(self.attempt(i, &request, &listening, bound));
                            in_flight[i] = true;
                            next = (i + 1) % n;
                            ask_at = now + hedge_after;
                        }
                        None => {
                            ask_at = (0..n)
                                .filter(|&i| !in_flight[i])
                                .filter_map(|i| failed_at[i])
                                .map(|at| at + ROUND_PAUSE)
                                .min()
                                .unwrap_or(deadline);
                        }
                    }
                }
            }
        }
        // Given up: the attempts still in flight finish in the background.
        listening.abort_unanswered.store(false, Ordering::Relaxed);
        let silent = format!("no answer within {} ms", (deadline - started).as_millis());
        let told: Vec<String> = self
            .members
            .iter()
            .zip(failures.iter().zip(&in_flight))
            .filter_map(|(member, (failure, asked))| {
                let why = if *asked {
                    Some(&silent)
                } else {
                    failure.as_ref()
                }?;
                Some(format!("{}: {why}", member.endpoint))
            })
            .collect();
        Err(if told.is_empty() {
            silent
        } else {
            told.join("; ")
        })
    }

    /// One attempt of `request` on member `i`, connecting to it first if need be; the request itself runs
    /// as a task (see [`Cluster::request`]), and the first answer of the request tells the pace how
    /// long the member that gave it took (the silence of a member asked before it is that member's, not
    /// the cluster's).
    async fn attempt<T, F, Fut>(
        &self,
        i: usize,
        request: &F,
        listening: &Arc<Listening>,
        bound: Duration,
    ) -> (usize, Attempt<T>)
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
        T: Send + 'static,
    {
        let member = &self.members[i];
        let connect = || Client::connect([&member.endpoint], Some(self.options.clone()));
        let client = match member.client.get_or_try_init(connect).await {
            Ok(client) => client.clone(),
            Err(e) => return (i, settle(e, |why| format!("cannot connect: {why}"))),
        };
        let sent = request(client);
        let (pace, reference) = (Arc::clone(&self.pace), self.node_timeout);
        let shared = Arc::clone(listening);
        let task = tokio::spawn(async move {
            let sent_at = Instant::now();
            let answer = tokio::time::timeout(bound, sent).await.ok()?;
            let answered = match &answer {
                Ok(_) => true,
                Err(e) => is_answer(e),
            };
            if answered && !shared.answered.swap(true, Ordering::Relaxed) {
                pace.majority_after(sent_at.elapsed(), reference);
            }
            Some(answer)
        });
        let _abort = AbortUnanswered {
            handle: task.abort_handle(),
            listening: Arc::clone(listening),
        };
        let attempt = match task.await {
            Ok(Some(result)) => settle_result(result),
            Ok(None) => Attempt::Failed("no answer".to_string()),
            Err(e) => Attempt::Failed(format!("the request's task failed: {e}")),
        };
        (i, attempt)
    }
}

/// A request's result as an attempt: an error is an answer only if etcd gave it ([`is_answer`]).
fn settle_result<T>(result: Result<T, etcd_client::Error>) -> Attempt<T> {
    match result {
        Ok(value) => Attempt::Answered(Ok(value)),
        Err(e) => settle(e, |why| why),
    }
}

/// `error`, worded by `word`, as an answer or a failure of the member.
fn settle<T>(error: etcd_client::Error, word: impl Fn(String) -> String) -> Attempt<T> {
    let answer = is_answer(&error);
    let why = word(super::describe(error));
    if answer {
        Attempt::Answered(Err(why))
    } else {
        Attempt::Failed(why)
    }
}

/// Whether `error` is etcd's answer, the same on every member (a lease not found, a bad argument, a wrong
/// password, no permission), rather than this member's trouble (unreachable, hung, no leader, behind,
/// a broken stream, an auth token this member does not know).
fn is_answer(error: &etcd_client::Error) -> bool {
    use etcd_client::Error;
    match error {
        Error::GRpcStatus(status) => matches!(
            status.code(),
            Code::InvalidArgument
                | Code::NotFound
                | Code::AlreadyExists
                | Code::PermissionDenied
                | Code::FailedPrecondition
                | Code::OutOfRange
                | Code::Unimplemented
        ),
        Error::InvalidArgs(_) | Error::InvalidUri(_) | Error::InvalidMetadataValue(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{is_answer, Cluster};
    use etcd_client::{Client, ConnectOptions, Error};
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};
    use testkit::{DelayProxy, EtcdCluster};
    use tonic::{Code, Status};

    /// When every member answers a request after its limit (a proxy in front of each holds it back), the
    /// request fails, but its late answer, still listened for, stretches the next one's limit, which is
    /// then answered. Without the pace the second request fails as the first did.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn late_answers_of_the_whole_cluster_stretch_the_next_wait() {
        const HOLD: Duration = Duration::from_millis(700);
        const MARKER: &str = "held-back-put";
        let node_timeout = Duration::from_millis(400);
        let etcd = EtcdCluster::start();
        let proxies: Vec<DelayProxy> = (0..etcd.len())
            .map(|member| DelayProxy::start(etcd.client_port(member), MARKER, HOLD))
            .collect();
        let endpoints: Vec<String> = proxies
            .iter()
            .map(|proxy| format!("http://127.0.0.1:{}", proxy.port()))
            .collect();
        let cluster = Cluster::new(&endpoints, ConnectOptions::new(), node_timeout);
        let put = |mut client: Client| async move { client.put(MARKER, "v", None).await };
        // Connected first, so that the hold is all that a put waits for.
        for _ in 0..endpoints.len() {
            let get = |mut client: Client| async move { client.get("warm-up", None).await };
            cluster.call(node_timeout, get).await.expect("a read");
        }
        proxies.iter().for_each(|proxy| proxy.delay_next(1));
        let first = cluster.call(node_timeout, put).await;
        let Err(why) = first else {
            panic!("a put held past its limit was answered");
        };
        assert!(why.contains("no answer within 400 ms"), "{why}");
        // The held put is answered after HOLD, in the background.
        let waited = Instant::now();
        while cluster.pace.budget(node_timeout) <= node_timeout {
            assert!(
                waited.elapsed() < Duration::from_secs(20),
                "the late answer did not reach the pace"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let stretched = cluster.pace.budget(node_timeout);
        assert!(stretched >= HOLD * 2, "stretched to {stretched:?} only");
        proxies.iter().for_each(|proxy| proxy.delay_next(1));
        let second = cluster.call(node_timeout, put).await;
        second.expect("a put held as long, within the stretched limit, is answered");
        assert!(proxies.iter().map(DelayProxy::delayed).sum::<usize>() >= 2);
    }

    /// A request whose limit comes after answers that came meanwhile stretched the pace waits on, as one
    /// sent then would. Two puts on one member (so that neither is copied elsewhere): the proxy holds
    /// the first for HOLD and the second, behind it on the connection, for HOLD more; the first's answer,
    /// in time, stretches the pace, and the second is answered after the limit it was sent with. Without
    /// the second look at the pace when the limit comes, the second put fails.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn answers_that_come_during_a_request_stretch_its_own_wait() {
        const HOLD: Duration = Duration::from_millis(900);
        const MARKER: &str = "held-back-put";
        let node_timeout = Duration::from_millis(1_500);
        let etcd = EtcdCluster::start();
        let proxy = DelayProxy::start(etcd.client_port(0), MARKER, HOLD);
        let endpoint = format!("http://127.0.0.1:{}", proxy.port());
        let cluster = Cluster::new(&[endpoint], ConnectOptions::new(), node_timeout);
        let get = |mut client: Client| async move { client.get("warm-up", None).await };
        cluster.call(node_timeout, get).await.expect("a read");
        let put = |mut client: Client| async move { client.put(MARKER, "v", None).await };
        proxy.delay_next(2);
        let first = cluster.call(node_timeout, put);
        let second = async {
            // Sent once the proxy holds the first, so that it is held on its own after it.
            while proxy.delayed() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let sent = Instant::now();
            (cluster.call(node_timeout, put).await, sent.elapsed())
        };
        let (first, (second, waited)) = tokio::join!(first, second);
        first.expect("the first put, answered after HOLD, is within its limit");
        second.expect("the second put waits as long as the first answer stretched the pace");
        assert!(
            waited > node_timeout,
            "the second put was answered within the limit it was sent with ({waited:?}): the test \
             proves nothing"
        );
        assert_eq!(proxy.delayed(), 2);
    }

    /// While the pace is stretched, a request waits up to a whole node timeout on a hung member before
    /// it asks the next; a renewal only half of one, as the lease's slack counts on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewal_passes_a_hung_member_by_after_half_the_configured_node_timeout() {
        let node_timeout = Duration::from_millis(2_000);
        let mut etcd = EtcdCluster::start();
        let endpoints: Vec<String> = (0..etcd.len())
            .map(|member| format!("http://127.0.0.1:{}", etcd.client_port(member)))
            .collect();
        let cluster = Cluster::new(&endpoints, ConnectOptions::new(), node_timeout);
        let get = |mut client: Client| async move { client.get("k", None).await };
        for member in 0..endpoints.len() {
            cluster.preferred.store(member, Ordering::Relaxed);
            cluster.call(node_timeout, get).await.expect("a read");
        }
        // A follower hangs (the others keep their leader), and is asked first.
        let hung = (etcd.leader() + 1) % etcd.len();
        etcd.stop(hung);
        // Answers 70 % of a node timeout late: a stretch of 2.1, a request's silence up to a whole one.
        cluster
            .pace
            .majority_after(node_timeout.mul_f64(0.7), node_timeout);
        let timed = |renewal: bool| {
            cluster.preferred.store(hung, Ordering::Relaxed);
            let cluster = &cluster;
            async move {
                let started = Instant::now();
                let answer = if renewal {
                    cluster
                        .call_renewal(node_timeout, Duration::from_secs(60), get)
                        .await
                } else {
                    cluster.call(node_timeout, get).await
                };
                answer.expect("the other members answer");
                started.elapsed()
            }
        };
        let renewal = timed(true).await;
        let request = timed(false).await;
        etcd.cont(hung);
        assert!(
            request >= node_timeout,
            "a request asked the next member after {request:?}, before a whole node timeout"
        );
        assert!(
            renewal < node_timeout.mul_f64(0.8),
            "a renewal waited {renewal:?} on a hung member (half a node timeout expected)"
        );
    }

    #[test]
    fn etcd_refusals_are_answers_and_member_trouble_is_not() {
        let status = |code, message: &str| Error::GRpcStatus(Status::new(code, message));
        assert!(is_answer(&status(
            Code::NotFound,
            "etcdserver: requested lease not found"
        )));
        assert!(is_answer(&status(
            Code::InvalidArgument,
            "etcdserver: authentication failed, invalid user ID or password"
        )));
        assert!(!is_answer(&status(
            Code::Unavailable,
            "etcdserver: no leader"
        )));
        assert!(!is_answer(&status(
            Code::Unavailable,
            "etcdserver: request timed out"
        )));
        assert!(!is_answer(&status(
            Code::Unauthenticated,
            "etcdserver: invalid auth token"
        )));
        assert!(!is_answer(&Error::LeaseKeepAliveError(
            "stream closed".to_string()
        )));
    }
}
