//! The status view computed from inputs made by hand: no store.

use super::*;
use crate::inspect::fixtures::{at, config};
use crate::lock::Pause;
use crate::membership::Running;
use crate::schedule::Tick;

fn member(id: &str, fingerprint: &str, alive: bool) -> Member {
    let json = format!(
        r#"{{"id":"{id}","config_fingerprint":"{fingerprint}","started_at":"2026-11-23T10:00:00Z","alive":{alive}}}"#
    );
    serde_json::from_str(&json).expect("a member")
}

fn run(tick_secs: i64, outcome: &str) -> Entry {
    let mut entry = Entry::new(
        "every-minute",
        Tick(tick_secs * 1000),
        "w1",
        Kind::Run,
        at(tick_secs),
    );
    entry.ended_at = Some(at(tick_secs + 1));
    entry.outcome = Some(outcome.to_string());
    entry
}

/// Inputs of `members` and one history of the one job; no pause, no trigger request.
fn inputs(members: Vec<Member>, entries: Vec<Entry>) -> StatusInputs {
    StatusInputs {
        members,
        histories: vec![entries],
        ..StatusInputs::default()
    }
}

/// Workers on another config than most live ones are marked, dead ones included.
#[test]
fn a_worker_is_marked_when_its_config_differs_from_most_live_workers() {
    let config = config();
    let ours = config.fingerprint();
    let members = vec![
        member("a", "other", true),
        member("b", "other", true),
        member("c", &ours, true),
        member("d", "older", false),
    ];
    let status = status(&config, inputs(members, vec![]), at(600));
    assert_eq!(status.config_majority.as_deref(), Some("other"));
    let marks: Vec<(bool, bool)> = status
        .workers
        .iter()
        .map(|w| (w.config_differs, w.runs_this_config))
        .collect();
    assert_eq!(
        marks,
        [(false, false), (false, false), (true, true), (true, false)]
    );
}

/// With no fingerprint on a majority of the live workers, this command's config is the reference.
#[test]
fn without_a_majority_this_config_is_the_reference() {
    let config = config();
    let ours = config.fingerprint();
    let members = vec![member("a", "other", true), member("b", &ours, true)];
    let status = status(&config, inputs(members, vec![]), at(600));
    assert_eq!(status.config_majority, None);
    assert!(status.workers[0].config_differs && !status.workers[1].config_differs);
}

/// Failures in a row since the last success; an overdue tick; a new job is never overdue.
#[test]
fn failures_in_a_row_last_success_and_overdue() {
    let config = config();
    // Newest first, as the store answers: two failures since the last success.
    let entries = vec![
        run(540, "timeout"),
        run(480, "failure"),
        run(420, "success"),
    ];
    let job = &status(&config, inputs(vec![], entries), at(600)).jobs[0];
    assert_eq!(job.failures_in_a_row, 2);
    assert_eq!(job.last_success.as_ref().map(|e| e.tick), Some(420_000));
    assert_eq!(job.last_run.as_ref().map(|e| e.tick), Some(540_000));
    // The newest tick whose window (30 s + 5 s) ended by 600 s is 540 s: accounted for.
    assert!(job.overdue.is_none());
    let later = &status(&config, inputs(vec![], vec![run(540, "success")]), at(660)).jobs[0];
    let overdue = later.overdue.as_ref().expect("600 s has no entry");
    assert_eq!(overdue.tick, at(600));
    assert_eq!(overdue.window_ended_at, at(630));
    // A job with no entry before that tick is new: nobody was expected to account for it.
    let new = &status(&config, inputs(vec![], vec![]), at(660)).jobs[0];
    assert!(new.overdue.is_none());
}

/// A trigger request is pending until a run of it is recorded or its window ends.
#[test]
fn a_trigger_is_pending_until_its_run_is_recorded_or_its_window_ends() {
    let requested = TriggerRequest::new("every-minute", at(600), Duration::from_secs(30), "ops@vm");
    let other_job = TriggerRequest::new("other", at(600), Duration::from_secs(30), "ops@vm");
    let triggers = [requested.clone(), other_job];
    let pending =
        |entries: &[Entry], now| pending_triggers("every-minute", &triggers, entries, now);
    assert_eq!(pending(&[], at(610)), std::slice::from_ref(&requested));
    // Its window has ended: nobody will claim it any more (`trigger` exited 4).
    assert!(pending(&[], at(630)).is_empty());
    // A worker ran it (and a node that missed the delete still holds the request).
    let mut ran = run(600, "success");
    ran.trigger = Some(requested.id.clone());
    assert!(pending(&[ran], at(610)).is_empty());
    // The same, through the whole view.
    let inputs = StatusInputs {
        triggers: triggers.to_vec(),
        ..inputs(vec![], vec![])
    };
    let job = &status(&config(), inputs, at(610)).jobs[0];
    assert_eq!(job.pending_triggers, [requested]);
}

