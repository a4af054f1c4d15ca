//! Why a stale copy of `redcron pause` or `resume` never applies on etcd: every pause and resume is a
//! transaction guarded by the job's `…:pause_seq` key ([`pause_seq_key`]).
//!
//! The store fails over from a silent member (`cluster.rs`), so one request may reach etcd twice, and
//! the copy buffered in a hung member applies when that member wakes, possibly long after. A plain put
//! of the pause would then pause the job again after a later `resume` (and a stale `resume` would undo a
//! newer pause, an old `pause --for 1h` overtake a newer `--for 5m`). So a write first reads the
//! `mod_revision` of `…:pause_seq` and of `…:paused` (one linearizable snapshot: the guard), then sends
//! one transaction: *if both are unchanged, write or delete `…:paused` and put `…:pause_seq`*. Every
//! pause and resume puts `…:pause_seq` and it is never deleted, so its `mod_revision` only grows: once any
//! later pause or resume applied, a copy of an earlier one compares a revision that is gone and fails,
//! however late it arrives. The live command, refused, reads the guard again (the refused transaction
//! returns it) and retries, so the last command to apply wins; `…:paused` is compared too, so a `--for`
//! pause that ended in between is noticed. `…:pause_seq` holds a new random value per attempt: a refusal
//! that shows this attempt's own value means that the other copy of this very transaction applied first,
//! and then the answer is that copy's (for `resume`, whether there was a pause: known from the guard).
//!
//! The same guard makes a pause's decision atomic with its write ([`Pause::decide`]): whether a pause in
//! force outlasts the new one is decided on the pause read with the guard, and the write applies only if
//! `…:paused` is still that one — else the command reads again and decides again.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::history::EXCHANGE_TIMEOUT;
use super::snapshot::Seen;
use super::EtcdStore;
use crate::lock::keys::{pause_key, pause_seq_key};
use crate::lock::{InForce, Pause, PauseOutcome, QuorumFailure};

/// How many times a pause or resume reads the guard again after a refusal (each one means another
/// pause or resume applied meanwhile) before it gives up.
const MAX_TRIES: usize = 16;

/// The revisions a guarded pause or resume compares: what `…:pause_seq` and `…:paused` had when read
/// (0: absent). A write carrying it applies only while neither changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PauseGuard {
    seq: i64,
    paused: i64,
}

/// How one guarded write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guarded {
    /// It applied (this copy or another copy of the same transaction); whether the job was paused just
    /// before.
    Applied { was_paused: bool },
    /// Another pause or resume applied (or a `--for` pause ended) since the guard was read: nothing was
    /// written. The guard as it is now.
    Refused(PauseGuard),
}

/// What a guarded write does to `…:paused`.
pub(super) enum Change {
    /// Puts the pause's value, bound to an etcd lease for a pause with an end.
    Pause { value: String, lease: Option<i64> },
    /// Deletes it.
    Resume,
}

/// A guard as read, with `…:pause_seq` (its value tells a refusal of this very attempt) and the pause in
/// force (the one a pause's decision is made on).
struct GuardRead {
    guard: PauseGuard,
    seq: Option<Seen>,
    pause: Option<Pause>,
}

/// The two keys a guard is made of.
struct GuardKeys {
    seq: String,
    paused: String,
}

impl GuardKeys {
    fn of(prefix: &str, job: &str) -> GuardKeys {
        GuardKeys {
            seq: pause_seq_key(prefix, job),
            paused: pause_key(prefix, job),
        }
    }

    /// A get of each key: what a guard read and a refused write return.
    fn gets(&self) -> Vec<TxnOp> {
        vec![
            TxnOp::get(self.seq.as_str(), None),
            TxnOp::get(self.paused.as_str(), None),
        ]
    }
}

impl EtcdStore {
    /// `job`'s pause guard as it is now (a linearizable read): what a pause or resume sent now compares.
    pub async fn pause_guard(&self, job: &str) -> Result<PauseGuard, QuorumFailure> {
        Ok(self.guard_read(job).await?.guard)
    }

