//! What a claim on ZooKeeper reads and decides on: the nodes of one claim ([`Paths`]), as read
//! ([`Snapshot`]), and what they give the claim ([`decide`]) — the one rule of every store. `claim.rs` reads and writes them.

use zookeeper_client::Stat;

use super::{node_name, text};
use crate::lock::decision::{self, Anchor, ClaimView, Decision, LeaseSeen, Record};
use crate::lock::keys::claim_keys;
use crate::lock::{ClaimOutcome, ClaimRequest, Overlap, Pause, Series};
use crate::schedule::Tick;

/// A node as read: its data and stat.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub data: Vec<u8>,
    pub stat: Stat,
}

/// The nodes of one claim.
#[derive(Debug, Clone)]
pub(super) struct Paths {
    pub fence: String,
    pub record: String,
    pub lease: String,
    pub anchor: Option<String>,
}

/// `/jobs/<job>`: the job's fence node.
pub(super) fn job_path(job: &str) -> String {
    format!("/jobs/{}", node_name(job))
}

/// The lease node of `(job, tick)` in `series` with `overlap`: `l` and the lease key's suffix (one per
/// job with `skip`), under the job's fence node.
pub(super) fn lease_path(job: &str, tick: Tick, overlap: Overlap, series: &Series) -> String {
    let [lease_key, ..] = claim_keys("", job, tick, overlap, series);
    let base = format!(":{{{job}}}:lease");
    let suffix = lease_key.strip_prefix(base.as_str()).unwrap_or("");
    format!("{}/l{}", job_path(job), node_name(suffix))
}

impl Paths {
    /// The nodes of `request`.
    pub fn of(request: &ClaimRequest) -> Paths {
        let fence = job_path(&request.job);
        let suffix = request.series.key_suffix(request.tick);
        Paths {
            record: format!("{fence}/c{}", node_name(&suffix)),
            lease: lease_path(&request.job, request.tick, request.overlap, &request.series),
            anchor: request.series.trigger().map(super::triggers::request_path),
            fence,
        }
    }
}

/// The nodes of one claim, as read.
#[derive(Debug, Clone, Default)]
pub(super) struct Snapshot {
    pub fence: Option<Seen>,
    pub record: Option<Seen>,
    pub lease: Option<Seen>,
    pub anchor: Option<Seen>,
}

/// What to do after a read.
#[derive(Debug)]
pub(super) enum Next {
    /// A final or waiting outcome.
    Outcome(ClaimOutcome),
    /// This claimant already won (its record and its lease in this session): the lease value and token.
    Settled { value: String, token: i64 },
    /// Write the claim; first delete this claimant's own stale lease node of this session, at its version.
    Write { stale_lease: Option<i32> },
}

/// The pause standing in fence data, if any: empty data is none; a pause whose end has passed (on this
/// host's clock, as on the embedded store) is none; data that is not text is a pause without end.
pub(super) fn pause_in(data: &[u8], now_ms: i64) -> Option<Pause> {
    if data.is_empty() {
        return None;
    }
    let pause = match text(data) {
        Ok(value) => Pause::from_value(value),
        Err(why) => Pause::from_value(&format!("unreadable fence data ({why})")),
    };
    match pause.until {
        Some(until) if until.timestamp_millis() <= now_ms => None,
        _ => Some(pause),
    }
}

