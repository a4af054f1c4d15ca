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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::OnceCell;
use tokio::time::{sleep_until, Instant};
use tonic::Code;

/// How long after a member failed it may be asked again within the same request (all of them refuse
/// during an election, which takes a few heartbeats).
const ROUND_PAUSE: Duration = Duration::from_millis(50);

/// One client per etcd member, and which member answered last.
pub(super) struct Cluster {
    members: Vec<Member>,
    options: ConnectOptions,
    /// A request that gets no answer from a member within this long is also sent to the next member.
    hedge_after: Duration,
    /// The member asked first: the one that answered last.
    preferred: AtomicUsize,
}

/// One member: its endpoint and its client, connected (and authenticated) on first use.
struct Member {
    endpoint: String,
    client: OnceCell<Client>,
}

/// How one member's attempt at a request ended.
enum Attempt<T> {
    /// The member answered: with the result, or with an error that is etcd's answer.
    Answered(Result<T, String>),
    /// The member could not be reached, refused to serve, or its connection broke: ask another.
    Failed(String),
}

impl Cluster {
    /// The members of `endpoints` (at least one), reached with `options`; a member silent for half of
    /// `node_timeout` is passed over.
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
            hedge_after: node_timeout / 2,
            preferred: AtomicUsize::new(0),
        }
    }

    /// Runs `request` on one member after another (see the module's doc) until one answers, for at most
    /// `limit`; the error names what each member did.
    pub async fn call<T, F, Fut>(&self, limit: Duration, request: F) -> Result<T, String>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.members.len();
        if n == 0 {
            return Err("no etcd endpoints".to_string());
        }
        let deadline = Instant::now() + limit;
        let hedge_after = self.hedge_after.min(limit / 2);
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
                () = sleep_until(deadline) => break,
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
                            pending.push(self.attempt(i, &request));
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
        let silent = format!("no answer within {} ms", limit.as_millis());
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

    /// One attempt of `request` on member `i`, connecting to it first if need be.
    async fn attempt<T, F, Fut>(&self, i: usize, request: &F) -> (usize, Attempt<T>)
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let member = &self.members[i];
        let connect = || Client::connect([&member.endpoint], Some(self.options.clone()));
        let client = match member.client.get_or_try_init(connect).await {
            Ok(client) => client.clone(),
            Err(e) => return (i, settle(e, |why| format!("cannot connect: {why}"))),
        };
        (i, settle_result(request(client).await))
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
    use super::is_answer;
    use etcd_client::Error;
    use tonic::{Code, Status};

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
