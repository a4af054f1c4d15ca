//! Records folded from entries made by hand, one test per case the writers produce.

use chrono::{DateTime, Utc};

use super::*;

fn at(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(seconds, 0).unwrap_or_default()
}

fn entry(tick: i64, worker: &str, kind: Kind, reason: Option<&str>) -> Entry {
    let mut entry = Entry::new("j", Tick(tick), worker, kind, at(tick / 1000 + 1));
    entry.reason = reason.map(str::to_string);
    entry
}

/// A run by `worker` with `token`, ended with `outcome` when given.
fn run(tick: i64, worker: &str, token: u64, outcome: Option<&str>) -> Entry {
    let mut run = entry(tick, worker, Kind::Run, None);
    run.token = Some(token);
    if let Some(outcome) = outcome {
        run.ended_at = Some(at(tick / 1000 + 2));
        run.outcome = Some(outcome.to_string());
    }
    run
}

fn workers(entries: &[Entry]) -> Vec<(&str, Kind)> {
    entries
        .iter()
        .map(|e| (e.worker.as_str(), e.kind))
        .collect()
}

/// A current winner's run names the racers: one record, no notes, the silent losers named from its view.
#[test]
fn a_new_run_with_raced_is_one_record_whose_losers_are_silent() {
    let mut won = run(1000, "w2", 4, Some("success"));
    won.raced = Some(vec!["w2".into(), "w1".into(), "w3".into()]);
    let records = group(vec![won.clone()]);
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.run(), Some(&won));
    assert!(record.notes.is_empty() && !record.double_run());
    assert_eq!(record.raced(), ["w2", "w1", "w3"]);
    assert_eq!(record.winner_place(), Some(0));
    assert_eq!(record.silent(), ["w1", "w3"]);
}

/// An earlier version's tick: the run is the record, each loser's `lost` entry a note; the racers come
/// from the entries, and nobody is silent.
#[test]
fn legacy_losers_are_notes_of_the_run() {
    let mut lost = entry(1000, "w1", Kind::Lost, Some("already_claimed"));
    lost.by = Some("w2".into());
    let mut lost3 = lost.clone();
    lost3.worker = "w3".into();
    let records = group(vec![lost, run(1000, "w2", 4, Some("failure")), lost3]);
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.record.worker, "w2");
    assert_eq!(
        workers(&record.notes),
        [("w1", Kind::Lost), ("w3", Kind::Lost)]
    );
    assert_eq!(record.raced(), ["w2", "w1", "w3"]);
    assert_eq!(record.winner_place(), None);
    assert!(record.silent().is_empty());
}

/// Two workers' runs of one tick: the ended one is the record, the other is kept apart as a double run.
#[test]
fn two_workers_runs_of_one_tick_are_a_double_run() {
    let records = group(vec![
        run(1000, "w1", 4, None),
        run(1000, "w2", 5, Some("success")),
    ]);
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.record.worker, "w2");
    assert!(record.double_run());
    assert_eq!(workers(&record.other_runs), [("w1", Kind::Run)]);
    assert!(record.notes.is_empty());
    assert_eq!(record.entries().count(), 2);
}

/// A loss that was not routine (`no_quorum`, a later tick claimed) stays beside the run as a note, its
/// worker among the racers even when the winner's view missed it; a racer with an entry is not silent.
#[test]
fn an_anomaly_is_a_note_beside_the_run() {
    let mut won = run(1000, "w2", 4, Some("success"));
    won.raced = Some(vec!["w1".into(), "w2".into()]);
    let records = group(vec![
        entry(1000, "w1", Kind::Skipped, Some("no_quorum")),
        won,
        entry(1000, "w4", Kind::Lost, Some("later_tick_claimed")),
    ]);
    let record = &records[0];
    assert_eq!(record.record.kind, Kind::Run);
    assert_eq!(
        workers(&record.notes),
        [("w1", Kind::Skipped), ("w4", Kind::Lost)]
    );
    assert_eq!(record.raced(), ["w1", "w2", "w4"]);
    // A racer that could not win in time is not shown as a skip of a tick that ran.
    let shown: Vec<&str> = record.shown_notes().map(|e| e.worker.as_str()).collect();
    assert_eq!(shown, ["w4"]);
    assert_eq!(record.winner_place(), Some(1));
    assert!(record.silent().is_empty());
}