/// A paused job says so, with its pause as read; a job without a pause is not paused.
#[test]
fn a_paused_job_carries_its_pause() {
    let pause = PauseRead {
        pause: Pause {
            until: Some(at(3600)),
            by: "ops@vm".to_string(),
            reason: "maintenance".to_string(),
        },
        nodes: 2,
    };
    let paused = StatusInputs {
        pauses: vec![Some(pause.clone())],
        ..inputs(vec![], vec![run(540, "success")])
    };
    let job = &status(&config(), paused, at(600)).jobs[0];
    assert_eq!(job.paused, Some(pause));
    let json = serde_json::to_value(job).expect("json");
    assert_eq!(json["paused"]["by"], "ops@vm");
    assert_eq!(json["paused"]["nodes"], 2);
    let job = &status(&config(), inputs(vec![], vec![]), at(600)).jobs[0];
    assert_eq!(job.paused, None);
}

/// A dead (stale) member's runs under way are not counted, and its run that never ended is
/// `unfinished`; a live member's run is under way, not unfinished.
#[test]
fn stale_members_run_nothing_and_leave_their_run_unfinished() {
    let config = config();
    let running = |tick: i64, token| Running {
        job: "every-minute".to_string(),
        tick,
        token,
    };
    let mut live = member("live", "", true);
    live.running = vec![running(600_000, 7)];
    let mut stale = member("stale", "", false);
    stale.running = vec![running(540_000, 6)];
    let mut started = run(540, "success");
    started.worker = "stale".to_string();
    (started.ended_at, started.outcome) = (None, None);
    let job = &status(
        &config,
        inputs(vec![live.clone(), stale.clone()], vec![started.clone()]),
        at(610),
    )
    .jobs[0];
    assert_eq!(
        job.running,
        [RunningNow {
            worker: "live".to_string(),
            tick: 600_000,
            tick_rfc3339: Some(at(600)),
            token: 7,
        }]
    );
    assert!(job.unfinished);
    // The same run by a worker still alive is only under way.
    started.worker = "live".to_string();
    let job = &status(&config, inputs(vec![live, stale], vec![started]), at(610)).jobs[0];
    assert!(!job.unfinished);
}

/// A worker whose clock is off is reported as it announced itself (its offset included) and judged by
/// the store's `alive`, never by its own times: its runs under way count, its started_at ahead of `now`
/// changes nothing.
#[test]
fn a_worker_whose_clock_is_off_is_reported_as_announced() {
    let config = config();
    let mut ahead = member("ahead", &config.fingerprint(), true);
    ahead.clock_offset_ms = Some(-90_000);
    ahead.started_at = at(690);
    ahead.running = vec![Running {
        job: "every-minute".to_string(),
        tick: 660_000,
        token: 8,
    }];
    let status = status(&config, inputs(vec![ahead], vec![]), at(600));
    assert_eq!(status.config_majority, Some(config.fingerprint()));
    assert_eq!(status.jobs[0].running.len(), 1);
    let json = serde_json::to_value(&status).expect("json");
    let worker = &json["workers"][0];
    assert_eq!(worker["clock_offset_ms"], -90_000);
    assert_eq!(worker["running"][0]["tick"], 660_000);
    assert_eq!(worker["running"][0]["tick_rfc3339"], "1970-01-01T00:11:00Z");
    assert_eq!(worker["runs_this_config"], true);
    assert_eq!(
        json["jobs"][0]["running"][0]["tick_rfc3339"],
        "1970-01-01T00:11:00Z"
    );
}

/// The entries in the status JSON are as stored, with `tick_rfc3339` beside their tick.
#[test]
fn the_last_run_and_success_carry_their_tick_in_rfc_3339() {
    let status = status(
        &config(),
        inputs(vec![], vec![run(540, "failure"), run(480, "success")]),
        at(600),
    );
    let json = serde_json::to_value(&status).expect("json");
    let job = &json["jobs"][0];
    assert_eq!(job["last_run"]["tick"], 540_000);
    assert_eq!(job["last_run"]["tick_rfc3339"], "1970-01-01T00:09:00Z");
    assert_eq!(job["last_success"]["tick_rfc3339"], "1970-01-01T00:08:00Z");
    assert_eq!(job["last_success"]["outcome"], "success");
}