    /// `job`'s guard and pause as they are now (a linearizable read).
    async fn guard_read(&self, job: &str) -> Result<GuardRead, QuorumFailure> {
        let keys = GuardKeys::of(&self.settings.key_prefix, job);
        let answer = self
            .txn(EXCHANGE_TIMEOUT, Txn::new().and_then(keys.gets()))
            .await
            .map_err(|why| self.failure(why))?;
        read_guard(&answer.op_responses()).map_err(|why| self.failure(why))
    }

    /// One attempt at pausing `job` under `guard`: applies only if no pause or resume applied since the
    /// guard was read. [`crate::store::Pauses::pause`] retries it until it applies.
    pub async fn pause_if(
        &self,
        job: &str,
        pause: &Pause,
        guard: PauseGuard,
    ) -> Result<Guarded, QuorumFailure> {
        let change = self.pause_change(pause).await?;
        self.write_if(job, &change, guard).await
    }

    /// One attempt at resuming `job` under `guard`, as [`Self::pause_if`].
    pub async fn resume_if(&self, job: &str, guard: PauseGuard) -> Result<Guarded, QuorumFailure> {
        self.write_if(job, &Change::Resume, guard).await
    }

    /// The change that writes `pause`: bound to a new etcd lease of its duration if it has an end.
    pub(super) async fn pause_change(&self, pause: &Pause) -> Result<Change, QuorumFailure> {
        let lease = match pause.left(chrono::Utc::now()) {
            Some(left) => Some(
                self.grant_lease(left.max(std::time::Duration::from_millis(1)))
                    .await
                    .map_err(|why| self.failure(why))?,
            ),
            None => None,
        };
        Ok(Change::Pause {
            value: pause.to_value(),
            lease,
        })
    }

    /// Applies `change` to `job`'s pause, reading the guard again after each refusal; whether the job
    /// was paused just before it applied. Fails if etcd does not answer, or if the guard was overtaken
    /// [`MAX_TRIES`] times in a row.
    pub(super) async fn write_guarded(
        &self,
        job: &str,
        change: &Change,
    ) -> Result<bool, QuorumFailure> {
        let mut guard = self.pause_guard(job).await?;
        for _ in 0..MAX_TRIES {
            match self.write_if(job, change, guard).await? {
                Guarded::Applied { was_paused } => return Ok(was_paused),
                Guarded::Refused(now) => guard = now,
            }
        }
        Err(self.overtaken(job))
    }

    /// Writes `pause` unless the pause in force outlasts it (with [`InForce::KeepLonger`]) or it has
    /// ended ([`Pause::decide`], on the pause read with the guard); after a refusal, reads and decides
    /// again. Fails if etcd does not answer, or if the guard was overtaken [`MAX_TRIES`] times in a row.
    pub(super) async fn pause_guarded(
        &self,
        job: &str,
        pause: &Pause,
        in_force: InForce,
    ) -> Result<PauseOutcome, QuorumFailure> {
        let mut read = self.guard_read(job).await?;
        let mut change: Option<Change> = None;
        for _ in 0..MAX_TRIES {
            let decided = pause.decide(read.pause.as_ref(), in_force, chrono::Utc::now());
            if decided != PauseOutcome::Paused {
                // Nothing was written, by this attempt or an earlier refused one: the lease binds nothing.
                if let Some(Change::Pause {
                    lease: Some(id), ..
                }) = change
                {
                    self.revoke_later(id);
                }
                return Ok(decided);
            }
            let change = match &mut change {
                Some(change) => change,
                unset => unset.insert(self.pause_change(pause).await?),
            };
            match self.write_once(job, change, read.guard).await? {
                (Guarded::Applied { .. }, _) => return Ok(PauseOutcome::Paused),
                (Guarded::Refused(_), now) => read = now,
            }
        }
        Err(self.overtaken(job))
    }

    fn overtaken(&self, job: &str) -> QuorumFailure {
        self.failure(format!(
            "the pause of {job} changed {MAX_TRIES} times while this command tried to write it"
        ))
    }

    /// One guarded transaction of `change` under `guard` (see the module's doc).
    async fn write_if(
        &self,
        job: &str,
        change: &Change,
        guard: PauseGuard,
    ) -> Result<Guarded, QuorumFailure> {
        Ok(self.write_once(job, change, guard).await?.0)
    }

