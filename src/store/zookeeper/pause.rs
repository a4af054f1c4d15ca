//! Pauses on ZooKeeper: the job's fence node holds its pause (`Pause::to_value`; empty: none), written
//! with the version read, so that a pause, a resume and every claim of the job are ordered in one place
//! (`claim.rs`): once a pause is committed, a claim that read the fence before it fails its version
//! check and reads the pause. A pause with an end counts as none once it ended (on the reader's clock),
//! and a shorter one never replaces a longer one by accident: it is decided ([`Pause::decide`]) on the
//! pause read, and written only if that is still the fence's data.

use zookeeper_client::CreateMode;

use super::decide::{job_path, pause_in};
use super::{text, ZookeeperStore, EXCHANGE_TIMEOUT};
use crate::lock::{InForce, Pause, PauseOutcome, PauseRead, QuorumFailure};
use crate::store::{skip_note, Pauses, Read};

/// How many times a pause or resume reads and writes again after a claim changed the fence under it.
const ROUNDS: usize = 20;

/// The change a pause or resume makes to the fence, decided on what it holds.
enum Change {
    Write(String),
    Done,
}

impl ZookeeperStore {
    /// Reads the job's fence (after a sync), decides with `decide` on the pause in force, and writes the
    /// decided data at the version read, again until it applies; the decision's answer.
    async fn change_pause<T: Clone>(
        &self,
        job: &str,
        decide: impl Fn(Option<&Pause>) -> (T, Change),
    ) -> Result<T, QuorumFailure> {
        let path = job_path(job);
        let run = async {
            let session = self.sessions.current(EXCHANGE_TIMEOUT).await?;
            let client = &session.client;
            let persistent = CreateMode::Persistent.with_acls(session.acls);
            for _ in 0..ROUNDS {
                client.sync(&path).await.map_err(|e| e.to_string())?;
                let (current, version) = match client.get_data(&path).await {
                    Ok((data, stat)) => (data, Some(stat.version)),
                    Err(zookeeper_client::Error::NoNode) => (Vec::new(), None),
                    Err(e) => return Err(e.to_string()),
                };
                let now = chrono::Utc::now();
                let (answer, change) = decide(pause_in(&current, now.timestamp_millis()).as_ref());
                let Change::Write(data) = change else {
                    return Ok(answer);
                };
                let written = match version {
                    Some(version) => client
                        .set_data(&path, data.as_bytes(), Some(version))
                        .await
                        .map(|_| ()),
                    None => client
                        .create(&path, data.as_bytes(), &persistent)
                        .await
                        .map(|_| ()),
                };
                match written {
                    Ok(()) => return Ok(answer),
                    Err(
                        zookeeper_client::Error::BadVersion | zookeeper_client::Error::NodeExists,
                    ) => continue,
                    Err(e) => return Err(e.to_string()),
                }
            }
            Err("the job's fence kept changing under the write".to_string())
        };
        match tokio::time::timeout(EXCHANGE_TIMEOUT, run).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(why)) => Err(self.failure(why)),
            Err(_) => Err(self.failure("no answer in time")),
        }
    }
}

impl Pauses for ZookeeperStore {
    /// Writes the pause into the job's fence, decided on the pause in force and written only on it; see
    /// [`crate::store::Store::pause`].
    async fn pause(
        &self,
        job: &str,
        pause: &Pause,
        in_force: InForce,
    ) -> Result<PauseOutcome, QuorumFailure> {
        self.change_pause(job, |current| {
            let outcome = pause.decide(current, in_force, chrono::Utc::now());
            let change = match outcome {
                PauseOutcome::Paused => Change::Write(pause.to_value()),
                PauseOutcome::LongerKept(_) | PauseOutcome::AlreadyOver => Change::Done,
            };
            (outcome, change)
        })
        .await
    }

    /// Empties the job's fence data (a write, so that it orders against claims too); whether a pause was
    /// in force; see [`crate::store::Store::resume`].
    async fn resume(&self, job: &str) -> Result<bool, QuorumFailure> {
        self.change_pause(job, |current| {
            (current.is_some(), Change::Write(String::new()))
        })
        .await
    }

    /// The pause of each of `jobs`, in order, read in multi-reads of the fences; see
    /// [`crate::store::Store::pauses`]. A pause stands on every member: it is committed state.
    async fn pauses(&self, jobs: &[String]) -> Result<Read<Vec<Option<PauseRead>>>, QuorumFailure> {
        let session = self
            .sessions
            .current(EXCHANGE_TIMEOUT)
            .await
            .map_err(|why| self.failure(why))?;
        let now_ms = chrono::Utc::now().timestamp_millis();
        let (mut value, mut skipped) = (Vec::with_capacity(jobs.len()), Vec::new());
        for chunk in jobs.chunks(500) {
            let datas = self
                .read_many(
                    &session,
                    chunk.iter().map(|job| job_path(job)),
                    super::records::READ_CHUNK,
                )
                .await
                .map_err(|why| self.failure(why))?;
            for (job, data) in chunk.iter().zip(datas) {
                let data = data.map(|(data, _)| data).unwrap_or_default();
                if let Err(why) = text(&data) {
                    skipped.push(skip_note("zookeeper", "pause", job, &why));
                }
                value.push(pause_in(&data, now_ms).map(|pause| PauseRead {
                    pause,
                    nodes: self.hosts.len(),
                }));
            }
        }
        Ok(Read {
            value,
            missing: Vec::new(),
            skipped,
        })
    }
}
