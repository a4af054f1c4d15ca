//! Hostile YAML: an alias bomb (a few hundred bytes of nested aliases that expand to billions of nodes)
//! and nesting thousands deep are refused with a problem at their line, by `redcron check` and by a
//! running worker's reload, in little memory and time; a config of 10,000 jobs that shares its values
//! through aliases still loads.
//!
//! The processes under test run with a bounded address space (`RLIMIT_AS`), so that a regression makes
//! the test fail instead of taking the machine's memory.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::cli::{output, redcron};
use crate::support::{TestDir, Worker};

/// The address space the processes under test may use: a worker reserves about 400 MB of it idle (its
/// threads' stacks, malloc's arenas), a bomb expanded without a bound needs tens of gigabytes.
const ADDRESS_SPACE: u64 = 1 << 30;

/// The billion laughs, 485 bytes: nine levels of nine aliases each, 387 million strings expanded.
fn alias_bomb() -> String {
    let mut text = String::from(
        "a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for level in 1..10 {
        let aliases = vec![format!("*a{}", level - 1); 9].join(",");
        text.push_str(&format!("a{level}: &a{level} [{aliases}]\n"));
    }
    text
}

/// `redcron check` on `yaml`, in at most [`ADDRESS_SPACE`] bytes and 60 s of CPU: its exit code, stderr
/// and how long it took.
fn check_bounded(yaml: &str) -> (i32, String, Duration) {
    let dir = TestDir::new();
    dir.write("jobs.yaml", yaml);
    let mut command = redcron(dir.path());
    command.arg("check").env("GREETING", "hello");
    let limits = [(libc::RLIMIT_AS, ADDRESS_SPACE), (libc::RLIMIT_CPU, 60)];
    // SAFETY: setrlimit is async-signal-safe and reads only the structs moved into the closure.
    unsafe {
        command.pre_exec(move || {
            for (resource, value) in limits {
                let limit = libc::rlimit {
                    rlim_cur: value as libc::rlim_t,
                    rlim_max: value as libc::rlim_t,
                };
                if libc::setrlimit(resource, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let started = Instant::now();
    let (code, _stdout, stderr) = output(&mut command);
    (code, stderr, started.elapsed())
}

/// `redcron check` on a 485-byte alias bomb fails at once (exit 2), naming the file, the line and column
/// of the alias that crossed the limit and its field, in bounded memory. Before the bound it grew past
/// 20 GB (here: it died at the address-space limit).
#[test]
fn check_refuses_an_alias_bomb_at_its_line() {
    let bomb = alias_bomb() + "jobs: *a9\n";
    assert!(bomb.len() < 500, "{} bytes", bomb.len());
    let (code, stderr, took) = check_bounded(&bomb);
    assert_eq!(code, 2, "{stderr}");
    // Line 7 is `a6: &a6 [*a5,…]`: a0 to a5 and the first copy of a5 are 1,270,459 nodes.
    assert!(
        stderr.starts_with(
            "jobs.yaml:7:10: a6[0]: aliases up to here copy 1270459 nodes, more than 1000000"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("error: jobs.yaml has 1 problem; nothing was run"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(20), "check took {took:?}");
}

/// A file nested 20,000 lists deep (40 KB) is refused at the 65th level with its line and column; it
/// used to overflow the stack (SIGABRT).
#[test]
fn check_refuses_nesting_too_deep() {
    let deep = format!("jobs:\n{}x\n", "- ".repeat(20_000));
    let (code, stderr, took) = check_bounded(&deep);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.starts_with("jobs.yaml:2:127: jobs[0]"),
        "{}",
        &stderr[..stderr.len().min(500)]
    );
    assert!(
        stderr.contains("nested more than 64 lists and mappings deep"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(20), "check took {took:?}");
}

/// The limits are generous for real configs: 10,000 jobs that each share a command, an environment of ten
/// variables, an `inherit_env` list and a hook with the first job through aliases (40,000 aliases,
/// 240,000 nodes copied) load.
#[test]
fn ten_thousand_jobs_sharing_values_through_aliases_load() {
    let env: Vec<String> = (0..10).map(|i| format!("VAR{i}: value{i}")).collect();
    let mut yaml = format!(
        "jobs:\n  - {{name: j0, schedule: '@daily', command: &command [/bin/echo, hello], \
         env: &env {{{}}}, inherit_env: &inherit [PATH, HOME, TZ, LANG], on_failure: &hook 'true'}}\n",
        env.join(", ")
    );
    for j in 1..10_000 {
        yaml.push_str(&format!(
            "  - {{name: j{j}, schedule: '@daily', command: *command, env: *env, inherit_env: *inherit, \
             on_failure: *hook}}\n"
        ));
    }
    let config = redcron::config::parse_with_env(&yaml, Path::new("jobs.yaml"), &|_| None)
        .unwrap_or_else(|e| {
            panic!(
                "{}",
                e.to_string().lines().take(5).collect::<Vec<_>>().join("\n")
            )
        });
    assert_eq!(config.jobs.len(), 10_000);
    let last = &config.jobs[9_999];
    assert_eq!(last.env.get("VAR9").map(String::as_str), Some("value9"));
    assert_eq!(last.env.len(), 10);
}

/// Big files are read in about linear time: 10,000 jobs with a `${VAR}` each (700 KB), and a job whose
/// `env` has 100,000 variables (1.6 MB), are checked within seconds. Each `${` was searched for from the
/// top of the file, and each key compared with every key before it: the first took 70 s and the second
/// 43 s on the 2-core test machine (debug build), and a reload blocks the worker's scheduling loop.
#[test]
fn big_files_are_read_in_linear_time() {
    let mut vars = String::from("jobs:\n");
    for j in 0..10_000 {
        vars.push_str(&format!(
            "  - name: j{j}\n    schedule: '@daily'\n    command: 'echo ${{GREETING}} {j}'\n"
        ));
    }
    let mut wide =
        String::from("jobs:\n  - name: a\n    schedule: '@daily'\n    command: 'true'\n    env:\n");
    for v in 0..100_000 {
        wide.push_str(&format!("      V{v}: x\n"));
    }
    for (what, yaml) in [("10,000 variables", vars), ("100,000 env keys", wide)] {
        let (code, stderr, took) = check_bounded(&yaml);
        assert_eq!(code, 0, "{what}: {stderr}");
        assert!(
            took < Duration::from_secs(20),
            "{what}: check took {took:?}"
        );
    }
}

/// A running worker (embedded store) whose config file is replaced by one holding an alias bomb logs
/// `config.reload_failed` with the file and line, keeps running its job every second, and stays small:
/// its resident memory grows by less than 20 MB. Before the bound, a 411-byte bomb took a worker to
/// 2.75 GB (here: it died at the address-space limit).
#[test]
fn a_worker_refuses_an_alias_bomb_on_reload_and_keeps_running_small() {
    let dir = TestDir::new();
    let job = format!(
        "worker:\n  id: w\njobs:\n  - name: tick\n    schedule: \"* * * * * *\"\n    command: 'echo $REDCRON_TICK >> {}'\n",
        dir.ledger().display()
    );
    let path = dir.write_config(&job);
    let worker = Worker::spawn(&path, &[]);
    let wait = Duration::from_secs(30);
    worker
        .wait_for_event("run.finished", wait)
        .unwrap_or_else(|| panic!("the job never ran: {}", worker.stderr()));
    limit_address_space(
        worker.pid(),
        ADDRESS_SPACE + status_kb(worker.pid(), "VmSize") * 1024,
    );
    let rss_before = status_kb(worker.pid(), "VmRSS");

    // Replaced by rename, as an editor does, so that the worker never reads half a file.
    let temp = dir.write("jobs.yaml.tmp", alias_bomb() + &job);
    std::fs::rename(temp, &path).expect("rename");
    let failed = worker
        .wait_for_event("config.reload_failed", wait)
        .unwrap_or_else(|| panic!("no config.reload_failed: {}", worker.stderr()));
    let problem = failed["problem"].as_str().unwrap_or_default();
    assert!(
        problem.ends_with("jobs.yaml:7:10: a6[0]: aliases up to here copy 1270459 nodes, more than 1000000: the document is too big once its aliases are expanded (an alias bomb?); nothing was read past this alias (limits: 100000 aliases, 1000000 nodes and 16777216 bytes copied by aliases)"),
        "{problem}"
    );

    // The job goes on: three more runs after the failed reload.
    let runs_then = dir.ledger_lines().len();
    let deadline = Instant::now() + wait;
    while dir.ledger_lines().len() < runs_then + 3 {
        assert!(
            Instant::now() < deadline,
            "the job stopped after the failed reload: {}",
            worker.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (rss, peak) = (
        status_kb(worker.pid(), "VmRSS"),
        status_kb(worker.pid(), "VmHWM"),
    );
    assert!(
        rss < rss_before + 20_000 && peak < rss_before + 20_000,
        "resident {rss} kB (peak {peak} kB), {rss_before} kB before the reload"
    );
    assert!(worker.events("config.reloaded").is_empty());
}

/// A field of `/proc/<pid>/status` in kB (`VmRSS`, `VmHWM`, `VmSize`).
fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status:\n{status}"))
}

/// Bounds the address space of the running process `pid` to `bytes`.
fn limit_address_space(pid: u32, bytes: u64) {
    let limit = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    let pid = libc::pid_t::try_from(pid).expect("a pid fits pid_t");
    // SAFETY: prlimit reads one `rlimit` we own and writes nothing (old limit pointer is null).
    let done = unsafe { libc::prlimit(pid, libc::RLIMIT_AS, &limit, std::ptr::null_mut()) };
    assert_eq!(done, 0, "prlimit: {}", std::io::Error::last_os_error());
}
