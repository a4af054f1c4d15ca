//! The explain view computed from inputs made by hand: no store.

use super::*;
use crate::inspect::fixtures::{at, config};

/// The tick at 600 s, on the schedule (every minute).
const TICK: Tick = Tick(600_000);

fn member(id: &str, alive: bool) -> Member {
    let json = format!(
        r#"{{"id":"{id}","started_at":"1970-01-01T00:00:00Z","seen_at":"1970-01-01T00:09:00Z","alive":{alive}}}"#
    );
    serde_json::from_str(&json).expect("a member")
}

fn entry(worker: &str, kind: Kind, reason: Option<&str>, by: Option<&str>) -> Entry {
    let mut entry = Entry::new("every-minute", TICK, worker, kind, at(601));
    entry.reason = reason.map(str::to_string);
    entry.by = by.map(str::to_string);
    entry
}

/// A run by `worker` with `token`, started 10 ms after the tick (on its clock), ended with `outcome`.
fn run(worker: &str, token: u64, outcome: Option<&str>) -> Entry {
    let mut run = entry(worker, Kind::Run, None, None);
    run.token = Some(token);
    run.run_id = Some(format!("run-{token}"));
    run.started_at = Some(TICK.to_utc() + chrono::Duration::milliseconds(10));
    if let Some(outcome) = outcome {
        run.ended_at = Some(TICK.to_utc() + chrono::Duration::milliseconds(1260));
        run.outcome = Some(outcome.to_string());
        run.exit_code = Some(0);
        run.duration_ms = Some(1250);
    }
    run
}

/// The explanation of `TICK` at `now` (seconds) from `entries`, with `members` known.
fn explain_at(now: i64, entries: Vec<Entry>, members: Vec<Member>, earlier: bool) -> Explanation {
    let config = config();
    let inputs = ExplainInputs {
        entries,
        earlier,
        control_before: None,
        paused_now: None,
        members,
        notes: Notes::default(),
    };
    explain(&config.jobs[0], &config.history, TICK, inputs, at(now))
}

/// Fails unless a line of the story contains `sentence`.
fn assert_told(explanation: &Explanation, sentence: &str) {
    assert!(
        explanation.story.iter().any(|line| line.contains(sentence)),
        "{sentence:?} not in {:#?}",
        explanation.story
    );
}

/// A tick won by one worker and lost by the others: `ran`, who raced, the winner's token and outcome, and
/// each loser's reason, in that order.
#[test]
fn a_tick_with_a_winner_and_losers_is_told_run_then_losses() {
    let entries = vec![
        entry("w1", Kind::Lost, Some("already_claimed"), Some("w2")),
        run("w2", 4, Some("success")),
        entry("w3", Kind::Skipped, Some("no_quorum"), None),
        entry("w4", Kind::Lost, Some("later_tick_claimed"), Some("w1")),
    ];
    let members = vec![member("w1", true), member("w2", true)];
    let explanation = explain_at(700, entries, members, true);
    assert_eq!(explanation.verdict, Verdict::Ran);
    assert!(explanation.on_schedule);
    assert_eq!(explanation.raced, ["w1", "w2", "w3", "w4"]);
    assert_eq!(explanation.runs.len(), 1);
    assert_eq!(explanation.hint, None);
    assert_eq!(
        explanation.story,
        [
            "every-minute at 1970-01-01T00:10:00Z",
            "raced by 4 workers: w1, w2, w3, w4",
            "w2 won it with token 4 (run run-4), started 1970-01-01T00:10:00.010Z, ended \
             1970-01-01T00:10:01.260Z: success, exit code 0, after 1.250s",
            "w1 lost it to w2: already_claimed: another worker had claimed it",
            "w3 skipped it: no_quorum: no majority of the nodes answered within its window",
            "w4 lost it (a later tick went to w1): later_tick_claimed: a later tick had been claimed \
             first, so this one could no longer be",
        ]
    );
    assert_eq!(
        (explanation.previous_tick, explanation.next_tick),
        (Some(at(540)), Some(at(660)))
    );
}

/// The JSON: the tick in both forms at the top, each entry as stored with `tick_rfc3339`, the notes flat.
#[test]
fn the_json_carries_each_tick_in_rfc_3339_and_milliseconds() {
    let explanation = explain_at(700, vec![run("w2", 4, Some("success"))], vec![], true);
    let json = serde_json::to_value(&explanation).expect("json");
    assert_eq!(json["tick"], "1970-01-01T00:10:00Z");
    assert_eq!(json["tick_ms"], 600_000);
    assert_eq!(json["verdict"], "ran");
    for list in ["runs", "entries"] {
        assert_eq!(json[list][0]["tick"], 600_000, "{json}");
        assert_eq!(
            json[list][0]["tick_rfc3339"], "1970-01-01T00:10:00Z",
            "{json}"
        );
    }
    assert_eq!(json["missing_nodes"], serde_json::json!([]));
    assert!(json["hint"].is_null());
}

