//! The tables made from reports built by hand: no store.

use super::*;
use crate::history::tick;
use crate::inspect::history::History;
use crate::schedule::Tick;

fn entry(tick: i64, worker: &str, kind: Kind, reason: Option<&str>) -> Entry {
    let mut entry = Entry::new("j", Tick(tick), worker, kind, DateTime::UNIX_EPOCH);
    entry.reason = reason.map(str::to_string);
    entry
}

fn run(tick: i64, worker: &str, token: u64) -> Entry {
    let mut run = entry(tick, worker, Kind::Run, None);
    run.token = Some(token);
    run.ended_at = Some(DateTime::UNIX_EPOCH);
    run.outcome = Some("failure".to_string());
    run.exit_code = Some(3);
    run.duration_ms = Some(1250);
    run
}

fn history_of(entries: Vec<Entry>) -> History {
    History {
        entries: Vec::new(),
        controls: tick::controls(&entries),
        ticks: tick::group(entries),
        cut_short: None,
        notes: Notes::default(),
    }
}

/// One line per tick: a run with its token, outcome, exit and duration, legacy losers counted as a
/// note; a tick nobody ran with why; a double run loud.
#[test]
fn history_is_one_line_per_tick_with_its_notes_counted() {
    let mut raced = run(3000, "w2", 5);
    raced.raced = Some(vec!["w2".into(), "w1".into()]);
    let text = ticks(&history_of(vec![
        raced,
        run(2000, "w2", 4),
        entry(2000, "w1", Kind::Lost, Some("already_claimed")),
        entry(2000, "w3", Kind::Lost, Some("already_claimed")),
        entry(1000, "w1", Kind::Skipped, Some("paused")),
        entry(1000, "w2", Kind::Skipped, Some("paused")),
        run(500, "w1", 1),
        run(500, "w2", 2),
    ]));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(lines[0].starts_with("TICK "), "{text}");
    let words = |line: &str| line.split_whitespace().collect::<Vec<_>>().join(" ");
    assert_eq!(
        words(lines[1]),
        "1970-01-01T00:00:03Z j w2 5 failure 3 1.250s - -"
    );
    assert_eq!(
        words(lines[2]),
        "1970-01-01T00:00:02Z j w2 4 failure 3 1.250s - 2 lost: already_claimed"
    );
    assert_eq!(
        words(lines[3]),
        "1970-01-01T00:00:01Z j w1 - skipped - - paused 1 skipped: paused"
    );
    assert!(
        lines[4].contains("DOUBLE RUN: also run by w2 (token 2, failure)"),
        "{text}"
    );
    assert_eq!(ticks(&history_of(Vec::new())), "no entries\n");
}

/// A pause and a resume are lines of their own among the ticks, at the time they were made: the action
/// as the outcome, the reason, who and until when as the detail.
#[test]
fn controls_are_lines_of_their_own_among_the_ticks() {
    let control = |action: &'static str, ms: i64, until: Option<i64>| {
        let what = crate::history::Control {
            action,
            by: "ops@host".into(),
            reason: "migration".into(),
            until: until.and_then(DateTime::from_timestamp_millis),
        };
        let made = DateTime::from_timestamp_millis(ms).unwrap_or_default();
        Entry::control("j", &what, "cli", made)
    };
    let text = ticks(&history_of(vec![
        control("resumed", 4000, None),
        run(3000, "w2", 5),
        control("paused", 2500, Some(60_000)),
        entry(2000, "w1", Kind::Skipped, Some("paused")),
    ]));
    let words = |line: &str| line.split_whitespace().collect::<Vec<_>>().join(" ");
    let lines: Vec<String> = text.lines().map(words).collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert_eq!(
        lines[1],
        "1970-01-01T00:00:04Z j cli - resumed - - migration by ops@host -"
    );
    assert!(lines[2].contains(" w2 5 failure "), "{text}");
    assert_eq!(
        lines[3],
        "1970-01-01T00:00:02.500Z j cli - paused - - migration by ops@host until 1970-01-01T00:01:00Z -"
    );
    assert!(lines[4].contains(" skipped "), "{text}");
}

