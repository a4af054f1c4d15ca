//! A command's session with the store: reading it for `status`, `history` and `explain` (through the
//! [`crate::inspect`] model's reads), for `pause` and `trigger`, and writing it for `pause`, `resume` and
//! `trigger` — bounded in time, with what it could not read.
//!
//! A command opens the store of its config ([`Store::open`], so it reads what the workers write, whatever
//! the backend), reads from a majority of the nodes, and keeps a note of every node that did not answer and
//! every stored item that could not be parsed ([`Notes`]), for the warnings on stderr and the JSON's
//! `missing_nodes` and `skipped`. No majority is an error with its own exit code
//! ([`super::Exit::NoMajority`]); every read of a command together is bounded by [`COMMAND_TIMEOUT`], so a
//! command never waits forever, however the nodes misbehave (each exchange with one node is bounded by the
//! store as well).

use std::future::Future;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::clock::cluster::{ClusterClock, Estimate};
use crate::config::{Config, StoreConfig};
use crate::history::{Entry, Query};
use crate::inspect::Notes;
use crate::lock::{InForce, Pause, PauseOutcome, PauseRead, QuorumFailure};
use crate::membership::Member;
use crate::store::{Read, Store, StoreError};
use crate::trigger::TriggerRequest;

/// The longest a command waits for the store, all its reads together.
pub(super) const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a command could not read the store.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReadError {
    /// Fewer than a majority of the nodes answered: nothing read can be trusted to be complete.
    #[error("the store could not be reached: no majority: {} of {} nodes answered, {} needed; unreachable: {}", .0.granted, .0.configured, .0.needed, unreachable(&.0.failures))]
    NoMajority(QuorumFailure),
    #[error("the store did not answer within {} s", COMMAND_TIMEOUT.as_secs())]
    Timeout,
    /// The embedded store's database does not exist: no worker has run with this config on this host.
    #[error("the embedded store {} does not exist: no worker has run with this config on this host \
             (or embedded.path names another file)", .0.display())]
    NoDatabase(std::path::PathBuf),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

impl ReadError {
    /// The documented exit code for this failure.
    pub(super) fn exit_code(&self) -> super::Exit {
        match self {
            ReadError::NoMajority(_) => super::Exit::NoMajority,
            ReadError::Timeout
            | ReadError::NoDatabase(_)
            | ReadError::Store(_)
            | ReadError::Runtime(_) => super::Exit::Failure,
        }
    }
}

fn unreachable(failures: &[(String, String)]) -> String {
    let nodes: Vec<String> = failures
        .iter()
        .map(|(node, why)| format!("{node} ({why})"))
        .collect();
    nodes.join(", ")
}

/// One command's session with the store: a runtime, the store, a deadline, and the notes so far.
pub(super) struct Reader {
    runtime: tokio::runtime::Runtime,
    store: Store,
    deadline: Instant,
    notes: Notes,
}

impl Reader {
    /// Opens the store `config` names; nothing is read yet. An embedded store's database must exist:
    /// reading never creates one.
    pub(super) fn open(config: &Config) -> Result<Reader, ReadError> {
        if let StoreConfig::Embedded(embedded) = &config.store {
            if !embedded.path.exists() {
                return Err(ReadError::NoDatabase(embedded.path.clone()));
            }
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ReadError::Runtime)?;
        let store = {
            let _inside = runtime.enter();
            Store::open(config)?
        };
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        bounded(&runtime, deadline, store.prepare())??;
        Ok(Reader {
            runtime,
            notes: Notes::new(&store),
            store,
            deadline,
        })
    }

    /// The store, for a read of the [`crate::inspect`] model handed to [`Reader::gather`].
    pub(super) fn store(&self) -> &Store {
        &self.store
    }

    /// Runs one of the [`crate::inspect`] model's reads within the command's deadline; the read keeps its
    /// own notes.
    pub(super) fn gather<T>(
        &self,
        read: impl Future<Output = Result<T, QuorumFailure>>,
    ) -> Result<T, ReadError> {
        bounded(&self.runtime, self.deadline, read)?.map_err(ReadError::NoMajority)
    }

    /// Every worker the store knows, alive or dead.
    pub(super) fn members(&mut self) -> Result<Vec<Member>, ReadError> {
        let store = &self.store;
        let read = bounded(&self.runtime, self.deadline, store.members())?
            .map_err(ReadError::NoMajority)?;
        Ok(self.note(read))
    }

    /// The entries of each query, in the order of `queries`, all read at once.
    pub(super) fn histories(&mut self, queries: &[Query]) -> Result<Vec<Vec<Entry>>, ReadError> {
        let store = &self.store;
        let reads = bounded(
            &self.runtime,
            self.deadline,
            join_all(queries.iter().map(|query| store.history(query))),
        )?;
        let mut histories = Vec::with_capacity(reads.len());
        for read in reads {
            let read = read.map_err(ReadError::NoMajority)?;
            histories.push(self.note(read));
        }
        Ok(histories)
    }

    /// The pause of each of `jobs`, in order.
    pub(super) fn pauses(&mut self, jobs: &[String]) -> Result<Vec<Option<PauseRead>>, ReadError> {
        let store = &self.store;
        let read = bounded(&self.runtime, self.deadline, store.pauses(jobs))?
            .map_err(ReadError::NoMajority)?;
        Ok(self.note(read))
    }

    /// Pauses `job` on a majority of the nodes, unless a longer pause in force stays or it has ended
    /// ([`Store::pause`]).
    pub(super) fn pause(
        &mut self,
        job: &str,
        pause: &Pause,
        in_force: InForce,
    ) -> Result<PauseOutcome, ReadError> {
        let store = &self.store;
        bounded(
            &self.runtime,
            self.deadline,
            store.pause(job, pause, in_force),
        )?
        .map_err(ReadError::NoMajority)
    }

    /// Resumes `job` on a majority of the nodes; whether a node held a pause.
    pub(super) fn resume(&mut self, job: &str) -> Result<bool, ReadError> {
        let store = &self.store;
        bounded(&self.runtime, self.deadline, store.resume(job))?.map_err(ReadError::NoMajority)
    }

    /// This host's offset to the nodes' clocks, measured as a worker measures it: `None` where the store has
    /// no clock to read (etcd, the embedded store), else the offset or why there is none.
    pub(super) fn measure_clock(
        &mut self,
    ) -> Result<Option<Result<Estimate, QuorumFailure>>, ReadError> {
        bounded(&self.runtime, self.deadline, self.store.measure_offset())
    }

    /// Cluster time, as the workers keep it: this host's clock corrected by its offset to the nodes'
    /// clocks where the store has clocks to read (Redis) and they answer, else this host's clock — for
    /// stamping what the command records, never a reason to refuse it. Measured once, read at each stamp.
    pub(super) fn cluster_clock(&mut self) -> ClusterClock {
        let clock = ClusterClock::local();
        if let Ok(Some(Ok(estimate))) = self.measure_clock() {
            clock.set(&estimate);
        }
        clock
    }

    /// Writes history entries to every node (a majority must take them), as the workers write theirs.
    pub(super) fn record(&mut self, entries: &[Entry]) -> Result<(), ReadError> {
        let store = &self.store;
        bounded(&self.runtime, self.deadline, store.record(entries))?.map_err(ReadError::NoMajority)
    }

    /// Writes a trigger request to a majority of the nodes.
    pub(super) fn request_trigger(&mut self, request: &TriggerRequest) -> Result<(), ReadError> {
        let store = &self.store;
        bounded(&self.runtime, self.deadline, store.request_trigger(request))?
            .map_err(ReadError::NoMajority)
    }

    /// Gives the next reads [`COMMAND_TIMEOUT`] again, for a command that waits for a run between reads.
    pub(super) fn renew_deadline(&mut self) {
        self.deadline = Instant::now() + COMMAND_TIMEOUT;
    }

    /// Sleeps `wait` (between the reads of a command that waits for a run).
    pub(super) fn sleep(&self, wait: Duration) {
        // The timer must be made inside the runtime, hence the `async` block.
        self.runtime
            .block_on(async { tokio::time::sleep(wait).await });
    }

    /// What the reads so far could not see.
    pub(super) fn notes(&self) -> Notes {
        self.notes.clone()
    }

    /// Keeps the notes of `read` and gives its value.
    fn note<T>(&mut self, read: Read<T>) -> T {
        self.notes.keep(read)
    }
}

/// Runs `read` on `runtime`, giving up at `deadline`.
fn bounded<T>(
    runtime: &tokio::runtime::Runtime,
    deadline: Instant,
    read: impl Future<Output = T>,
) -> Result<T, ReadError> {
    // The timer must be made inside the runtime, hence the `async` block.
    runtime
        .block_on(async { tokio::time::timeout_at(deadline, read).await })
        .map_err(|_| ReadError::Timeout)
}