/// A tick nobody ran, that a worker reported missed: `not_run`, the skip and the alarm told.
#[test]
fn a_missed_tick_is_not_run_and_the_alarm_is_told() {
    let entries = vec![
        entry("w1", Kind::Skipped, Some("no_quorum"), None),
        entry("w2", Kind::Missed, Some("unclaimed"), None),
    ];
    let explanation = explain_at(700, entries, vec![], true);
    assert_eq!(explanation.verdict, Verdict::NotRun);
    assert_eq!(explanation.raced, ["w1"]);
    assert_told(
        &explanation,
        "w2 raised the alarm: missed, nobody ran it within its window (unclaimed: nobody claimed it \
         within its window)"
    );
    assert_eq!(
        explanation.story.last().map(String::as_str),
        Some("nobody ran it")
    );
}

/// A paused job's tick: every worker skipped it for the pause, nobody raced it: `not_run`.
#[test]
fn a_paused_jobs_tick_is_not_run_for_the_pause() {
    let entries = vec![
        entry("w1", Kind::Skipped, Some("paused"), None),
        entry("w2", Kind::Skipped, Some("paused"), None),
    ];
    let explanation = explain_at(700, entries, vec![], true);
    assert_eq!(explanation.verdict, Verdict::NotRun);
    assert!(explanation.raced.is_empty());
    assert_told(
        &explanation,
        "w1 skipped it: paused: the job was paused (redcron pause)",
    );
}

/// A run without an end is `running` while its worker is alive, `unfinished` once it is not (the story says
/// when it was last seen), and a worker the store does not know is said to be unknown.
#[test]
fn a_run_without_an_end_is_running_or_unfinished_by_its_workers_life() {
    let started = || vec![run("w2", 4, None)];
    let running = explain_at(700, started(), vec![member("w2", true)], true);
    assert_eq!(running.verdict, Verdict::Running);
    assert_told(&running, "w2 won it with token 4");
    assert_told(&running, "no end recorded yet");
    let stale = explain_at(700, started(), vec![member("w2", false)], true);
    assert_eq!(stale.verdict, Verdict::Unfinished);
    assert_told(
        &stale,
        "w2 is no longer alive (last seen 1970-01-01T00:09:00Z): the run's end will not be recorded"
    );
    let unknown = explain_at(700, started(), vec![], true);
    assert_told(&unknown, "w2 is unknown to the store");
}

/// A winner whose clock was off records its own times (here started before the tick): the story tells
/// them as recorded, and the verdict does not depend on them.
#[test]
fn a_winner_whose_clock_is_off_is_told_with_its_own_times() {
    let mut behind = run("w2", 4, Some("success"));
    behind.started_at = Some(at(510));
    behind.ended_at = Some(at(511));
    let explanation = explain_at(700, vec![behind], vec![], true);
    assert_eq!(explanation.verdict, Verdict::Ran);
    assert_told(
        &explanation,
        "started 1970-01-01T00:08:30Z, ended 1970-01-01T00:08:31Z: success",
    );
}

/// Before its window ends a tick is `not_yet`, whether ahead or open; after, with no entry, `no_entry`
/// with a hint that depends on whether the history reaches back before it.
#[test]
fn a_tick_without_entries_is_not_yet_then_no_entry_with_a_hint() {
    let ahead = explain_at(590, vec![], vec![], true);
    assert_eq!(ahead.verdict, Verdict::NotYet);
    assert_told(&ahead, "not yet: the tick lies ahead");
    let open = explain_at(610, vec![], vec![], true);
    assert_eq!(open.verdict, Verdict::NotYet);
    assert_told(&open, "its window is open until 1970-01-01T00:10:30Z");
    let landing = explain_at(632, vec![], vec![], true);
    assert_told(&landing, "the workers' entries may still be landing");
    let gone = explain_at(700, vec![], vec![], true);
    assert_eq!(gone.verdict, Verdict::NoEntry);
    assert_told(&gone, "no entry: nobody accounted for this tick");
    assert!(gone
        .hint
        .as_deref()
        .is_some_and(|h| h.starts_with("no worker recorded it")));
    let before_history = explain_at(700, vec![], vec![], false);
    assert!(
        before_history.hint.as_deref().is_some_and(
            |h| h.starts_with("the store holds nothing of every-minute before this tick")
        )
    );
}