/// The outcome the snapshot gives `request` in session `session`, or what to write (see the module): the
/// one rule, [`crate::lock::decision::decide`], on what the snapshot holds, with this host's clock for
/// pauses and windows (ZooKeeper has no clock to read in a transaction).
///
/// This claimant's lease of an earlier session is not its to replace (the ensemble deletes it with that
/// session): contended. Granted, a claim whose record and lease are already this attempt's in this session
/// is settled with the record's `mzxid` as its token; any other writes the claim, first deleting this
/// claimant's stale lease node of this session.
pub(super) fn decide(
    request: &ClaimRequest,
    snapshot: &Snapshot,
    session: i64,
    retry_delay: std::time::Duration,
    now_ms: i64,
) -> Next {
    // The first line: a one-off instance's record has its expiry on a second.
    let record = snapshot
        .record
        .as_ref()
        .map(|record| match text(&record.data) {
            Ok(value) => Record::parse(value.lines().next().unwrap_or_default()),
            Err(_) => Record::Unreadable,
        });
    let lease = snapshot
        .lease
        .as_ref()
        .map(|lease| (text(&lease.data).unwrap_or_default(), lease));
    let seen = ClaimView {
        pause: snapshot
            .fence
            .as_ref()
            .and_then(|fence| pause_in(&fence.data, now_ms)),
        record,
        anchor: match (&request.series, &snapshot.anchor) {
            (Series::Trigger(_), Some(_)) => Anchor::Present,
            (Series::Trigger(_), None) => Anchor::Gone,
            (Series::Schedule | Series::Retry(_), _) => Anchor::Unchecked,
        },
        now_ms,
        check_ahead: false,
        lease: lease.map(|(value, lease)| LeaseSeen {
            value,
            left: None,
            replaceable: lease.stat.ephemeral_owner == session,
        }),
    };
    if let Decision::Answer(outcome) = decision::decide(request, &seen, retry_delay) {
        return Next::Outcome(outcome);
    }
    let Some((value, lease)) = lease else {
        return Next::Write { stale_lease: None };
    };
    match (record, &snapshot.record) {
        (
            Some(Record::Claimed {
                tick,
                value: recorded,
            }),
            Some(node),
        ) if tick == request.tick && recorded == value => Next::Settled {
            value: value.to_string(),
            token: node.stat.mzxid,
        },
        _ => Next::Write {
            stale_lease: Some(lease.stat.version),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use zookeeper_client::Stat;

    use super::{decide, Next, Seen, Snapshot};
    use crate::lock::{ClaimOutcome, ClaimRequest, Overlap, Series};
    use crate::schedule::Tick;

    fn seen(data: &str, owner: i64, mzxid: i64) -> Option<Seen> {
        let stat = Stat {
            czxid: mzxid,
            mzxid,
            pzxid: mzxid,
            ctime: 0,
            mtime: 0,
            version: 3,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: owner,
            data_length: 0,
            num_children: 0,
        };
        Some(Seen {
            data: data.as_bytes().to_vec(),
            stat,
        })
    }

    fn outcome(request: &ClaimRequest, snapshot: &Snapshot) -> Next {
        decide(request, snapshot, 7, Duration::from_millis(50), 10_000)
    }

    /// The Lua scripts' rules: a pause in force refuses, one that ended does not; a later tick's record
    /// refuses; another run's lease is busy; our own record and lease in this session are a grant already
    /// (also with a one-off record's expiry line), in another session a contender to wait for.
    #[test]
    fn decisions_follow_the_other_stores_rules() {
        let request = ClaimRequest::new("w", "job", Tick(5_000), Overlap::Skip, "f");
        let mut snapshot = Snapshot {
            fence: seen("0|ops|maintenance", 0, 1),
            ..Snapshot::default()
        };
        assert!(matches!(
            outcome(&request, &snapshot),
            Next::Outcome(ClaimOutcome::Paused(_))
        ));
        snapshot.fence = seen("9000|ops|ended", 0, 1);
        assert!(matches!(
            outcome(&request, &snapshot),
            Next::Write { stale_lease: None }
        ));
        snapshot.record = seen("6000 other/1|1|6000|f", 0, 2);
        assert!(matches!(
            outcome(&request, &snapshot),
            Next::Outcome(ClaimOutcome::AlreadyClaimed { by: Some(_) })
        ));
        snapshot.record = seen("\u{fffd}garbage", 0, 2);
        assert!(matches!(
            outcome(&request, &snapshot),
            Next::Outcome(ClaimOutcome::AlreadyClaimed { by: None })
        ));
        snapshot.record = seen("4000 other/1|1|4000|f", 0, 2);
        snapshot.lease = seen("other/1|1|4000|f", 99, 2);
        assert!(matches!(
            outcome(&request, &snapshot),
            Next::Outcome(ClaimOutcome::Busy { .. })
        ));
        let value = format!("{}|9|5000|f", request.claimant);
        snapshot.record = seen(&format!("5000 {value}\n99999"), 0, 42);
        snapshot.lease = seen(&value, 7, 42);
        assert!(matches!(
            outcome(&request, &snapshot),
            Next::Settled { token: 42, .. }
        ));
        snapshot.lease = seen(&value, 8, 42);
        assert!(matches!(
            outcome(&request, &snapshot),
            Next::Outcome(ClaimOutcome::Contended { .. })
        ));
        let late = request.clone().in_series(Series::Retry(1), Tick(9_999));
        assert!(matches!(
            outcome(&late, &Snapshot::default()),
            Next::Outcome(ClaimOutcome::AlreadyClaimed { by: None })
        ));
    }
}