/// The same history written by current workers (the winner names the racers, losers write nothing) and
/// by earlier ones (a `lost` entry per loser) gives the same last run, failures in a row and last success;
/// a retried tick counts once, by its latest attempt; of a double run, the ended one.
#[test]
fn records_count_the_same_whether_losers_wrote_entries_or_nothing() {
    let config = config();
    let lost = |tick_secs: i64| {
        let mut entry = Entry::new(
            "every-minute",
            Tick(tick_secs * 1000),
            "w2",
            Kind::Lost,
            at(tick_secs),
        );
        entry.reason = Some("already_claimed".to_string());
        entry
    };
    let named = |tick_secs: i64, outcome: &str| {
        let mut entry = run(tick_secs, outcome);
        entry.raced = Some(vec!["w1".to_string(), "w2".to_string()]);
        entry
    };
    let legacy = vec![
        run(540, "failure"),
        lost(540),
        run(480, "failure"),
        lost(480),
        run(420, "success"),
        lost(420),
    ];
    let current = vec![
        named(540, "failure"),
        named(480, "failure"),
        named(420, "success"),
    ];
    let of = |entries| {
        let job = &status(&config, inputs(vec![], entries), at(600)).jobs[0];
        (
            job.last_run.as_ref().map(|e| e.tick),
            job.failures_in_a_row,
            job.last_success.as_ref().map(|e| e.tick),
            job.overdue.is_none(),
        )
    };
    assert_eq!(of(legacy), (Some(540_000), 2, Some(420_000), true));
    assert_eq!(of(current), (Some(540_000), 2, Some(420_000), true));

    // Tick 540 failed, and its retry (attempt 1, by w2) succeeded: no failure in a row.
    let mut retried = run(540, "success").in_series(&crate::lock::Series::Retry(1));
    retried.worker = "w2".to_string();
    let mut running = run(480, "success");
    running.worker = "w0".to_string();
    running.ended_at = None;
    running.outcome = None;
    let entries = vec![run(540, "failure"), retried, running.clone()];
    let job = &status(&config, inputs(vec![], entries), at(600)).jobs[0];
    assert_eq!(job.last_run.as_ref().map(|e| e.attempt), Some(Some(1)));
    assert_eq!(job.failures_in_a_row, 0);
    assert_eq!(job.last_success.as_ref().map(|e| e.tick), Some(540_000));
    // A double run of tick 480: the ended one (w1's failure) is the last run, not w0's, which has no end
    // (and whose name sorts first).
    let entries = vec![running, run(480, "failure")];
    let job = &status(&config, inputs(vec![], entries), at(600)).jobs[0];
    assert_eq!(job.last_run.as_ref().map(|e| e.worker.as_str()), Some("w1"));
    assert_eq!(job.failures_in_a_row, 1);
    assert!(!job.unfinished);
}

/// A pause and a resume (`control` entries) change nothing of a job's status: not its last run, not its
/// failures, and a new job with only controls before its tick is still new (not overdue); one made in
/// the very millisecond of a tick does not account for that tick either.
#[test]
fn controls_leave_the_status_as_it_was() {
    let config = config();
    let control = |action: &'static str, secs: i64| {
        let what = crate::history::Control {
            action,
            by: "ops@host".into(),
            reason: "migration".into(),
            until: None,
        };
        Entry::control("every-minute", &what, "cli", at(secs))
    };
    let plain = vec![run(540, "failure"), run(480, "success")];
    let mut with_controls = vec![control("resumed", 650), control("paused", 600)];
    with_controls.extend(plain.clone());
    let before = &status(&config, inputs(vec![], plain), at(660)).jobs[0];
    let after = &status(&config, inputs(vec![], with_controls), at(660)).jobs[0];
    assert_eq!(after.last_run, before.last_run);
    assert_eq!(after.last_success, before.last_success);
    assert_eq!(after.failures_in_a_row, 1);
    assert_eq!(
        after.overdue.as_ref().map(|o| o.tick),
        Some(at(600)),
        "a control at the tick's millisecond does not account for it"
    );
    let only_controls = vec![control("resumed", 500), control("paused", 400)];
    let new = &status(&config, inputs(vec![], only_controls), at(660)).jobs[0];
    assert!(new.overdue.is_none() && new.last_run.is_none());
}
