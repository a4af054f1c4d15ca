//! What a claim on ZooKeeper reads and decides on: the nodes of one claim ([`Paths`]), as read
//! ([`Snapshot`]), and what they give the claim ([`decide`]) — the rules of the Lua scripts on a Redis
//! node, as on every store. `claim.rs` reads and writes them.

use zookeeper_client::Stat;

use super::{node_name, text};
use crate::lock::keys::{claim_keys, claimant_of, Holder};
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

/// The outcome the snapshot gives `request` in session `session`, or what to write (see the module).
///
/// The rules of the other stores: refused while paused; refused once a one-off instance's window has
/// ended; refused if another claimant confirmed this tick or
/// a later one in the series (a record that does not parse counts as claimed); a trigger whose request is
/// gone is refused as claimed; busy if another claim instance holds the lease node; contended if another
/// claimant of this instance holds it, or this claimant's lease of an earlier session still stands.
pub(super) fn decide(
    request: &ClaimRequest,
    snapshot: &Snapshot,
    session: i64,
    retry_delay: std::time::Duration,
    now_ms: i64,
) -> Next {
    if let Some(pause) = snapshot
        .fence
        .as_ref()
        .and_then(|fence| pause_in(&fence.data, now_ms))
    {
        return Next::Outcome(ClaimOutcome::Paused(pause));
    }
    if request.not_after.is_some_and(|t| now_ms > t.as_millis()) {
        // A trigger's or retry's window has ended (on this host's clock, as on the embedded store).
        return Next::Outcome(ClaimOutcome::AlreadyClaimed { by: None });
    }
    let tick = request.tick.as_millis();
    let mut ours = None;
    if let Some(record) = &snapshot.record {
        let parsed = text(&record.data).ok().and_then(|value| {
            // The first line; a one-off instance's record has its expiry on a second.
            let (claimed, value) = value.lines().next()?.split_once(' ')?;
            Some((claimed.parse::<i64>().ok()?, value))
        });
        match parsed {
            Some((claimed, value)) if claimed == tick && claimant_of(value) == request.claimant => {
                ours = Some((value, record.stat.mzxid));
            }
            Some((claimed, _)) if claimed < tick => {}
            Some((claimed, value)) => {
                let mut by = Holder::from_value(value);
                by.tick = Some(Tick(claimed));
                return Next::Outcome(ClaimOutcome::AlreadyClaimed { by: Some(by) });
            }
            None => return Next::Outcome(ClaimOutcome::AlreadyClaimed { by: None }),
        }
    }
    if request.series.trigger().is_some() && snapshot.anchor.is_none() {
        return Next::Outcome(ClaimOutcome::AlreadyClaimed { by: None });
    }
    let Some(lease) = &snapshot.lease else {
        return Next::Write { stale_lease: None };
    };
    let value = text(&lease.data).unwrap_or_default();
    if claimant_of(value) == request.claimant {
        if lease.stat.ephemeral_owner != session {
            // Our lease of a session that ended: the ensemble deletes it with that session.
            return Next::Outcome(ClaimOutcome::Contended {
                holder: Some(Holder::from_value(value)),
                retry_in: retry_delay,
            });
        }
        return match ours {
            Some((recorded, token)) if recorded == value => Next::Settled {
                value: value.to_string(),
                token,
            },
            _ => Next::Write {
                stale_lease: Some(lease.stat.version),
            },
        };
    }
    let holder = Holder::from_value(value);
    Next::Outcome(if holder.contends_for(request.tick, &request.series) {
        ClaimOutcome::Contended {
            holder: Some(holder),
            retry_in: retry_delay,
        }
    } else {
        ClaimOutcome::Busy {
            holder: Some(holder),
            ttl: None,
        }
    })
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