/// An instant off the schedule is said to be so with the nearest ticks; unless a trigger request's run
/// has it as its tick.
#[test]
fn an_instant_off_the_schedule_is_said_so_unless_a_trigger_ran_at_it() {
    let config = config();
    let off = Tick(615_500);
    let inputs = ExplainInputs::default();
    let explanation = explain(&config.jobs[0], &config.history, off, inputs, at(700));
    assert!(!explanation.on_schedule);
    assert_eq!(explanation.verdict, Verdict::NoEntry);
    assert_told(
        &explanation,
        "1970-01-01T00:10:15.500Z is not a tick of every-minute (\"* * * * *\" in UTC); the nearest are \
         1970-01-01T00:10:00Z before and 1970-01-01T00:11:00Z after"
    );
    assert_told(
        &explanation,
        "no worker races an instant that is not a tick",
    );
    assert_eq!(explanation.hint, None);

    let mut triggered = Entry::new("every-minute", off, "w1", Kind::Run, at(616));
    triggered.trigger = Some("abc".to_string());
    triggered.ended_at = Some(at(617));
    triggered.outcome = Some("success".to_string());
    let inputs = ExplainInputs {
        entries: vec![triggered],
        ..ExplainInputs::default()
    };
    let explanation = explain(&config.jobs[0], &config.history, off, inputs, at(700));
    assert_eq!(explanation.triggers, ["abc"]);
    assert_eq!(explanation.verdict, Verdict::Ran);
    assert_told(
        &explanation,
        "an extra run asked for by `redcron trigger` (request abc), not a tick of the schedule",
    );
}

/// Two runs of one claim are said to break the promise.
#[test]
fn two_runs_of_one_tick_are_said_to_break_the_promise() {
    let entries = vec![run("w1", 4, Some("success")), run("w2", 5, Some("success"))];
    let explanation = explain_at(700, entries, vec![], true);
    assert_told(
        &explanation,
        "2 runs recorded for 1 claim of this tick: each (job, tick) should run once",
    );
}

/// A current winner names the racers and its losers write nothing: the story says who raced (the winner's
/// view), its place and token, and that the others found the tick confirmed; the JSON's `raced` is the
/// same as for the entries of earlier versions, and its record stands alone.
#[test]
fn a_run_naming_the_racers_tells_the_silent_losers() {
    let mut won = run("w2", 4, Some("failure"));
    won.raced = Some(vec!["w2".into(), "w1".into(), "w3".into()]);
    won.tail_err = Some("line 1\nboom\n".into());
    let explanation = explain_at(700, vec![won], vec![], true);
    assert_eq!(
        explanation.verdict,
        Verdict::Failed,
        "a run that failed is no success"
    );
    assert_eq!(explanation.raced, ["w2", "w1", "w3"]);
    assert_eq!(
        explanation.story[1],
        "raced by w2, w1, w3 (the winner's view); w2 won at place 0 with token 4; w1, w3 found the \
         tick confirmed: already_claimed, routine, not recorded"
    );
    assert_told(&explanation, "w2 won it with token 4 (run run-4)");
    assert_eq!(explanation.records.len(), 1);
    let json = serde_json::to_value(&explanation).expect("json");
    assert_eq!(json["runs"][0]["tail_err"], "line 1\nboom\n");
    assert_eq!(json["records"][0]["raced"][2], "w3");
    assert_eq!(json["records"][0]["notes"], serde_json::json!([]));
}

/// A rolling upgrade: a current winner names the racers, a worker of an earlier version still wrote its
/// loss, and another lost for a reason that is not routine: each named once, the written losses told,
/// only the worker with no entry said to be silent.
#[test]
fn a_view_and_written_losses_are_told_together() {
    let mut won = run("w2", 4, Some("success"));
    won.raced = Some(vec!["w1".into(), "w2".into(), "w3".into()]);
    let entries = vec![
        entry("w1", Kind::Lost, Some("already_claimed"), Some("w2")),
        won,
        entry("w4", Kind::Skipped, Some("no_quorum"), None),
    ];
    let explanation = explain_at(700, entries, vec![], true);
    assert_eq!(explanation.raced, ["w1", "w2", "w3", "w4"]);
    assert_told(
        &explanation,
        "raced by w1, w2, w3 (the winner's view); w2 won at place 1 with token 4; w3 found the tick \
         confirmed",
    );
    assert_told(&explanation, "w1 lost it to w2: already_claimed");
    assert_told(&explanation, "w4 skipped it: no_quorum");
}

