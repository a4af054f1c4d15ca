//! Claims on ZooKeeper: read the claim's nodes, decide, and write the claim in one multi-op that applies
//! only if the job's fence node is unchanged since it was read.
//!
//! A claim reads (one multi-read, after one `sync` per batch so that the member answers with what the
//! leader had committed when the batch began) the job's fence node, the series' claim record, the job's
//! lease node, and for a trigger the request's node (its *anchor*), then writes:
//!
//! ```text
//! setData(fence, <as read>, version read)     (create(fence) + setData(fence, version 0) if absent)
//! check(anchor, version read)                 (a trigger only)
//! setData(record, "<T> <value>", version read) or create(record)
//! create(lease, <value>, EPHEMERAL)           (bound to this worker's session)
//! ```
//!
//! Every claim, pause and resume of a job rewrites its fence with the version it read, so of two that
//! read the same version only the first applies and the other is refused and decides again on what is
//! there now: a record of `T` is written for one claimant only (G1), the record's tick never goes down
//! (G1′), and nothing is granted once a pause is committed. The `create` of the lease fails while any
//! session holds it. The **token** is the zxid of the transaction (the fence's new `mzxid`): ZooKeeper
//! gives every committed transaction a zxid above all before it, across leader changes (the epoch is its
//! high half), so tokens strictly increase in grant order (G2) with no clock in the argument.
//!
//! A multi whose answer is lost (connection loss, or no answer within `node_timeout`) is settled by
//! reading the record back in the same session (a session's requests apply in order): this attempt's
//! value in it, with our lease node, is a grant, with the record's `mzxid` as its token. Else the
//! outcome is `NoQuorum`, and the retry of the same claimant finds its own record or lease as its own.
//!
//! The claims of a batch run at once on the one session (up to 256 under way): ZooKeeper pipelines them
//! on its connection, so a batch costs the round trips of one claim (a sync, a read and a write) per 256
//! requests, not one per request; they are not merged into one multi, which would fail whole when one of
//! them is refused.

use futures_util::StreamExt as _;
use zookeeper_client::{CreateMode, MultiReadResult, MultiWriteError, MultiWriteResult};

use super::decide::{decide, Next, Paths, Seen, Snapshot};
use super::session::Session;
use super::{text, ZookeeperStore};
use crate::clock::boot::BootInstant;
use crate::lock::keys::attempt_value;
use crate::lock::{ClaimOutcome, ClaimRequest, Lease};
use crate::store::Claims;

/// How many claims of a batch are under way at once on the session.
const IN_FLIGHT: usize = 256;

/// How a write ended.
enum Written {
    /// Applied, at this zxid.
    Applied(i64),
    /// Refused: something read changed since; read again.
    Changed,
    /// No answer: it may have applied.
    Unknown(String),
}

impl ZookeeperStore {
    /// The nodes of one claim, in one multi-read.
    async fn read_claim(&self, session: &Session, paths: &Paths) -> Result<Snapshot, String> {
        let mut reader = session.client.new_multi_reader();
        let mut add = |path: &str| reader.add_get_data(path).map_err(|e| e.to_string());
        add(&paths.fence)?;
        add(&paths.record)?;
        add(&paths.lease)?;
        if let Some(anchor) = &paths.anchor {
            add(anchor)?;
        }
        let limit = self.settings.node_timeout;
        let results = tokio::time::timeout(limit, reader.commit())
            .await
            .map_err(|_| "no answer within node_timeout".to_string())?
            .map_err(|e| e.to_string())?;
        let mut seen = results.into_iter().map(|result| match result {
            MultiReadResult::Data { data, stat } => Ok(Some(Seen { data, stat })),
            MultiReadResult::Error {
                err: zookeeper_client::Error::NoNode,
            } => Ok(None),
            MultiReadResult::Error { err } => Err(err.to_string()),
            _ => Err("unexpected answer".to_string()),
        });
        let mut next = || seen.next().unwrap_or(Ok(None));
        Ok(Snapshot {
            fence: next()?,
            record: next()?,
            lease: next()?,
            anchor: if paths.anchor.is_some() {
                next()?
            } else {
                None
            },
        })
    }