/// A failed run's kept output: its last lines, indented, under a heading naming the run and stream.
#[test]
fn a_runs_output_tail_is_its_last_lines_indented() {
    let text: String = (1..=25).map(|n| format!("line {n}\n")).collect();
    let shown = output_tail(&run(1000, "w2", 4), "stderr", &text);
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines[0], "w2's run (token 4), stderr, last 20 lines:");
    assert_eq!(lines[1], "    line 6");
    assert_eq!(lines.last().copied(), Some("    line 25"));
    assert_eq!(lines.len(), 21);
}

/// `status` as printed for `workers` and no job.
fn status_of(workers: Vec<crate::inspect::status::WorkerStatus>) -> String {
    use crate::inspect::status::{ConfigSummary, Status};
    super::status(&Status {
        now: chrono::DateTime::from_timestamp(1_795_000_100, 0).unwrap_or_default(),
        config: ConfigSummary {
            path: "jobs.yaml".to_string(),
            fingerprint: "f".to_string(),
        },
        config_majority: None,
        workers,
        jobs: vec![],
        notes: Default::default(),
    })
}

/// A worker that is gone runs nothing: `status` shows no run for it, whatever its last announcement
/// listed; a live worker's runs are listed.
#[test]
fn a_gone_worker_is_shown_running_nothing() {
    use crate::inspect::status::WorkerStatus;
    let member = |id: &str, alive: bool| WorkerStatus {
        member: serde_json::from_value(serde_json::json!({
            "id": id, "started_at": "2026-11-27T00:00:00Z", "alive": alive,
            "state": "running",
            "running": [{"job": "slow", "tick": 1_795_000_000_000_i64, "token": 9}],
        }))
        .expect("a member"),
        config_differs: false,
        runs_this_config: true,
    };
    let text = status_of(vec![member("w-live", true), member("w-dead", false)]);
    let line = |id: &str| {
        text.lines()
            .find(|line| line.starts_with(id))
            .unwrap_or_else(|| panic!("no line for {id}:\n{text}"))
            .to_string()
    };
    assert!(line("w-live").contains("slow@"), "{text}");
    assert!(line("w-dead").contains(" dead "), "{text}");
    assert!(!line("w-dead").contains("slow@"), "{text}");
}

/// Two live processes under one id: `status` lists the other process on a row of its own, and warns.
#[test]
fn every_process_that_shares_an_id_is_listed() {
    use crate::inspect::status::WorkerStatus;
    let member = serde_json::from_value(serde_json::json!({
        "id": "web-1", "host": "host-a", "pid": 11, "started_at": "2026-11-27T00:00:00Z",
        "alive": true, "state": "running",
        "shared_with": [{"host": "host-b", "pid": 22, "seen_at": "2026-11-27T00:00:00Z"}],
    }))
    .expect("a member");
    let text = status_of(vec![WorkerStatus {
        member,
        config_differs: false,
        runs_this_config: true,
    }]);
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("web-1")).collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(
        rows[0].contains("host-a") && rows[0].contains(" 11 "),
        "{text}"
    );
    assert!(
        rows[1].contains("SHARES ID") && rows[1].contains("host-b"),
        "{text}"
    );
    assert!(
        text.contains("several live processes announce themselves as worker web-1"),
        "{text}"
    );
}

/// A tick that ran reads as a run: a racer's skip for not winning in time beside it is no note, while
/// a loss that was not routine still is.
#[test]
fn a_tick_that_ran_carries_no_skip_note() {
    let records = crate::history::tick::group(vec![
        entry(1000, "w1", Kind::Skipped, Some("no_quorum")),
        run(1000, "w2", 4),
        entry(1000, "w3", Kind::Lost, Some("later_tick_claimed")),
    ]);
    let shown = super::notes(&records[0]);
    assert_eq!(shown, "1 lost: later_tick_claimed", "{records:?}");
}
