//! Run history and membership on the embedded store, in the same shape as on the Redis nodes
//! ([`crate::store::redis::history`]).
//!
//! History: one row per entry identity (job, [`crate::history::Entry::id`]), replaced by a later version
//! of the same fact. A batch is one transaction; as on Redis, a write of a tick that checks the bound
//! ([`crate::history::HistorySettings::checks_bound_at`]) counts its job's ticks in the same transaction
//! and cuts them back to `keep_ticks` once there are more than
//! [`crate::history::HistorySettings::most_ticks`]. Members: one row per worker, stamped with this host's wall clock when it announced
//! (`seen_at`), alive until its heartbeat expires on the boot clock of the boot it announced in (a
//! `stopped` announcement is not alive), and dropped once it has been dead for [`KEEP_DEAD`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::params;

use super::{nanos, EmbeddedStore};
use crate::clock::boot::BootInstant;
use crate::history::{Entry, Query};
use crate::lock::QuorumFailure;
use crate::membership::{self, Member, KEEP_DEAD};
use crate::store::Records;
use crate::store::{skip_note, Read};

impl Records for EmbeddedStore {
    /// Keeps `entries`, and each of their jobs within its bound (see the module); see
    /// [`crate::store::Store::record`].
    async fn record(&self, entries: &[Entry]) -> Result<(), QuorumFailure> {
        if entries.is_empty() {
            return Ok(());
        }
        let entries = entries.to_vec();
        self.write(move |shared, transaction| {
            let mut insert = transaction.prepare_cached(
                "INSERT INTO history (job, id, tick, entry) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (job, id) DO UPDATE SET tick = excluded.tick, entry = excluded.entry",
            )?;
            for entry in &entries {
                insert.execute(params![entry.job, entry.id(), entry.tick, entry.to_json()])?;
            }
            // Only the jobs with an entry of a tick that checks the bound are counted (as on Redis).
            let settings = &shared.history;
            let mut jobs: Vec<&str> = entries
                .iter()
                .filter(|e| settings.checks_bound_at(e.tick))
                .map(|e| e.job.as_str())
                .collect();
            jobs.sort_unstable();
            jobs.dedup();
            let keep = i64::try_from(settings.keep_ticks).unwrap_or(i64::MAX);
            let most = i64::try_from(settings.most_ticks()).unwrap_or(i64::MAX);
            let mut tick_past = transaction.prepare_cached(
                "SELECT tick FROM history WHERE job = ?1 GROUP BY tick ORDER BY tick DESC
                 LIMIT 1 OFFSET ?2",
            )?;
            for job in jobs {
                // More ticks than `most`: the newest tick past `keep`, and every older one, go.
                let over: Option<i64> = tick_past
                    .query_map(params![job, most], |row| row.get(0))?
                    .next()
                    .transpose()?;
                if over.is_none() {
                    continue;
                }
                let cutoff: Option<i64> = tick_past
                    .query_map(params![job, keep], |row| row.get(0))?
                    .next()
                    .transpose()?;
                if let Some(cutoff) = cutoff {
                    transaction
                        .prepare_cached("DELETE FROM history WHERE job = ?1 AND tick <= ?2")?
                        .execute(params![job, cutoff])?;
                }
            }
            Ok(())
        })
        .await
    }

    /// The entries of `query`, newest first; see [`crate::store::Store::history`]. An entry that does not
    /// parse is skipped, and named in [`Read::skipped`].
    async fn history(&self, query: &Query) -> Result<Read<Vec<Entry>>, QuorumFailure> {
        let query = query.clone();
        self.read(move |shared, connection| {
            let since = query.since.map_or(i64::MIN, |t| t.as_millis());
            let until = query.until.map_or(i64::MAX, |t| t.as_millis());
            let mut select = connection.prepare_cached(
                "SELECT tick, entry FROM history WHERE job = ?1 AND tick BETWEEN ?2 AND ?3
                 ORDER BY tick DESC",
            )?;
            let mut rows = select.query(params![query.job, since, until])?;
            let (mut entries, mut skipped) = (Vec::new(), Vec::new());
            let mut last_tick = None;
            // Whole ticks up to the limit, so that the merge's order (not the table's) picks the entries
            // of the last tick that fits.
            while let Some(row) = rows.next()? {
                let tick: i64 = row.get(0)?;
                if entries.len() >= query.limit && last_tick != Some(tick) {
                    break;
                }
                last_tick = Some(tick);
                let json: String = row.get(1)?;
                match Entry::from_json(&json) {
                    Ok(entry) => entries.push(entry),
                    Err(why) => {
                        skipped.push(format!("{}: history entry skipped: {why}", shared.label()))
                    }
                }
            }
            Ok(Read::newest(entries, query.limit, skipped))
        })
        .await
    }