    /// The claim's multi (see the module), bounded by `node_timeout`.
    async fn write_claim(
        &self,
        session: &Session,
        paths: &Paths,
        seen: &Snapshot,
        record: &str,
        value: &str,
        stale_lease: Option<i32>,
    ) -> Written {
        let persistent = CreateMode::Persistent.with_acls(session.acls);
        let ephemeral = CreateMode::Ephemeral.with_acls(session.acls);
        let mut writer = session.client.new_multi_writer();
        let built = (|| {
            match &seen.fence {
                Some(fence) => {
                    writer.add_set_data(&paths.fence, &fence.data, Some(fence.stat.version))?
                }
                None => {
                    writer.add_create(&paths.fence, b"", &persistent)?;
                    writer.add_set_data(&paths.fence, b"", Some(0))?;
                }
            }
            if let (Some(path), Some(anchor)) = (&paths.anchor, &seen.anchor) {
                writer.add_check_version(path, anchor.stat.version)?;
            }
            match &seen.record {
                Some(old) => {
                    writer.add_set_data(&paths.record, record.as_bytes(), Some(old.stat.version))?
                }
                None => writer.add_create(&paths.record, record.as_bytes(), &persistent)?,
            }
            if let Some(version) = stale_lease {
                writer.add_delete(&paths.lease, Some(version))?;
            }
            writer.add_create(&paths.lease, value.as_bytes(), &ephemeral)
        })();
        if let Err(e) = built {
            return Written::Unknown(e.to_string());
        }
        let limit = self.settings.node_timeout;
        match tokio::time::timeout(limit, writer.commit()).await {
            Err(_) => Written::Unknown("no answer within node_timeout".to_string()),
            Ok(Err(MultiWriteError::OperationFailed { .. })) => Written::Changed,
            Ok(Err(MultiWriteError::RequestFailed { source })) => {
                Written::Unknown(source.to_string())
            }
            Ok(Ok(results)) => {
                let zxid = results.iter().find_map(|result| match result {
                    MultiWriteResult::SetData { stat } => Some(stat.mzxid),
                    _ => None,
                });
                match zxid {
                    Some(zxid) => Written::Applied(zxid),
                    None => Written::Unknown("the answer holds no zxid".to_string()),
                }
            }
        }
    }

    /// After a write without answer: this attempt's record and lease read back, in this session, make a
    /// grant at the record's `mzxid`.
    async fn settle(
        &self,
        session: &Session,
        paths: &Paths,
        record: &str,
        value: &str,
    ) -> Option<i64> {
        let limit = self.settings.node_timeout;
        let read = |path: String| async move {
            match tokio::time::timeout(limit, session.client.get_data(&path)).await {
                Ok(Ok((data, stat))) => Some((data, stat)),
                _ => None,
            }
        };
        let (data, stat) = read(paths.record.clone()).await?;
        if data != record.as_bytes() {
            return None;
        }
        let (lease, lease_stat) = read(paths.lease.clone()).await?;
        (lease == value.as_bytes() && lease_stat.ephemeral_owner == session.id)
            .then_some(stat.mzxid)
    }

    /// Claims one request (see the module), in rounds of read, decide, write, until an outcome.
    async fn claim_one(&self, session: &Session, request: &ClaimRequest) -> ClaimOutcome {
        let paths = Paths::of(request);
        let rounds = self.settings.retries.max(3) + 1;
        for _ in 0..rounds {
            // The read proves the session alive after it was sent: a settled grant's deadline counts
            // from here, not from when the answer came.
            let read_sent = BootInstant::now();
            let seen = match self.read_claim(session, &paths).await {
                Ok(seen) => seen,
                Err(why) => return ClaimOutcome::NoQuorum(self.failure(why)),
            };
            let now_ms = chrono::Utc::now().timestamp_millis();
            let stale_lease = match decide(
                request,
                &seen,
                session.id,
                self.settings.retry_delay,
                now_ms,
            ) {
                Next::Outcome(outcome) => return outcome,
                Next::Settled { value, token } => {
                    return self.won(session, request, &paths, value, token, read_sent)
                }
                Next::Write { stale_lease } => stale_lease,
            };
            let value = attempt_value(
                &request.claimant,
                request.tick,
                &request.fingerprint,
                &request.series,
            );
            let record = match request.record_expires_at() {
                Some(expires) => format!("{} {value}\n{expires}", request.tick.as_millis()),
                None => format!("{} {value}", request.tick.as_millis()),
            };
            let sent = BootInstant::now();
            match self
                .write_claim(session, &paths, &seen, &record, &value, stale_lease)
                .await
            {
                Written::Applied(zxid) => {
                    if request.not_after.is_some() {
                        tokio::spawn(sweep_one_offs(session.client.clone(), paths.fence.clone()));
                    }
                    return self.won(session, request, &paths, value, zxid, sent);
                }
                Written::Changed => continue,
                Written::Unknown(why) => {
                    return match self.settle(session, &paths, &record, &value).await {
                        Some(zxid) => self.won(session, request, &paths, value, zxid, sent),
                        None => ClaimOutcome::NoQuorum(self.failure(why)),
                    }
                }
            }
        }
        ClaimOutcome::Contended {
            holder: None,
            retry_in: self.settings.retry_delay,
        }
    }