    /// One guarded transaction of `change` under `guard`, and the guard and pause as a refusal found them.
    async fn write_once(
        &self,
        job: &str,
        change: &Change,
        guard: PauseGuard,
    ) -> Result<(Guarded, GuardRead), QuorumFailure> {
        let keys = GuardKeys::of(&self.settings.key_prefix, job);
        let stamp = uuid::Uuid::new_v4().simple().to_string();
        let write = match change {
            Change::Pause { value, lease } => TxnOp::put(
                keys.paused.as_str(),
                value.as_str(),
                lease.map(|id| PutOptions::new().with_lease(id)),
            ),
            Change::Resume => TxnOp::delete(keys.paused.as_str(), None),
        };
        let txn = Txn::new()
            .when([
                Compare::mod_revision(keys.seq.as_str(), CompareOp::Equal, guard.seq),
                Compare::mod_revision(keys.paused.as_str(), CompareOp::Equal, guard.paused),
            ])
            .and_then([write, TxnOp::put(keys.seq.as_str(), stamp.as_str(), None)])
            .or_else(keys.gets());
        let answer = self
            .txn(EXCHANGE_TIMEOUT, txn)
            .await
            .map_err(|why| self.failure(why))?;
        if answer.succeeded() {
            let unread = GuardRead {
                guard,
                seq: None,
                pause: None,
            };
            return Ok((guard.applied(), unread));
        }
        let now = read_guard(&answer.op_responses()).map_err(|why| self.failure(why))?;
        Ok((refusal(guard, &stamp, now.seq.as_ref(), now.guard), now))
    }
}

/// The guard, `…:pause_seq` and the pause from the gets of [`GuardKeys::gets`].
fn read_guard(responses: &[TxnOpResponse]) -> Result<GuardRead, String> {
    let one = |index: usize| match responses.get(index) {
        Some(TxnOpResponse::Get(get)) => super::snapshot::seen(get),
        _ => Err("unexpected transaction answer".to_string()),
    };
    let (seq, paused) = (one(0)?, one(1)?);
    let revision = |seen: &Option<Seen>| seen.as_ref().map_or(0, |seen| seen.mod_revision);
    let guard = PauseGuard {
        seq: revision(&seq),
        paused: revision(&paused),
    };
    Ok(GuardRead {
        guard,
        pause: paused.map(|seen| Pause::from_value(&seen.value)),
        seq,
    })
}

/// How a refused write sent under `sent` with stamp `stamp` ended, given `…:pause_seq` as it is now
/// (`seq`, guard `now`): applied after all if the key holds the stamp (the other copy of this very
/// transaction applied first), else refused.
fn refusal(sent: PauseGuard, stamp: &str, seq: Option<&Seen>, now: PauseGuard) -> Guarded {
    if seq.is_some_and(|seq| seq.value == stamp) {
        sent.applied()
    } else {
        Guarded::Refused(now)
    }
}

impl PauseGuard {
    /// A write sent under this guard that applied: it found the job paused if `…:paused` was there.
    fn applied(self) -> Guarded {
        Guarded::Applied {
            was_paused: self.paused != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{refusal, Guarded, PauseGuard, Seen};

    const SENT: PauseGuard = PauseGuard { seq: 7, paused: 5 };
    const NOW: PauseGuard = PauseGuard { seq: 9, paused: 0 };

    fn seq(value: &str) -> Seen {
        Seen {
            value: value.to_string(),
            mod_revision: NOW.seq,
        }
    }

    #[test]
    fn a_refusal_showing_its_own_stamp_is_the_other_copy_applied() {
        assert_eq!(
            refusal(SENT, "mine", Some(&seq("mine")), NOW),
            Guarded::Applied { was_paused: true }
        );
        let unpaused = PauseGuard { paused: 0, ..SENT };
        assert_eq!(
            refusal(unpaused, "mine", Some(&seq("mine")), NOW),
            Guarded::Applied { was_paused: false }
        );
    }

    #[test]
    fn a_refusal_showing_another_stamp_or_none_is_refused_with_the_guard_now() {
        assert_eq!(
            refusal(SENT, "mine", Some(&seq("theirs")), NOW),
            Guarded::Refused(NOW)
        );
        assert_eq!(refusal(SENT, "mine", None, NOW), Guarded::Refused(NOW));
    }
}
