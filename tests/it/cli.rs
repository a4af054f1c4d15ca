//! CLI: the built `redcron` binary, run in a sandbox directory of its own.
//!
//! Each kind of bad config gives its `file:line:column: field: message` on stderr and exit 2; `check`
//! and `next` print exactly what they should; `run` maps signals to exit codes 0 and 130.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::support::TestDir;

const GOOD: &str = r#"
jobs:
  - name: nightly-report
    schedule: "30 2 * * *"
    timezone: Europe/Berlin
    command: ["/bin/true"]
  - name: half-hourly
    schedule: "*/30 * * * *"
    timezone: Europe/Berlin
    command: "echo $REDCRON_TICK"
    enabled: false
"#;

/// `redcron` with `args`, run in `dir` with a clean environment for its own variables.
pub(crate) fn redcron(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_redcron"));
    command
        .current_dir(dir)
        .env_remove("REDCRON_CONFIG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    command
}

pub(crate) fn output(command: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = command.output().expect("run redcron");
    let code = status.code().expect("exited, not killed by a signal");
    (
        code,
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// `redcron check` on a `jobs.yaml` holding `yaml`: asserts exit 2 and returns stderr.
fn check_fails(yaml: &str) -> String {
    let dir = TestDir::new();
    dir.write("jobs.yaml", yaml);
    let (code, stdout, stderr) = output(redcron(dir.path()).arg("check"));
    assert_eq!(code, 2, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    stderr
}

fn assert_has_line(stderr: &str, prefix: &str) {
    assert!(
        stderr.lines().any(|line| line.starts_with(prefix)),
        "no line starting with {prefix:?} in:\n{stderr}"
    );
}

/// YAML syntax errors give line and column.
#[test]
fn yaml_syntax_error() {
    let stderr = check_fails("jobs:\n  - name: a\n    schedule: \"* * * * *\n");
    assert_has_line(
        &stderr,
        "jobs.yaml:3:15: YAML syntax error: while scanning a quoted scalar",
    );
    assert_has_line(&stderr, "error: jobs.yaml has 1 problem; nothing was run");
}

/// Unknown fields are rejected at the key.
#[test]
fn unknown_field() {
    let stderr =
        check_fails("jobs:\n  - name: a\n    schedule: \"* * * * *\"\n    comand: [\"true\"]\n");
    assert_has_line(
        &stderr,
        "jobs.yaml:2:5: jobs[0].command: missing field `command`",
    );
    assert_has_line(
        &stderr,
        "jobs.yaml:4:5: jobs[0].comand: unknown field `comand`; expected one of",
    );
}

/// A bad cron expression names the field of the expression that is wrong.
#[test]
fn bad_cron() {
    let stderr =
        check_fails("jobs:\n  - name: a\n    schedule: \"61 * * * *\"\n    command: [\"true\"]\n");
    assert_has_line(&stderr, "jobs.yaml:3:15: jobs[0].schedule: invalid cron expression \"61 * * * *\": minute field \"61\"");
}

/// An unknown time zone is rejected.
#[test]
fn bad_time_zone() {
    let stderr = check_fails("jobs:\n  - name: a\n    schedule: \"@daily\"\n    timezone: Berlin\n    command: [\"true\"]\n");
    assert_has_line(
        &stderr,
        "jobs.yaml:4:15: jobs[0].timezone: unknown time zone \"Berlin\"",
    );
}

/// Two jobs may not share a name.
#[test]
fn duplicate_names() {
    let job = "  - name: twin\n    schedule: \"@daily\"\n    command: [\"true\"]\n";
    let stderr = check_fails(&format!("jobs:\n{job}{job}"));
    assert_has_line(
        &stderr,
        "jobs.yaml:5:11: jobs[1].name: duplicate job name \"twin\"",
    );
}

/// Durations need a unit.
#[test]
fn bad_duration() {
    let stderr = check_fails("lock:\n  ttl: 30 seconds please\njobs: []\n");
    assert_has_line(
        &stderr,
        "jobs.yaml:2:8: lock.ttl: invalid duration \"30 seconds please\"",
    );
}

/// `${VAR}` must be set; when it is, its value is used.
#[test]
fn unset_variable() {
    let yaml =
        "jobs:\n  - name: a\n    schedule: \"${SCHEDULE_FOR_TEST}\"\n    command: [\"true\"]\n";
    let dir = TestDir::new();
    dir.write("jobs.yaml", yaml);
    let (code, _, stderr) = output(
        redcron(dir.path())
            .arg("check")
            .env_remove("SCHEDULE_FOR_TEST"),
    );
    assert_eq!(code, 2, "{stderr}");
    assert_has_line(
        &stderr,
        "jobs.yaml:3:16: environment variable SCHEDULE_FOR_TEST is not set",
    );
    let (code, stdout, stderr) = output(
        redcron(dir.path())
            .args(["check", "--after", "2026-01-01T00:00:00Z"])
            .env("SCHEDULE_FOR_TEST", "@hourly"),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("job a: \"@hourly\" in UTC\n  next: 2026-01-01T01:00:00+00:00\n"),
        "{stdout}"
    );
}

/// Node URLs must parse as redis:// or rediss://, and a password never reaches the output.
#[test]
fn bad_url_hides_password() {
    let yaml = "redis:\n  nodes:\n    - redis://h1:6379\n    - \"redis://admin:${PW_FOR_TEST}@h2:99999\"\n    - \"http://:hunter2@h3\"\njobs: []\n";
    let dir = TestDir::new();
    dir.write("jobs.yaml", yaml);
    let (code, stdout, stderr) = output(
        redcron(dir.path())
            .arg("check")
            .env("PW_FOR_TEST", "s3cret"),
    );
    assert_eq!(code, 2, "{stderr}");
    assert_has_line(
        &stderr,
        "jobs.yaml:4:7: redis.nodes[1]: invalid Redis node URL redis://admin:***@h2:99999",
    );
    assert_has_line(
        &stderr,
        "jobs.yaml:5:7: redis.nodes[2]: invalid Redis node URL http://:***@h3",
    );
    for secret in ["s3cret", "hunter2"] {
        assert!(
            !stderr.contains(secret) && !stdout.contains(secret),
            "{secret} leaked:\n{stderr}"
        );
    }
}

/// `run` refuses a bad config before doing anything.
#[test]
fn run_with_bad_config_exits_2() {
    let dir = TestDir::new();
    dir.write(
        "jobs.yaml",
        "jobs:\n  - name: a\n    schedule: nope\n    command: [\"true\"]\n",
    );
    let (code, stdout, stderr) = output(redcron(dir.path()).arg("run"));
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert_has_line(
        &stderr,
        "jobs.yaml:3:15: jobs[0].schedule: invalid cron expression \"nope\"",
    );
    assert!(
        stdout.is_empty(),
        "nothing logged before the config is valid: {stdout}"
    );
}

/// A missing file is exit 2 with its name and how to name another (`-c`, `REDCRON_CONFIG`).
#[test]
fn missing_file() {
    let dir = TestDir::new();
    let (code, _, stderr) = output(redcron(dir.path()).args(["check", "-c", "nowhere.yaml"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.starts_with("nowhere.yaml: cannot read the configuration file"),
        "{stderr}"
    );
    // Where to name another file: the flag and the variable.
    assert!(
        stderr.contains("-c FILE") && stderr.contains("REDCRON_CONFIG"),
        "{stderr}"
    );
    let (code, _, stderr) = output(redcron(dir.path()).arg("check"));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.starts_with("jobs.yaml: cannot read the configuration file")
            && stderr.contains("without either it is jobs.yaml in the current directory"),
        "{stderr}"
    );
}

/// `check` on a good file lists each job with its next 3 fire times in its zone, and the warnings.
#[test]
fn check_output() {
    let dir = TestDir::new();
    dir.write(
        "jobs.yaml",
        format!("redis:\n  nodes: [\"redis://:pw@127.0.0.1:1\", \"redis://127.0.0.1:2\"]\n{GOOD}"),
    );
    let (code, stdout, stderr) =
        output(redcron(dir.path()).args(["check", "--after", "2026-10-25T00:15:00+02:00"]));
    assert_eq!(code, 0, "{stderr}");
    let expected = "\
store: 2 Redis nodes: redis://:***@127.0.0.1:1, redis://127.0.0.1:2
  a claim needs 2 of the 2 nodes to agree
lock: ttl 30s, renew every 10s, node timeout 50ms, drift factor 0.01, 3 retries after 200ms, key prefix redcron
job nightly-report: \"30 2 * * *\" in Europe/Berlin
  next: 2026-10-25T02:30:00+02:00
  next: 2026-10-26T02:30:00+01:00
  next: 2026-10-27T02:30:00+01:00
  fingerprint: d30937ab17e31663
job half-hourly: \"*/30 * * * *\" in Europe/Berlin (disabled)
  next: 2026-10-25T00:30:00+02:00
  next: 2026-10-25T01:00:00+02:00
  next: 2026-10-25T01:30:00+02:00
  fingerprint: 29395a3c9d921e7a
config fingerprint: f52062c652fd329e
warning: jobs.yaml:2:10: redis.nodes: 2 nodes: a quorum needs 2 of them, so only 0 may fail, no more than with 1 node; use an odd number
jobs.yaml: OK, 2 jobs, 1 warning
";
    assert_eq!(stdout, expected);
}

/// `next` prints exact fire times across the Berlin fall-back night, for a fixed-time and a
/// wildcard-hour job; `-c` and `REDCRON_CONFIG` both choose the file.
#[test]
fn next_output_across_dst() {
    let dir = TestDir::new();
    dir.write("berlin.yaml", GOOD);
    let after = "2026-10-25T01:45:00+02:00";
    let (code, stdout, stderr) = output(redcron(dir.path()).args([
        "next",
        "-c",
        "berlin.yaml",
        "--job",
        "half-hourly",
        "--count",
        "6",
        "--after",
        after,
    ]));
    assert_eq!(code, 0, "{stderr}");
    let expected = "\
2026-10-25T02:00:00+02:00
2026-10-25T02:30:00+02:00
2026-10-25T02:00:00+01:00
2026-10-25T02:30:00+01:00
2026-10-25T03:00:00+01:00
2026-10-25T03:30:00+01:00
";
    assert_eq!(stdout, expected);
    let (code, stdout, stderr) = output(
        redcron(dir.path())
            .args([
                "next",
                "--job",
                "nightly-report",
                "--after",
                "2026-03-27T12:00:00Z",
            ])
            .env("REDCRON_CONFIG", "berlin.yaml"),
    );
    assert_eq!(code, 0, "{stderr}");
    let expected = "\
2026-03-28T02:30:00+01:00
2026-03-29T03:00:00+02:00
2026-03-30T02:30:00+02:00
2026-03-31T02:30:00+02:00
2026-04-01T02:30:00+02:00
";
    assert_eq!(stdout, expected);
}

/// An unknown job is exit 2 with the list of known jobs; bad flag values are usage errors (exit 2).
#[test]
fn next_usage_errors() {
    let dir = TestDir::new();
    dir.write("jobs.yaml", GOOD);
    let (code, _, stderr) = output(redcron(dir.path()).args(["next", "--job", "weekly"]));
    assert_eq!(code, 2);
    assert_eq!(
        stderr,
        "error: no job named \"weekly\" in jobs.yaml; known jobs: nightly-report, half-hourly\n"
    );
    let (code, _, stderr) =
        output(redcron(dir.path()).args(["next", "--job", "half-hourly", "--after", "yesterday"]));
    assert_eq!(code, 2);
    assert!(
        stderr.contains("expected an RFC 3339 timestamp"),
        "{stderr}"
    );
    let (code, _, _) =
        output(redcron(dir.path()).args(["next", "--job", "half-hourly", "--count", "0"]));
    assert_eq!(code, 2);
    let (code, _, _) = output(redcron(dir.path()).arg("frobnicate"));
    assert_eq!(code, 2);
}

/// `--help` documents the exit codes.
#[test]
fn help_lists_exit_codes() {
    let dir = TestDir::new();
    let (code, stdout, _) = output(redcron(dir.path()).arg("--help"));
    assert_eq!(code, 0);
    for line in [
        "Exit codes:",
        "  1    runtime failure",
        "  2    bad configuration or usage",
        "  3    the store could not be reached: no majority",
        "  5    pause, trigger: a live worker would ignore the command",
        "  130  stopped at once",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
    let (code, stdout, _) = output(redcron(dir.path()).args(["next", "--help"]));
    assert_eq!(code, 0);
    assert!(
        stdout.contains("--count <N>") && stdout.contains("REDCRON_CONFIG"),
        "{stdout}"
    );
    let (code, stdout, _) = output(redcron(dir.path()).args(["pause", "--help"]));
    assert_eq!(code, 0);
    assert!(
        stdout.contains("--replace") && stdout.contains("--even-if-ignored"),
        "{stdout}"
    );
}

/// `run` logs JSON when stdout is a pipe, exits 0 after one SIGTERM, and 130 after a second signal
/// while a job is still running.
#[test]
fn run_exit_codes() {
    let dir = TestDir::new();
    let sleeper = "  - name: sleeper\n    command: [\"sleep\", \"30\"]\n";
    dir.write(
        "yearly.yaml",
        format!("jobs:\n{sleeper}    schedule: \"@yearly\"\n"),
    );
    dir.write(
        "jobs.yaml",
        format!("worker:\n  shutdown_grace: 60s\njobs:\n{sleeper}    schedule: \"* * * * * *\"\n"),
    );
    // No job running: the first signal is enough.
    let (mut child, lines) = start_run(&dir, &["run", "-c", "yearly.yaml", "--log-level", "info"]);
    wait_for(&lines, "\"worker.started\"");
    signal(&child, libc::SIGTERM);
    assert_eq!(wait_exit(&mut child), 0);
    // A job running with a long grace: the second signal stops it at once.
    let (mut child, lines) = start_run(&dir, &["run"]);
    wait_for(&lines, "\"run.started\"");
    signal(&child, libc::SIGTERM);
    wait_for(&lines, "\"worker.stopping\"");
    signal(&child, libc::SIGINT);
    assert_eq!(wait_exit(&mut child), 130);
}

fn start_run(dir: &TestDir, args: &[&str]) -> (std::process::Child, mpsc::Receiver<String>) {
    let mut child = redcron(dir.path())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn redcron run");
    let stdout = child.stdout.take().expect("piped stdout");
    let (send, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    (child, lines)
}

/// Waits (at most 15 s) for a log line containing `needle`; every line must be a JSON object.
fn wait_for(lines: &mpsc::Receiver<String>, needle: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) => {
                assert!(
                    serde_json::from_str::<serde_json::Value>(&line).is_ok(),
                    "not a JSON line: {line}"
                );
                if line.contains(needle) {
                    return;
                }
            }
            Err(_) => break,
        }
    }
    panic!("no log line with {needle} within 15 s");
}

fn signal(child: &std::process::Child, signal: i32) {
    let pid = i32::try_from(child.id()).expect("pid fits in i32");
    // SAFETY: kill(2) on a child we started and have not reaped yet.
    unsafe {
        libc::kill(pid, signal);
    }
}

fn wait_exit(child: &mut std::process::Child) -> i32 {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = child.try_wait().expect("wait for redcron") {
            return status.code().expect("exited, not killed by a signal");
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("redcron did not exit within 15 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `check` prints each job's fingerprint: the same for the same definition (whatever the file's layout),
/// another when a field that matters changes — what `job.config_differs` compares during a rollout.
#[test]
fn check_prints_a_fingerprint_that_follows_the_definition() {
    let fingerprint = |yaml: &str| {
        let dir = TestDir::new();
        dir.write("jobs.yaml", yaml);
        let (code, stdout, stderr) = output(redcron(dir.path()).arg("check"));
        assert_eq!(code, 0, "{stderr}");
        let line = stdout
            .lines()
            .find_map(|line| line.trim().strip_prefix("fingerprint: "))
            .unwrap_or_else(|| panic!("no fingerprint in {stdout}"))
            .to_string();
        assert!(
            line.len() == 16 && line.chars().all(|c| c.is_ascii_hexdigit()),
            "{line:?}"
        );
        line
    };
    let base =
        fingerprint("jobs:\n  - name: a\n    schedule: \"@hourly\"\n    command: [\"true\"]\n");
    let same = fingerprint(
        "# a comment\njobs:\n  - command: [\"true\"]\n    name: a\n    schedule: \"@hourly\"\n",
    );
    let allow = fingerprint(
        "jobs:\n  - name: a\n    schedule: \"@hourly\"\n    command: [\"true\"]\n    overlap: allow\n",
    );
    assert_eq!(base, same);
    assert_ne!(base, allow);
}

/// `check` prints the config's fingerprint — what each worker announces and `status` compares: the same
/// whatever the jobs' order and the settings outside `jobs:`, another when a job is renamed or changed.
#[test]
fn check_prints_a_config_fingerprint_of_the_whole_schedule() {
    let fingerprint = |yaml: &str| {
        let dir = TestDir::new();
        dir.write("jobs.yaml", yaml);
        let (code, stdout, stderr) = output(redcron(dir.path()).arg("check"));
        assert_eq!(code, 0, "{stderr}");
        stdout
            .lines()
            .find_map(|line| line.strip_prefix("config fingerprint: "))
            .unwrap_or_else(|| panic!("no config fingerprint in {stdout}"))
            .to_string()
    };
    let a = "  - name: a\n    schedule: \"@hourly\"\n    command: [\"true\"]\n";
    let b = "  - name: b\n    schedule: \"@daily\"\n    command: [\"true\"]\n";
    let base = fingerprint(&format!("jobs:\n{a}{b}"));
    assert_eq!(
        base,
        fingerprint(&format!("worker:\n  shutdown_grace: 5s\njobs:\n{b}{a}"))
    );
    assert_ne!(
        base,
        fingerprint(&format!("jobs:\n{a}{}", b.replace("name: b", "name: c")))
    );
    assert_ne!(
        base,
        fingerprint(&format!("jobs:\n{a}{}", b.replace("@daily", "@weekly")))
    );
    assert_ne!(base, fingerprint(&format!("jobs:\n{a}")));
}

/// A file with no shared store says plainly, in `check` and in the worker's warning, that every host
/// that runs it runs every job (a recipe that copied the shipped jobs.yaml to every host ran every job
/// everywhere with one quiet WARN).
#[test]
fn a_file_without_a_shared_store_says_every_host_runs_every_job() {
    let dir = TestDir::new();
    dir.write(
        "jobs.yaml",
        "jobs:\n  - name: a\n    schedule: \"0 0 0 1 1 *\"\n    command: [\"true\"]\n",
    );
    let (code, stdout, stderr) = output(redcron(dir.path()).arg("check"));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("store: embedded, database")
            && stdout.contains("every host that runs this file runs every job"),
        "{stdout}"
    );
    let worker = crate::support::Worker::spawn(dir.join("jobs.yaml"), &[]);
    let warned = worker
        .wait_for_event("worker.embedded_store", Duration::from_secs(20))
        .expect("worker.embedded_store");
    assert_eq!(warned["level"], "WARN", "{warned}");
    assert!(
        warned["message"]
            .as_str()
            .is_some_and(|m| m.contains("every host that runs this file runs every job")),
        "{warned}"
    );
}
