//! The commands on a history and membership seeded through the store: tables, JSON, usage errors.

use std::collections::BTreeSet;

use chrono::Utc;

use super::{hourly_tick, hourly_tick_at, line, show, Fixture, OTHER_CONFIG};
use redcron::history::{Control, Entry, Kind, CONTROL_PAUSED, CONTROL_RESUMED};
use redcron::inspect::status;
use redcron::schedule::Tick;

/// `status`: alive, stopped and other-config workers marked; each job's last run (unfinished when its
/// worker died), failures in a row, last success; a job whose newest ended tick has no entry is overdue, a
/// disabled one is not.
#[test]
fn status_shows_workers_and_jobs() {
    let fixture = Fixture::new();
    let ticks = fixture.seed();
    let ours = fixture.fingerprint();
    let (code, stdout, stderr) = fixture.run(&["status"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert!(stdout.contains(&format!("fingerprint {ours}")), "{stdout}");
    let w1 = line(&stdout, "w1");
    assert!(
        w1.contains("alive") && w1.contains(&format!("{ours} (this config)")),
        "{w1}"
    );
    assert!(line(&stdout, "w2").contains(&format!("hourly@{}#9", show(hourly_tick()))));
    assert!(line(&stdout, "w3").contains(&format!("{OTHER_CONFIG} DIFFERS")));
    assert!(line(&stdout, "w4").contains("stopped"));
    let archive = line(&stdout, "archive");
    for part in [
        show(ticks[0]).as_str(),
        " w2 ",
        " 4 ",
        "failure",
        "1.250s",
        " 3 ",
        show(ticks[3]).as_str(),
    ] {
        assert!(archive.contains(part), "{part:?} not in {archive}");
    }
    assert!(line(&stdout, "hourly").contains(" w4 "), "{stdout}");
    assert!(line(&stdout, "hourly").contains(" unfinished "), "{stdout}");
    assert!(
        line(&stdout, "hourly").contains("OVERDUE: no entry for"),
        "{stdout}"
    );
    let idle = line(&stdout, "idle");
    assert!(
        idle.contains("disabled") && !idle.contains("OVERDUE"),
        "{idle}"
    );

    let json = fixture.json(&["status"]);
    assert_eq!(json["config"]["fingerprint"], ours.as_str());
    assert_eq!(json["config_majority"], ours.as_str());
    assert_eq!(json["missing_nodes"], serde_json::json!([]));
    let workers = json["workers"].as_array().expect("workers");
    let flags: Vec<(&str, bool, bool, bool)> = workers
        .iter()
        .map(|w| {
            let flag = |name: &str| w[name].as_bool().expect("a bool");
            (
                w["id"].as_str().expect("id"),
                flag("alive"),
                flag("config_differs"),
                flag("runs_this_config"),
            )
        })
        .collect();
    assert_eq!(
        flags,
        [
            ("w1", true, false, true),
            ("w2", true, false, true),
            ("w3", true, true, false),
            ("w4", false, false, true)
        ]
    );
    assert_eq!(workers[0]["host"], "host-w1");
    assert_eq!(workers[0]["clock_offset_ms"], -3);
    let jobs = json["jobs"].as_array().expect("jobs");
    let archive = &jobs[0];
    assert_eq!(archive["last_run"]["token"], 4);
    assert_eq!(archive["last_run"]["tick"], ticks[0].as_millis());
    assert_eq!(archive["failures_in_a_row"], 3);
    assert_eq!(archive["last_success"]["tick"], ticks[3].as_millis());
    assert!(archive["overdue"].is_null());
    assert!(jobs[1]["overdue"]["tick"].is_string(), "{}", jobs[1]);
    assert_eq!(jobs[1]["unfinished"], true);
    assert_eq!(archive["unfinished"], false);
    assert_eq!(jobs[1]["running"][0]["worker"], "w2");
    assert!(jobs[2]["overdue"].is_null());
}

/// `history`: every job's ticks merged newest first, one line each with its notes counted, whether its
/// losers wrote entries or nothing; the JSON's `ticks` and every entry of them; `--job`, `--limit` (in
/// ticks; a tick with more entries than the first read asks for is read again, whole), `--since` (an
/// instant or a duration back); an unknown job or a limit out of range is a usage error.
#[test]
fn history_lists_ticks_newest_first() {
    let fixture = Fixture::new();
    let ticks = fixture.seed();
    let (code, stdout, stderr) = fixture.run(&["history", "--limit", "5"]);
    assert_eq!(code, 0, "{stderr}");
    let rows: Vec<&str> = stdout.lines().skip(1).collect();
    assert_eq!(rows.len(), 5, "{stdout}");
    let words = |row: &str| row.split_whitespace().collect::<Vec<_>>().join(" ");
    assert_eq!(
        words(rows[0]),
        format!(
            "{} hourly w2 - missed - - unclaimed 1 skipped: no_quorum",
            show(hourly_tick())
        ),
        "{stdout}"
    );
    assert_eq!(
        words(rows[1]),
        format!(
            "{} archive w2 4 failure 3 1.250s run-4 2 lost: already_claimed",
            show(ticks[0])
        ),
        "{stdout}"
    );
    assert!(words(rows[2]).contains("hourly w4 8 running"), "{stdout}");
    assert!(
        words(rows[3]).ends_with("timeout signal 15 1.250s run-3 1 skipped: overlap"),
        "{stdout}"
    );
    // The tick whose winner named the racers: one line like the others, nothing to note.
    assert_eq!(
        words(rows[4]),
        format!("{} archive w2 2 failure 3 1.250s run-2 -", show(ticks[2])),
        "{stdout}"
    );

    let json = fixture.json(&["history", "--job", "archive"]);
    let entries = json["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 7);
    let order: Vec<i64> = entries
        .iter()
        .map(|e| e["tick"].as_i64().expect("tick"))
        .collect();
    assert!(order.windows(2).all(|w| w[0] >= w[1]), "{order:?}");
    assert_eq!(entries[6]["outcome"], "success");
    assert_eq!(entries[3]["signal"], 15);
    let listed = json["ticks"].as_array().expect("ticks");
    let told: Vec<(i64, &str, usize)> = listed
        .iter()
        .map(|t| {
            (
                t["tick"].as_i64().expect("tick"),
                t["worker"].as_str().expect("worker"),
                t["notes"].as_array().expect("notes").len(),
            )
        })
        .collect();
    let ms = |i: usize| ticks[i].as_millis();
    assert_eq!(
        told,
        [
            (ms(0), "w2", 2),
            (ms(1), "w1", 1),
            (ms(2), "w2", 0),
            (ms(3), "w1", 0)
        ]
    );
    assert_eq!(listed[0]["tick_rfc3339"], show(ticks[0]).as_str());
    assert_eq!(listed[2]["raced"], serde_json::json!(["w2", "w1"]));
    assert_eq!(listed[0]["other_runs"], serde_json::json!([]));
    let json = fixture.json(&["history", "--job", "archive", "--limit", "2"]);
    assert_eq!(json["ticks"].as_array().expect("ticks").len(), 2);
    assert_eq!(json["entries"].as_array().expect("entries").len(), 5);

    let since = show(ticks[1]);
    let json = fixture.json(&["history", "--job", "archive", "--since", &since]);
    assert_eq!(json["entries"].as_array().expect("entries").len(), 5);
    assert_eq!(json["ticks"].as_array().expect("ticks").len(), 2);
    let json = fixture.json(&["history", "--since", "1h"]);
    assert_eq!(json["entries"], serde_json::json!([]));
    // A tick with more entries than the first read asks for (4 per tick): read again, whole.
    let losers: Vec<Entry> = ["w5", "w6", "w7"]
        .iter()
        .map(|worker| {
            let mut lost = Entry::new("archive", ticks[0], worker, Kind::Lost, chrono::Utc::now());
            lost.reason = Some("already_claimed".to_string());
            lost
        })
        .collect();
    fixture.record(&losers);
    let json = fixture.json(&["history", "--job", "archive", "--limit", "1"]);
    assert_eq!(json["ticks"].as_array().expect("ticks").len(), 1, "{json}");
    assert_eq!(
        json["ticks"][0]["notes"].as_array().expect("notes").len(),
        5
    );
    assert_eq!(json["entries"].as_array().expect("entries").len(), 6);
    assert!(json["cut_short"].is_null());

    let (code, stdout, _) = fixture.run(&["history", "--job", "idle"]);
    assert_eq!((code, stdout.as_str()), (0, "no entries\n"));

    let (code, _, stderr) = fixture.run(&["history", "--job", "nope"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("no job named \"nope\"")
            && stderr.contains("known jobs: archive, hourly, idle"),
        "{stderr}"
    );
    for limit in ["0", "5001"] {
        let (code, _, stderr) = fixture.run(&["history", "--limit", limit]);
        assert_eq!(code, 2, "{stderr}");
    }
    let (code, _, stderr) = fixture.run(&["history", "--since", "yesterday"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("is neither an RFC 3339 timestamp"),
        "{stderr}"
    );
}

/// `explain`: a run's story (who raced, who won with which token, how it ended), a run whose worker died,
/// a tick nobody ran (the skips and the miss), a tick with no entry at all (a hint), a tick off the
/// schedule (the nearest ones), an unknown job and a malformed tick (usage errors).
#[test]
fn explain_tells_one_ticks_story() {
    let fixture = Fixture::new();
    let ticks = fixture.seed();
    let (code, stdout, stderr) = fixture.run(&["explain", "archive", &show(ticks[0])]);
    assert_eq!(code, 0, "{stderr}");
    for part in [
        "raced by 3 workers: w1, w2, w3",
        "w2 won it with token 4 (run run-4)",
        ": failure, exit code 3, after 1.250s",
        "w1 lost it to w2: already_claimed",
    ] {
        assert!(stdout.contains(part), "{part:?} not in:\n{stdout}");
    }
    // The same race written by current workers: the winner's view names the loser that wrote nothing,
    // and the end of the failed run's output is shown.
    let (code, stdout, _) = fixture.run(&["explain", "archive", &show(ticks[2])]);
    assert_eq!(code, 0);
    for part in [
        "raced by w2, w1 (the winner's view); w2 won at place 0 with token 2; w1 found the tick \
         confirmed: already_claimed, routine, not recorded",
        "w2 won it with token 2 (run run-2)",
        "w2's run (token 2), stderr, last 2 lines:\n    copying\n    disk full\n",
    ] {
        assert!(stdout.contains(part), "{part:?} not in:\n{stdout}");
    }
    let json = fixture.json(&["explain", "archive", &show(ticks[2])]);
    assert_eq!(json["raced"], serde_json::json!(["w2", "w1"]));
    assert_eq!(json["runs"][0]["tail_err"], "copying\ndisk full\n");
    let json = fixture.json(&["explain", "archive", &show(ticks[0])]);
    assert_eq!(json["raced"], serde_json::json!(["w1", "w2", "w3"]));
    assert_eq!(
        json["records"][0]["notes"].as_array().expect("notes").len(),
        2
    );

    let json = fixture.json(&["explain", "archive", &show(ticks[1])]);
    assert_eq!(
        json["verdict"], "failed",
        "a run that timed out is no success"
    );
    assert_eq!(json["on_schedule"], true);
    assert_eq!(json["runs"][0]["outcome"], "timeout");
    assert_eq!(json["entries"].as_array().expect("entries").len(), 2);

    let (code, stdout, _) = fixture.run(&["explain", "hourly", &show(hourly_tick())]);
    assert_eq!(code, 0);
    for part in [
        "w1 skipped it: no_quorum",
        "w2 raised the alarm: missed, nobody ran it within its window (unclaimed: nobody claimed it",
        "nobody ran it",
    ] {
        assert!(stdout.contains(part), "{part:?} not in:\n{stdout}");
    }
    let json = fixture.json(&["explain", "hourly", &show(hourly_tick_at(-1))]);
    assert_eq!(json["verdict"], "unfinished");
    assert!(
        json["story"]
            .to_string()
            .contains("w4 is no longer alive (last seen"),
        "{json}"
    );
    let json = fixture.json(&["explain", "hourly", &show(hourly_tick_at(6))]);
    assert_eq!(json["verdict"], "no_entry");
    assert!(json["story"]
        .to_string()
        .contains("no entry: nobody accounted for this tick"));
    assert!(json["hint"]
        .as_str()
        .expect("a hint")
        .contains("no worker recorded it"));

    let between = Tick(hourly_tick().as_millis() - 1_800_000);
    let (code, stdout, _) = fixture.run(&["explain", "hourly", &show(between)]);
    assert_eq!(code, 0);
    let expected = format!(
        "{} is not a tick of hourly (\"0 * * * *\" in UTC); the nearest are {} before and {} after",
        show(between),
        show(hourly_tick_at(4)),
        show(hourly_tick())
    );
    assert!(stdout.contains(&expected), "{expected:?} not in:\n{stdout}");

    let (code, _, stderr) = fixture.run(&["explain", "nightly", "2026-01-01T00:00:00Z"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("no job named \"nightly\"")
            && stderr.contains("known jobs: archive, hourly, idle"),
        "{stderr}"
    );
    let (code, _, stderr) = fixture.run(&["explain", "archive", "yesterday"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("expected an RFC 3339 timestamp"),
        "{stderr}"
    );
}

/// `explain` takes a tick in every form `history` and `status` print it: the JSON's epoch milliseconds
/// (`tick`) and the RFC 3339 beside them (`tick_rfc3339`, in entries and runs under way) tell the same
/// story as the table's RFC 3339; a tick in neither form is a usage error that names both.
#[test]
fn explain_takes_a_tick_as_history_and_status_print_it() {
    let fixture = Fixture::new();
    let ticks = fixture.seed();
    let history = fixture.json(&["history", "--job", "archive", "--limit", "1"]);
    let entry = &history["entries"][0];
    assert_eq!(entry["tick"], ticks[0].as_millis());
    let rfc3339 = entry["tick_rfc3339"].as_str().expect("tick_rfc3339");
    assert_eq!(rfc3339, show(ticks[0]));
    let listed = &history["ticks"][0];
    assert_eq!(listed["tick"], ticks[0].as_millis());
    assert_eq!(listed["tick_rfc3339"], rfc3339);
    assert_eq!(listed["notes"][0]["tick_rfc3339"], rfc3339);
    let ms = entry["tick"].to_string();
    let by_ms = fixture.json(&["explain", "archive", &ms]);
    let by_rfc3339 = fixture.json(&["explain", "archive", rfc3339]);
    assert_eq!(by_ms["tick_ms"], ticks[0].as_millis());
    assert_eq!(by_ms["verdict"], "failed");
    assert_eq!(by_ms["story"], by_rfc3339["story"]);
    assert_eq!(by_ms["runs"][0]["tick_rfc3339"], rfc3339);
    let (code, text, stderr) = fixture.run(&["explain", "archive", &ms]);
    assert_eq!(code, 0, "{stderr}");
    assert!(text.contains("w2 won it with token 4"), "{text}");

    // `status`: the runs under way and the last run carry their tick in both forms too.
    let status = fixture.json(&["status"]);
    let running = &status["jobs"][1]["running"][0];
    assert_eq!(running["tick"], hourly_tick().as_millis());
    assert_eq!(running["tick_rfc3339"], show(hourly_tick()));
    let announced = &status["workers"][1]["running"][0];
    assert_eq!(announced["tick_rfc3339"], show(hourly_tick()));
    assert_eq!(status["jobs"][0]["last_run"]["tick_rfc3339"], rfc3339);
    let by_ms = fixture.json(&["explain", "hourly", &running["tick"].to_string()]);
    assert_eq!(by_ms["verdict"], "not_run");
    // The tables' forms: the run under way as `status` prints it, the tick as `history` prints it.
    let (_, table, _) = fixture.run(&["status"]);
    let cell = super::line(&table, "w2")
        .split_whitespace()
        .find(|cell| cell.starts_with("hourly@"))
        .expect("w2 runs hourly")
        .to_string();
    assert_eq!(
        fixture.json(&["explain", "hourly", &cell])["story"],
        by_ms["story"]
    );
    let (_, table, _) = fixture.run(&["history", "--job", "hourly", "--limit", "1"]);
    let first = table
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().next());
    let by_table = fixture.json(&["explain", "hourly", first.expect("a tick")]);
    assert_eq!(by_table["story"], by_ms["story"]);

    let (code, _, stderr) = fixture.run(&["explain", "archive", "17954367O5000"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("expected an RFC 3339 timestamp")
            && stderr.contains("milliseconds since the Unix epoch"),
        "{stderr}"
    );
}

/// The embedded store: the commands read its database file as they read Redis nodes; before any worker
/// made one, they say so (exit 1) and create none.
#[test]
fn the_embedded_store_is_read_from_its_file() {
    let dir = crate::support::TestDir::new();
    let config = dir.write_config(
        "embedded:\n  path: state/redcron.db\njobs:\n  - name: nightly\n    schedule: \"@daily\"\n    command: [\"true\"]\n",
    );
    let (code, _, stderr) = super::inspect(&dir, &config, &["history"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("state/redcron.db does not exist: no worker has run with this config"),
        "{stderr}"
    );
    assert!(!dir.join("state/redcron.db").exists());

    let loaded = redcron::config::load(&config).expect("a valid config");
    let tick = loaded.jobs[0]
        .schedule
        .last_at_or_before(chrono::Utc::now())
        .expect("a day before");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let store = redcron::store::Store::open(&loaded).expect("the database opens");
        let mut run = Entry::new("nightly", tick, "host-1", Kind::Run, chrono::Utc::now());
        run.token = Some(12);
        run.outcome = Some("success".to_string());
        run.ended_at = Some(chrono::Utc::now());
        store.record(&[run]).await.expect("recorded");
    });
    let (code, stdout, stderr) = super::inspect(&dir, &config, &["history"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    let row = line(&stdout, &show(tick));
    assert!(
        row.contains("nightly") && row.contains("host-1") && row.contains("success"),
        "{stdout}"
    );
    let (code, stdout, _) = super::inspect(&dir, &config, &["status", "--json"]);
    assert_eq!(code, 0);
    let status = super::parse(&stdout);
    assert!(
        status["store"]
            .as_str()
            .expect("store")
            .starts_with("embedded:"),
        "{status}"
    );
    assert_eq!(status["jobs"][0]["last_run"]["token"], 12);
}

/// Pauses and resumes (`control` entries) do not use up a status read's entries: with 100 controls newer
/// than all of `archive`'s ticks, a read of 40 entries (the dashboard's strips) still holds the seeded
/// entries of its 4 ticks, and the status from it is the one the seed alone gives.
#[test]
fn controls_do_not_push_the_ticks_out_of_a_status_read() {
    let fixture = Fixture::new();
    let ticks = fixture.seed();
    let made = Utc::now() - chrono::Duration::seconds(200);
    let controls: Vec<Entry> = (0..100)
        .map(|n| {
            let what = Control {
                action: if n % 2 == 0 {
                    CONTROL_PAUSED
                } else {
                    CONTROL_RESUMED
                },
                by: "ops via dashboard from 127.0.0.1".to_string(),
                reason: format!("drill {n}"),
                until: None,
            };
            Entry::control(
                "archive",
                &what,
                "dashboard",
                made + chrono::Duration::seconds(n),
            )
        })
        .collect();
    fixture.record(&controls);
    let config = redcron::config::load(&fixture.config).expect("the test config is valid");
    let archive = &config.jobs[0];
    let inputs = fixture
        .runtime
        .block_on(status::read_jobs(&fixture.store, &[archive], 40))
        .expect("a majority answered");
    let read = &inputs.histories[0];
    assert!(read.iter().all(|e| !e.is_control()), "{read:#?}");
    let read_ticks: BTreeSet<i64> = read.iter().map(|e| e.tick).collect();
    let seeded: BTreeSet<i64> = ticks.iter().map(|t| t.as_millis()).collect();
    assert_eq!(read_ticks, seeded, "{read:#?}");
    assert_eq!(read.len(), 7, "every seeded entry of archive: {read:#?}");

    let status = status::status_of(&config, &[archive], inputs, Utc::now());
    let job = &status.jobs[0];
    let token = job.last_run.as_ref().and_then(|run| run.token);
    assert_eq!(token, Some(4), "{job:#?}");
    assert_eq!(job.failures_in_a_row, 3, "{job:#?}");
    let success = job.last_success.as_ref().map(|run| run.tick);
    assert_eq!(success, Some(ticks[3].as_millis()), "{job:#?}");
}