/// A tick nobody ran: the skip is the record; a miss outranks skips, which become its notes.
#[test]
fn a_skip_or_a_miss_is_the_record_of_a_tick_nobody_ran() {
    let records = group(vec![entry(1000, "w1", Kind::Skipped, Some("paused"))]);
    assert_eq!(records[0].record.reason.as_deref(), Some("paused"));
    assert_eq!(records[0].run(), None);
    assert!(records[0].raced().is_empty());

    let records = group(vec![
        entry(2000, "w1", Kind::Skipped, Some("no_quorum")),
        entry(2000, "w2", Kind::Missed, Some("unclaimed")),
    ]);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].record.kind, Kind::Missed);
    assert_eq!(workers(&records[0].notes), [("w1", Kind::Skipped)]);
    assert_eq!(
        records[0].shown_notes().count(),
        1,
        "nothing ran: the skip is shown"
    );
    assert_eq!(records[0].raced(), ["w1"]);
}

/// A run whose tick the miss check also reported (`no_run_recorded`, the run landed late): the run is
/// the record, the miss a note.
#[test]
fn a_run_outranks_a_miss_of_its_tick() {
    let records = group(vec![
        entry(1000, "w1", Kind::Missed, Some("no_run_recorded")),
        run(1000, "w2", 4, None),
    ]);
    assert_eq!(records[0].record.kind, Kind::Run);
    assert_eq!(workers(&records[0].notes), [("w1", Kind::Missed)]);
}

/// Each retry attempt is a record of its own, the latest first, then the tick's first run; newest tick
/// first across ticks.
#[test]
fn retry_attempts_are_records_latest_first() {
    let attempt = |n: u32, worker: &str, token: u64| {
        run(1000, worker, token, Some("failure")).in_series(&Series::Retry(n))
    };
    let records = group(vec![
        run(1000, "w1", 4, Some("failure")),
        attempt(1, "w2", 5),
        run(2000, "w1", 6, Some("success")),
        attempt(2, "w1", 7),
    ]);
    let seen: Vec<(i64, Series)> = records.iter().map(|r| (r.tick().0, r.series())).collect();
    assert_eq!(
        seen,
        [
            (2000, Series::Schedule),
            (1000, Series::Retry(2)),
            (1000, Series::Retry(1)),
            (1000, Series::Schedule),
        ]
    );
    assert!(records.iter().all(|r| !r.double_run()));
}

/// A trigger request's entries are a record apart from a schedule tick at the same instant; two requests
/// of one millisecond are two records.
#[test]
fn a_trigger_is_a_record_of_its_own() {
    let trigger = |id: &str, worker: &str| {
        run(1000, worker, 9, Some("success")).in_series(&Series::Trigger(id.to_string()))
    };
    let mut skipped = entry(1000, "w3", Kind::Skipped, Some("overlap"));
    skipped.trigger = Some("b".into());
    let records = group(vec![
        trigger("b", "w2"),
        run(1000, "w1", 4, Some("success")),
        trigger("a", "w1"),
        skipped,
    ]);
    let seen: Vec<Series> = records.iter().map(TickRecord::series).collect();
    assert_eq!(
        seen,
        [
            Series::Schedule,
            Series::Trigger("a".into()),
            Series::Trigger("b".into())
        ]
    );
    assert!(records.iter().all(|r| !r.double_run()));
    assert_eq!(workers(&records[2].notes), [("w3", Kind::Skipped)]);
}

/// Several jobs at one tick: one record each, by job name.
#[test]
fn records_of_one_tick_are_ordered_by_job() {
    let mut b = run(1000, "w1", 4, Some("success"));
    b.job = "b".into();
    let mut a = run(1000, "w1", 5, Some("success"));
    a.job = "a".into();
    let jobs: Vec<String> = group(vec![b, a])
        .iter()
        .map(|r| r.job().to_string())
        .collect();
    assert_eq!(jobs, ["a", "b"]);
}

/// A pause and a resume are not ticks: the grouping leaves them out, even one made in the very millisecond
/// of a tick, and [`controls`] picks them out.
#[test]
fn controls_are_not_ticks() {
    let control = |action: &'static str, ms: i64| {
        let made = DateTime::from_timestamp_millis(ms).unwrap_or_default();
        let what = crate::history::Control {
            action,
            by: "ops@host".into(),
            reason: "migration".into(),
            until: None,
        };
        Entry::control("j", &what, "cli", made)
    };
    let ran = run(1000, "w1", 4, Some("success"));
    let entries = vec![
        control("resumed", 3_500),
        control("paused", 1_000),
        ran.clone(),
    ];
    let records = group(entries.clone());
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].record, ran);
    assert!(records[0].notes.is_empty());
    let picked = controls(&entries);
    assert_eq!(picked.len(), 2);
    assert!(picked.iter().all(|e| !raced_for_it(e)));
}