/// Of two runs of one tick the ended one decides the verdict, whichever worker's name sorts first; the
/// double run is said loudly.
#[test]
fn a_double_run_is_loud_and_the_ended_run_decides() {
    let entries = vec![run("w1", 4, None), run("w2", 5, Some("success"))];
    let explanation = explain_at(700, entries, vec![member("w1", true)], true);
    assert_eq!(explanation.verdict, Verdict::Ran);
    assert_eq!(explanation.runs[0].worker, "w2");
    assert_told(&explanation, "DOUBLE RUN: 2 runs recorded for 1 claim");
}

/// Retry attempts: the latest attempt's run decides the verdict (here still running), and its runs come
/// first in the story.
#[test]
fn the_latest_attempt_decides_the_verdict() {
    let first = run("w1", 4, Some("failure"));
    let retried = run("w2", 5, None).in_series(&crate::lock::Series::Retry(1));
    let explanation = explain_at(700, vec![first, retried], vec![member("w2", true)], true);
    assert_eq!(explanation.verdict, Verdict::Running);
    assert_eq!(explanation.runs[0].attempt, Some(1));
    assert_eq!(explanation.records.len(), 2);
    assert!(
        !explanation.story.iter().any(|l| l.contains("DOUBLE RUN")),
        "{:#?}",
        explanation.story
    );
}

/// A tick skipped while paused names the pause before it (who, why, until when); a pause or resume is no
/// entry of the tick: one made in the tick's very millisecond leaves a tick nobody accounted for
/// `no_entry`.
#[test]
fn a_pause_before_the_tick_is_told_with_whether_one_stands_now_and_a_control_is_no_entry_of_it() {
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
    let mut skipped = Entry::new("every-minute", TICK, "w1", Kind::Skipped, at(601));
    skipped.reason = Some("paused".into());
    skipped.by = Some("ops@host".into());
    let inputs = ExplainInputs {
        entries: vec![skipped],
        earlier: true,
        control_before: Some(control(CONTROL_PAUSED, 590)),
        ..ExplainInputs::default()
    };
    let explanation = explain(
        &config.jobs[0],
        &config.history,
        TICK,
        inputs.clone(),
        at(700),
    );
    assert_eq!(explanation.verdict, Verdict::NotRun);
    assert_told(
        &explanation,
        "the latest pause or resume before it: ops@host paused the job: migration, at",
    );
    // Whether it still stands is read now: a resume after the tick is not among the entries read.
    assert_told(
        &explanation,
        "the job is not paused now: the pause was lifted",
    );
    let standing = ExplainInputs {
        paused_now: Some(crate::lock::PauseRead {
            pause: crate::lock::Pause {
                until: None,
                by: "ops@host".into(),
                reason: "migration".into(),
            },
            nodes: 3,
        }),
        ..inputs
    };
    let explanation = explain(&config.jobs[0], &config.history, TICK, standing, at(700));
    assert_told(
        &explanation,
        "the job is paused now: by ops@host: migration (on 3 nodes)",
    );
    assert!(explanation.paused_now.is_some());
    let resumed = ExplainInputs {
        entries: Vec::new(),
        earlier: true,
        control_before: Some(control("resumed", 590)),
        ..ExplainInputs::default()
    };
    let explanation = explain(&config.jobs[0], &config.history, TICK, resumed, at(700));
    assert!(
        !explanation
            .story
            .iter()
            .any(|l| l.contains("latest pause") || l.contains("paused now")),
        "a resume before the tick is not told: {:#?}",
        explanation.story
    );
    let same_ms = ExplainInputs {
        entries: vec![control(CONTROL_PAUSED, TICK.0 / 1000)],
        earlier: true,
        ..ExplainInputs::default()
    };
    let explanation = explain(&config.jobs[0], &config.history, TICK, same_ms, at(700));
    assert_eq!(explanation.verdict, Verdict::NoEntry);
}

/// Issue 54: a worker in the winner's view that was gone before the tick (dead, last seen before it) did
/// not race: the story says so instead of having it find the tick confirmed; a live one is a routine loser.
#[test]
fn a_racer_gone_before_the_tick_did_not_find_it_confirmed() {
    let mut won = run("w2", 4, Some("success"));
    won.raced = Some(vec!["w2".into(), "w1".into(), "w3".into()]);
    let members = vec![member("w1", true), member("w3", false)];
    let explanation = explain_at(700, vec![won], members, true);
    let race = &explanation.story[1];
    assert!(
        race.contains("; w1 found the tick confirmed: already_claimed, routine, not recorded"),
        "{race}"
    );
    assert!(
        race.contains("; w3 did not race: it was gone (last seen "),
        "{race}"
    );
    assert!(!race.contains("w3 found"), "{race}");
}