    /// A grant at `zxid` whose lease was last proven at `sent`, if its validity is not spent yet; else the
    /// lease node is deleted and the claim answers `NoQuorum` (its retry finds the record its own).
    fn won(
        &self,
        session: &Session,
        request: &ClaimRequest,
        paths: &Paths,
        value: String,
        zxid: i64,
        sent: BootInstant,
    ) -> ClaimOutcome {
        let deadline = self.lease_deadline(sent, session.timeout);
        let token = u64::try_from(zxid).ok().filter(|token| *token > 0);
        let Some(token) = token.filter(|_| BootInstant::now() < deadline) else {
            let client = session.client.clone();
            let lease = paths.lease.clone();
            tokio::spawn(async move { client.delete(&lease, None).await });
            let why = format!("the claim took longer than the lease's validity (zxid {zxid})");
            return ClaimOutcome::NoQuorum(self.failure(why));
        };
        let lease = Lease::new(request, token, value, deadline);
        self.remember(&lease, session.id, session.client.clone());
        ClaimOutcome::Won(lease)
    }

    /// [`Self::claim_one`], with the request's index.
    async fn claim_indexed(
        &self,
        session: &Session,
        index: usize,
        request: &ClaimRequest,
    ) -> (usize, ClaimOutcome) {
        (index, self.claim_one(session, request).await)
    }

    /// Claims every request on the session, up to [`IN_FLIGHT`] at once, after one `sync`; each outcome
    /// to `decided` as soon as it is known.
    async fn claim_batch(
        &self,
        requests: &[ClaimRequest],
        decided: &mut impl FnMut(usize, ClaimOutcome),
    ) {
        if requests.is_empty() {
            return;
        }
        let limit = self.settings.node_timeout;
        let session = match self.sessions.current(limit).await {
            Ok(session) => session,
            Err(why) => {
                for index in 0..requests.len() {
                    decided(index, ClaimOutcome::NoQuorum(self.failure(why.clone())));
                }
                return;
            }
        };
        let synced = tokio::time::timeout(limit, session.client.sync("/jobs")).await;
        if let Some(why) = match synced {
            Err(_) => Some("no answer to sync within node_timeout".to_string()),
            Ok(Err(e)) => Some(e.to_string()),
            Ok(Ok(())) => None,
        } {
            for index in 0..requests.len() {
                decided(index, ClaimOutcome::NoQuorum(self.failure(why.clone())));
            }
            return;
        }
        let session = &session;
        // At most IN_FLIGHT at once: a server takes 1,000 outstanding requests before it throttles
        // (`globalOutstandingLimit`), and a throttled answer would come after `node_timeout`.
        let mut pending = futures_util::stream::FuturesUnordered::new();
        let mut waiting = requests.iter().enumerate();
        for (index, request) in waiting.by_ref().take(IN_FLIGHT) {
            pending.push(self.claim_indexed(session, index, request));
        }
        while let Some((index, outcome)) = pending.next().await {
            decided(index, outcome);
            if let Some((index, request)) = waiting.next() {
                pending.push(self.claim_indexed(session, index, request));
            }
        }
    }
}

impl Claims for ZookeeperStore {
    /// Claims every request at once on the session (see the module); see
    /// [`crate::store::Store::claim_many`].
    async fn claim_many(&self, requests: &[ClaimRequest]) -> Vec<ClaimOutcome> {
        let mut outcomes: Vec<Option<ClaimOutcome>> = requests.iter().map(|_| None).collect();
        self.claim_batch(requests, &mut |index, outcome| {
            if let Some(slot) = outcomes.get_mut(index) {
                *slot = Some(outcome);
            }
        })
        .await;
        let missing = || ClaimOutcome::unanswered(self.hosts.len());
        outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(missing))
            .collect()
    }

    /// As [`ZookeeperStore::claim_many`], handing each outcome to `decided` as soon as it is known; see
    /// [`crate::store::Store::claim_each`].
    async fn claim_each(
        &self,
        requests: &[ClaimRequest],
        mut decided: impl FnMut(usize, ClaimOutcome),
    ) {
        self.claim_batch(requests, &mut decided).await;
    }
}

/// Deletes the job's one-off claim records (triggers, retries: `c:…` under its fence) past their expiry
/// (the second line of the record: the window's end plus [`crate::lock::ONE_OFF_RECORD_KEEP`], on this
/// host's clock), at the version read; at most [`super::MAX_CHILDREN`] are looked at. Run after each grant
/// of a one-off instance, so that they never pile up; a claim of an expired instance is refused anyway
/// (its window has ended).
async fn sweep_one_offs(client: zookeeper_client::Client, fence: String) {
    let Ok(names) = client.list_children(&fence).await else {
        return;
    };
    let now_ms = chrono::Utc::now().timestamp_millis();
    for name in names
        .iter()
        .filter(|name| name.starts_with("c:"))
        .take(super::MAX_CHILDREN)
    {
        let path = format!("{fence}/{name}");
        let Ok((data, stat)) = client.get_data(&path).await else {
            continue;
        };
        let expires = text(&data)
            .ok()
            .and_then(|record| record.lines().nth(1)?.parse::<i64>().ok());
        if expires.is_some_and(|expires| expires <= now_ms) {
            let _ = client.delete(&path, Some(stat.version)).await;
        }
    }
}