    /// Keeps `member`'s announcement, stamped now, alive for [`Member::ttl`] (a `stopped` one: not
    /// alive), and drops members dead for longer than [`KEEP_DEAD`]; see [`crate::store::Store::announce`].
    async fn announce(&self, member: &Member) -> Result<(), QuorumFailure> {
        let member = member.clone();
        self.write(move |shared, transaction| {
            let ttl = member.ttl();
            let seen_ms = Utc::now().timestamp_millis();
            let expired_ms = seen_ms.saturating_add(millis(ttl));
            let json = serde_json::to_string(&member).unwrap_or_default();
            transaction
                .prepare_cached(
                    "INSERT OR REPLACE INTO members (id, seen_ms, member, boot_id, expires_ns, expired_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )?
                .execute(params![
                    member.id,
                    seen_ms,
                    json,
                    shared.boot_id,
                    nanos(BootInstant::now() + ttl),
                    expired_ms
                ])?;
            transaction
                .prepare_cached("DELETE FROM members WHERE expired_ms <= ?1")?
                .execute([seen_ms.saturating_sub(millis(KEEP_DEAD))])?;
            Ok(())
        })
        .await
    }

    /// Every member alive, and every one dead for less than [`KEEP_DEAD`], sorted by id; see
    /// [`crate::store::Store::members`].
    ///
    /// Alive is decided on the boot clock, so a live member is listed whatever the reader's wall clock
    /// says (`redcron trigger` compares its clock with the live workers' heartbeats).
    async fn members(&self) -> Result<Read<Vec<Member>>, QuorumFailure> {
        self.read(|shared, connection| {
            let now = BootInstant::now();
            let kept_since = Utc::now()
                .timestamp_millis()
                .saturating_sub(millis(KEEP_DEAD));
            let mut select = connection.prepare_cached(
                "SELECT id, seen_ms, member, boot_id, expires_ns, expired_ms FROM members",
            )?;
            let mut rows = select.query([])?;
            let (mut members, mut skipped) = (Vec::new(), Vec::new());
            while let Some(row) = rows.next()? {
                // Each column as it comes: a row written by something else may hold any type, and
                // costs a note, not the whole read. A member alive on this host's boot clock is listed
                // whatever the reader's wall clock says (a CLI whose clock is far off still sees it).
                let id: String = row.get(0).unwrap_or_else(|_| "(not text)".to_string());
                let read = || -> Result<Option<Member>, String> {
                    let wrong = |e: rusqlite::Error| e.to_string();
                    let (seen_ms, json): (i64, String) =
                        (row.get(1).map_err(wrong)?, row.get(2).map_err(wrong)?);
                    let (boot_id, expires_ns): (String, i64) =
                        (row.get(3).map_err(wrong)?, row.get(4).map_err(wrong)?);
                    let expired_ms: i64 = row.get(5).map_err(wrong)?;
                    let alive = shared.left(&boot_id, expires_ns, now).is_some();
                    if !alive && expired_ms <= kept_since {
                        return Ok(None);
                    }
                    let mut member = Member::read(&id, &json)?;
                    member.seen_at = DateTime::<Utc>::from_timestamp_millis(seen_ms);
                    member.alive = alive;
                    Ok(Some(member))
                };
                match read() {
                    Ok(Some(member)) => members.push(member),
                    Ok(None) => {}
                    Err(why) => skipped.push(skip_note(&shared.label(), "member", &id, &why)),
                }
            }
            Ok(Read {
                value: membership::merge([members]),
                missing: Vec::new(),
                skipped,
            })
        })
        .await
    }
}

/// A duration in whole milliseconds, as stored.
fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
