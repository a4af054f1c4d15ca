//! Config: `jobs.yaml` parsed through `redcron::config::parse_with_env`, no files, no Redis.
//!
//! Good files give the values and defaults the worker relies on; each kind of bad input gives its
//! own problem with line, column and field, and a file with several problems reports all of them.

use std::path::Path;
use std::time::Duration;

use std::collections::BTreeSet;

use redcron::config::{
    parse_with_env, Command, Config, ConfigError, InheritEnv, Problem, RedisNode, ReplicaAcks,
    SqlConfig, SqlDialect, SqlTls, StoreConfig,
};
use redcron::lock::Overlap;

/// The environment the tests see: only these variables are set.
fn env(name: &str) -> Option<String> {
    match name {
        "REDIS_PASSWORD" => Some("s3cret".to_string()),
        "BUCKET" => Some("reports".to_string()),
        "SQL_PASSWORD" => Some("pg-s3cret".to_string()),
        _ => None,
    }
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    parse_with_env(text, Path::new("jobs.yaml"), &env)
}

fn ok(text: &str) -> Config {
    parse(text).unwrap_or_else(|e| panic!("expected a valid config, got:\n{e}"))
}

fn problems(text: &str) -> Vec<Problem> {
    match parse(text) {
        Ok(_) => panic!("expected problems in:\n{text}"),
        Err(e) => e.problems().to_vec(),
    }
}

/// The only problem of `text`, as printed.
fn only_problem(text: &str) -> String {
    let problems = problems(text);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    problems[0].to_string()
}

const JOB: &str = "jobs:\n  - name: a\n    schedule: \"* * * * *\"\n    command: [\"true\"]\n";

/// The example of issue 3, every field given, reads back as written.
#[test]
fn full_example_reads_back() {
    let config = ok(r#"
redis:
  nodes: [redis://10.0.0.1:6379, "redis://:${REDIS_PASSWORD}@10.0.0.2:6379", rediss://10.0.0.3:6380/2]
  key_prefix: myapp
lock:
  ttl: 1m
  renew_every: 10s
  node_timeout: 500ms
  drift_factor: 0.02
  retries: 5
  retry_delay: 1m30s
worker:
  id: web-1
  shutdown_grace: 45s
  max_clock_offset: 2s
  clock_check_every: 5m
jobs:
  - name: nightly-report
    schedule: "30 2 * * *"
    timezone: Europe/Berlin
    command: ["/usr/local/bin/report", "--daily"]
    env: {REPORT_BUCKET: "${BUCKET}", PORT: 8080}
    workdir: /srv/reports
    timeout: 10m
    overlap: allow
    misfire_grace: 1m
    enabled: false
  - name: shell.job_2
    schedule: "*/10 * * * * *"
    command: echo "$HOME costs $$5"
"#);
    let StoreConfig::Redis(redis) = &config.store else {
        panic!("expected a Redis store, got {:?}", config.store)
    };
    let nodes = &redis.nodes;
    assert_eq!(
        nodes[1],
        RedisNode::Server("redis://:s3cret@10.0.0.2:6379".into())
    );
    assert_eq!(nodes.len(), 3);
    let lock = &config.lock;
    assert_eq!(
        (lock.ttl, lock.renew_every, lock.node_timeout),
        (
            Duration::from_secs(60),
            Duration::from_secs(10),
            Duration::from_millis(500)
        )
    );
    assert_eq!(
        (lock.drift_factor, lock.retries, lock.retry_delay),
        (0.02, 5, Duration::from_secs(90))
    );
    assert_eq!(lock.key_prefix, "myapp");
    assert_eq!(
        (config.worker.id.as_str(), config.worker.shutdown_grace),
        ("web-1", Duration::from_secs(45))
    );
    assert_eq!(
        (
            config.worker.max_clock_offset,
            config.worker.clock_check_every
        ),
        (Duration::from_secs(2), Duration::from_secs(300))
    );
    let job = &config.jobs[0];
    assert_eq!(job.name, "nightly-report");
    assert_eq!(job.schedule.expression(), "30 2 * * *");
    assert_eq!(job.schedule.timezone(), chrono_tz::Europe::Berlin);
    assert_eq!(
        job.command,
        Command::Argv(vec!["/usr/local/bin/report".into(), "--daily".into()])
    );
    assert_eq!(
        job.env.get("REPORT_BUCKET").map(String::as_str),
        Some("reports")
    );
    assert_eq!(job.env.get("PORT").map(String::as_str), Some("8080"));
    assert_eq!(job.workdir.as_deref(), Some(Path::new("/srv/reports")));
    assert_eq!(
        (job.timeout, job.overlap, job.misfire_grace, job.enabled),
        (
            Some(Duration::from_secs(600)),
            Overlap::Allow,
            Duration::from_secs(60),
            false
        )
    );
    // `$HOME` is left for the shell; `$$` is a literal `$`.
    assert_eq!(
        config.jobs[1].command,
        Command::Shell("echo \"$HOME costs $5\"".into())
    );
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

/// A minimal file gets every default and no warning (the worker itself warns about the embedded store).
#[test]
fn defaults() {
    let config = ok(JOB);
    assert!(matches!(config.store, StoreConfig::Embedded(_)));
    assert_eq!(config.lock, redcron::lock::LockSettings::default());
    assert_eq!(config.worker.shutdown_grace, Duration::from_secs(30));
    assert_eq!(config.worker.max_clock_offset, Duration::from_millis(500));
    assert_eq!(config.worker.clock_check_every, Duration::from_secs(60));
    let id = &config.worker.id;
    let pid = format!("-{}-", std::process::id());
    assert!(id.contains(&pid), "{id}");
    let suffix = id.rsplit('-').next().unwrap_or_default();
    assert!(
        suffix.len() == 6 && suffix.chars().all(|c| c.is_ascii_hexdigit()),
        "{id}"
    );
    let job = &config.jobs[0];
    assert_eq!(job.schedule.timezone(), chrono_tz::Tz::UTC);
    assert_eq!(
        (job.timeout, job.overlap, job.misfire_grace, job.enabled),
        (None, Overlap::Skip, Duration::from_secs(30), true)
    );
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    // renew_every defaults to a third of the TTL.
    let config = ok(&format!("lock: {{ttl: 9s}}\n{JOB}"));
    assert_eq!(config.lock.renew_every, Duration::from_secs(3));
}

/// A YAML syntax error names its line and column.
#[test]
fn yaml_syntax_error() {
    let got = only_problem("jobs:\n  - name: a\n   schedule: [1, 2\n");
    assert!(got.starts_with("jobs.yaml:3:"), "{got}");
    assert!(got.contains("YAML syntax error"), "{got}");
}

/// Unknown fields are errors at the key, listing what is allowed; all of them are reported.
#[test]
fn unknown_fields() {
    let problems = problems("lock:\n  tll: 30s\njobs:\n  - name: a\n    schedule: \"* * * * *\"\n    command: [\"true\"]\n    retry: 2\n");
    let lines: Vec<String> = problems.iter().map(Problem::to_string).collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(
        lines[0].starts_with(
            "jobs.yaml:2:3: lock.tll: unknown field `tll`; expected one of `ttl`, `renew_every`"
        ),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].starts_with("jobs.yaml:7:5: jobs[0].retry: unknown field `retry`"),
        "{}",
        lines[1]
    );
    let got = only_problem(&format!("{JOB}colour: blue\n"));
    assert!(got.starts_with("jobs.yaml:5:1: colour: unknown field `colour`; expected one of `redis`, `etcd`, `zookeeper`, `postgres`, `mysql`, `embedded`, `lock`, `worker`, `history`, `alerts`, `dashboard`, `jobs`"), "{got}");
}

/// A bad cron expression points at the value and says which field is wrong.
#[test]
fn bad_cron() {
    let got =
        only_problem("jobs:\n  - name: a\n    schedule: \"61 * * * *\"\n    command: [\"true\"]\n");
    assert!(got.starts_with("jobs.yaml:3:15: jobs[0].schedule: invalid cron expression \"61 * * * *\": minute field \"61\""), "{got}");
    let got =
        only_problem("jobs:\n  - name: a\n    schedule: 0 0 30 2 *\n    command: [\"true\"]\n");
    assert!(
        got.ends_with("cron expression \"0 0 30 2 *\" never fires"),
        "{got}"
    );
}

/// An unknown time zone is reported at the value.
#[test]
fn bad_time_zone() {
    let got = only_problem("jobs:\n  - name: a\n    schedule: \"* * * * *\"\n    timezone: Europe/Berln\n    command: [\"true\"]\n");
    assert_eq!(got, "jobs.yaml:4:15: jobs[0].timezone: unknown time zone \"Europe/Berln\": expected an IANA name such as Europe/Berlin, America/New_York or UTC");
}

/// A second job with the same name is reported at its name, pointing back at the first.
#[test]
fn duplicate_names() {
    let got = only_problem(&format!(
        "{JOB}  - name: a\n    schedule: \"@daily\"\n    command: \"true\"\n"
    ));
    assert_eq!(got, "jobs.yaml:5:11: jobs[1].name: duplicate job name \"a\": jobs[0] (line 2) has it too; names must be unique");
    let got = only_problem(
        "jobs:\n  - name: \"a b\"\n    schedule: \"* * * * *\"\n    command: [\"true\"]\n",
    );
    assert!(
        got.starts_with("jobs.yaml:2:11: jobs[0].name: invalid job name \"a b\""),
        "{got}"
    );
}

/// Durations must have a unit; zero is refused where it makes no sense.
#[test]
fn bad_durations() {
    let got = only_problem(&format!("lock:\n  ttl: 30\n{JOB}"));
    assert!(
        got.starts_with("jobs.yaml:2:8: lock.ttl: invalid duration \"30\": "),
        "{got}"
    );
    assert!(got.contains("30s, 500ms, 10m"), "{got}");
    let got = only_problem(&format!("{JOB}    timeout: 0s\n"));
    assert_eq!(
        got,
        "jobs.yaml:5:14: jobs[0].timeout: must be more than zero"
    );
    let got = only_problem(&format!("worker:\n  shutdown_grace: soon\n{JOB}"));
    assert!(
        got.starts_with("jobs.yaml:2:19: worker.shutdown_grace: invalid duration \"soon\""),
        "{got}"
    );
    let got = problems(&format!(
        "worker:\n  max_clock_offset: 0ms\n  clock_check_every: often\n{JOB}"
    ));
    let got: Vec<String> = got.iter().map(Problem::to_string).collect();
    assert_eq!(got.len(), 2, "{got:#?}");
    assert_eq!(
        got[0],
        "jobs.yaml:2:21: worker.max_clock_offset: must be more than zero"
    );
    assert!(
        got[1].starts_with("jobs.yaml:3:22: worker.clock_check_every: invalid duration \"often\""),
        "{}",
        got[1]
    );
    let got = only_problem(&format!("worker:\n  clock_check_every: 0s\n{JOB}"));
    assert_eq!(
        got,
        "jobs.yaml:2:22: worker.clock_check_every: must be more than zero"
    );
}

/// `${VAR}` that is not set is an error at the `${`, and nothing else is reported about that value.
#[test]
fn unset_variable() {
    let got = only_problem(&format!("lock:\n  ttl: ${{NOPE_UNSET}}\n{JOB}"));
    assert_eq!(
        got,
        "jobs.yaml:2:8: environment variable NOPE_UNSET is not set (used as `${NOPE_UNSET}`)"
    );
    let got = only_problem(&format!(
        "{JOB}    env: {{A: \"x-${{BUCKET}}-${{ALSO_UNSET}}\"}}\n"
    ));
    assert!(
        got.starts_with("jobs.yaml:5:27: environment variable ALSO_UNSET"),
        "{got}"
    );
    let got = only_problem(&format!("{JOB}    workdir: /tmp/${{oops\n"));
    assert!(
        got.starts_with("jobs.yaml:5:19: unterminated `${`"),
        "{got}"
    );
}

/// Node URLs must be redis:// or rediss://, parse, and be distinct; a password never appears in errors.
#[test]
fn bad_urls() {
    let got = only_problem(&format!(
        "redis:\n  nodes: [\"http://user:hunter2@h1:6379\"]\n{JOB}"
    ));
    assert!(
        got.starts_with(
            "jobs.yaml:2:11: redis.nodes[0]: invalid Redis node URL http://user:***@h1:6379"
        ),
        "{got}"
    );
    assert!(!got.contains("hunter2"), "{got}");
    let got = only_problem(&format!(
        "redis:\n  nodes:\n    - redis://:${{REDIS_PASSWORD}}@h1:6379/x\n{JOB}"
    ));
    assert!(
        got.starts_with(
            "jobs.yaml:3:7: redis.nodes[0]: invalid Redis node URL redis://:***@h1:6379/x"
        ),
        "{got}"
    );
    assert!(!got.contains("s3cret"), "{got}");
    let got = only_problem(&format!(
        "redis:\n  nodes: [\"redis://h1\", \"redis://H1:6379/3\", \"redis://h2\"]\n{JOB}"
    ));
    assert!(
        got.starts_with("jobs.yaml:2:25: redis.nodes[1]: h1:6379 is already redis.nodes[0]"),
        "{got}"
    );
    let got = only_problem(&format!("redis:\n  nodes: []\n{JOB}"));
    assert!(got.contains("redis.nodes: no nodes"), "{got}");
}

/// The lock's cross-field checks: renew_every < ttl, node_timeout <= ttl/10, sane drift and retries.
#[test]
fn lock_settings_that_do_not_fit_together() {
    let got = only_problem(&format!("lock:\n  ttl: 30s\n  renew_every: 30s\n{JOB}"));
    assert!(
        got.starts_with(
            "jobs.yaml:3:16: lock.renew_every: renew_every (30s) must be below ttl (30s)"
        ),
        "{got}"
    );
    let got = only_problem(&format!("lock:\n  ttl: 2s\n  node_timeout: 500ms\n{JOB}"));
    assert!(got.starts_with("jobs.yaml:3:17: lock.node_timeout: node_timeout (500ms) must be at most a tenth of ttl (2s)"), "{got}");
    let got = only_problem(&format!("lock:\n  ttl: 200ms\n{JOB}"));
    assert!(
        got.starts_with(
            "jobs.yaml:2:8: lock.ttl: node_timeout (50ms) must be at most a tenth of ttl (200ms)"
        ),
        "{got}"
    );
    let got = only_problem(&format!("lock:\n  drift_factor: 0.5\n{JOB}"));
    assert!(
        got.starts_with("jobs.yaml:2:17: lock.drift_factor: invalid drift_factor \"0.5\""),
        "{got}"
    );
    let got = only_problem(&format!("lock:\n  retries: -1\n{JOB}"));
    assert!(
        got.starts_with("jobs.yaml:2:12: lock.retries: invalid retries \"-1\""),
        "{got}"
    );
}

/// A `renew_every` whose renewal, sent on schedule, may be confirmed only after the lease's validity
/// (`ttl − drift`) has run out is an error, not a warning: every long run would lose its lease.
#[test]
fn renew_every_without_slack_is_rejected() {
    // ttl 10 s: drift 102 ms, node_timeout 50 ms: renew_every must be below 9.848 s.
    let got = only_problem(&format!("lock:\n  ttl: 10s\n  renew_every: 9900ms\n{JOB}"));
    assert_eq!(got, "jobs.yaml:3:16: lock.renew_every: renew_every (9s 900ms) leaves no time to renew: a renewal sent on schedule may be confirmed node_timeout (50ms) later, after the lease's validity (ttl − drift = 9s 898ms) has run out, so every run longer than that would lose its lease; renew_every must be below 9s 848ms");
    let got = only_problem(&format!("lock:\n  ttl: 10s\n  renew_every: 9848ms\n{JOB}"));
    assert!(got.contains("renew_every must be below 9s 848ms"), "{got}");
    // Just below the limit: valid, with the warning about a single failed renewal.
    let config = ok(&format!("lock:\n  ttl: 10s\n  renew_every: 9847ms\n{JOB}"));
    assert_eq!(config.lock.renew_every, Duration::from_millis(9_847));
    assert!(
        config.warnings[0].contains("more than half of ttl"),
        "{:?}",
        config.warnings
    );
}

/// `stop_grace` defaults to half the lease's slack (`ttl − drift − renew_every − node_timeout`), at most
/// 10 s; a given one must be above zero and below the slack, and the error names both numbers.
#[test]
fn stop_grace_default_and_limits() {
    // Defaults: 30 s − 302 ms − 10 s − 50 ms = 19.648 s of slack.
    assert_eq!(ok(JOB).jobs[0].stop_grace, Duration::from_millis(9_824));
    let short = "lock:\n  ttl: 2s\n  renew_every: 500ms\n  node_timeout: 100ms\n";
    let config = ok(&format!("{short}{JOB}"));
    assert_eq!(config.jobs[0].stop_grace, Duration::from_millis(689));
    let config = ok(&format!("{short}{JOB}    stop_grace: 1s\n"));
    assert_eq!(config.jobs[0].stop_grace, Duration::from_secs(1));
    let got = only_problem(&format!("{short}{JOB}    stop_grace: 1378ms\n"));
    assert!(got.starts_with("jobs.yaml:9:17: jobs[0].stop_grace: stop_grace (1s 378ms) must be below the lease's slack (1s 378ms = ttl − drift − renew_every − node_timeout)"), "{got}");
    let got = only_problem(&format!("{JOB}    stop_grace: 0s\n"));
    assert_eq!(
        got,
        "jobs.yaml:5:17: jobs[0].stop_grace: must be more than zero"
    );
}

/// `inherit_env`: `all` (the default), `none`, or a list of variable names; anything else is an error at
/// the value (or the list item), and listing a store variable is a warning (it is never inherited).
#[test]
fn inherit_env_values() {
    assert_eq!(ok(JOB).jobs[0].inherit_env, InheritEnv::All);
    let config = ok(&format!("{JOB}    inherit_env: none\n"));
    assert_eq!(config.jobs[0].inherit_env, InheritEnv::Nothing);
    let config = ok(&format!("{JOB}    inherit_env: all\n"));
    assert_eq!(config.jobs[0].inherit_env, InheritEnv::All);
    let config = ok(&format!("{JOB}    inherit_env: [PATH, _X1]\n"));
    let names = BTreeSet::from(["PATH".to_string(), "_X1".to_string()]);
    assert_eq!(config.jobs[0].inherit_env, InheritEnv::Only(names));

    let got = only_problem(&format!("{JOB}    inherit_env: some\n"));
    assert!(got.starts_with("jobs.yaml:5:18: jobs[0].inherit_env: invalid inherit_env \"some\": expected `all` (the default), `none`, or a list of variable names"), "{got}");
    let problems = problems(&format!("{JOB}    inherit_env: [PATH, 1X, A-B]\n"));
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert_eq!(problems[0].to_string(), "jobs.yaml:5:25: jobs[0].inherit_env[1]: invalid variable name \"1X\": use letters, digits and `_`, not starting with a digit");
    assert_eq!(problems[1].field, "jobs[0].inherit_env[2]");
    let got = only_problem(&format!("{JOB}    inherit_env: {{PATH: yes}}\n"));
    assert!(got.starts_with("jobs.yaml:5:18: jobs[0].inherit_env: expected `all`, `none` or a list of variable names, found a mapping"), "{got}");

    let redis = "redis:\n  nodes: [\"redis://:${REDIS_PASSWORD}@h1\"]\n";
    let config = ok(&format!(
        "{redis}{JOB}    inherit_env: [PATH, REDIS_PASSWORD]\n"
    ));
    assert_eq!(config.warnings, ["jobs.yaml:7:25: jobs[0].inherit_env[1]: REDIS_PASSWORD is used by the store's settings and is never inherited; name it in the job's `env` to pass it"]);
}

/// The variables that the `redis:` section takes through `${VAR}` are recorded (through aliases too),
/// and those used elsewhere are not.
#[test]
fn secret_env_vars_are_the_redis_sections() {
    let config = ok(&format!("redis:\n  nodes: [\"redis://:${{REDIS_PASSWORD}}@h1\"]\n  key_prefix: \"${{BUCKET}}\"\n{JOB}    env: {{B: \"${{BUCKET}}\"}}\n"));
    let expected = BTreeSet::from(["BUCKET".to_string(), "REDIS_PASSWORD".to_string()]);
    assert_eq!(config.secret_env_vars, expected);
    let config = ok(&format!("{JOB}    env: {{B: \"${{BUCKET}}\"}}\n"));
    assert!(config.secret_env_vars.is_empty());
    // An anchor set in a job and repeated in `redis:` still counts as the store's.
    let text = format!("{JOB}    env: {{URL: &url \"redis://:${{REDIS_PASSWORD}}@h1\"}}\nredis:\n  nodes: [*url]\n");
    let config = ok(&text);
    assert_eq!(
        config.secret_env_vars,
        BTreeSet::from(["REDIS_PASSWORD".to_string()])
    );
}

/// Warnings do not stop the worker: an even node count, a renewal cadence that allows one miss.
#[test]
fn warnings() {
    let config = ok(&format!("redis:\n  nodes: [redis://h1, redis://h2, redis://h3, redis://h4]\nlock:\n  renew_every: 20s\n{JOB}"));
    assert_eq!(config.warnings.len(), 2, "{:?}", config.warnings);
    assert!(config.warnings[0].starts_with("jobs.yaml:2:10: redis.nodes: 4 nodes: a quorum needs 3 of them, so only 1 may fail, no more than with 3 nodes"), "{:?}", config.warnings);
    assert!(
        config.warnings[1].starts_with(
            "jobs.yaml:4:16: lock.renew_every: renew_every (20s) is more than half of ttl (30s)"
        ),
        "{:?}",
        config.warnings
    );
    let config = ok("jobs: []\n");
    assert_eq!(
        config.warnings,
        ["jobs.yaml:1:7: jobs: no jobs: the worker will run but never do anything"]
    );
}

/// A schedule with a wildcard below a restricted time field is warned of with its line and the
/// expression that runs once (`* */15 * * * *` runs 60 times in a row every 15 minutes).
#[test]
fn a_schedule_that_bursts_is_warned_of() {
    let config = ok("jobs:\n  - name: a\n    schedule: \"* */15 * * * *\"\n    command: [\"true\"]\n  - name: b\n    schedule: \"* 30 2 * * *\"\n    command: [\"true\"]\n");
    assert_eq!(config.warnings.len(), 2, "{:?}", config.warnings);
    assert!(
        config.warnings[0].starts_with("jobs.yaml:3:15: jobs[0].schedule: \"* */15 * * * *\" fires every second of each minute it matches (60 runs in a row); to run once at those times, write \"0 */15 * * * *\""),
        "{:?}",
        config.warnings
    );
    assert!(
        config.warnings[1].starts_with("jobs.yaml:6:15: jobs[1].schedule:")
            && config.warnings[1].contains("\"0 30 2 * * *\""),
        "{:?}",
        config.warnings
    );
}

/// Missing required fields are reported at the start of the job, and commands must not be empty.
#[test]
fn missing_fields_and_empty_commands() {
    let problems = problems("jobs:\n  - name: a\n  - schedule: \"* * * * *\"\n    command: []\n");
    let lines: Vec<String> = problems.iter().map(Problem::to_string).collect();
    assert_eq!(
        lines,
        [
            "jobs.yaml:2:5: jobs[0].schedule: missing field `schedule`",
            "jobs.yaml:2:5: jobs[0].command: missing field `command`",
            "jobs.yaml:3:5: jobs[1].name: missing field `name`",
            "jobs.yaml:4:14: jobs[1].command: empty command: give at least the program, e.g. [\"echo\", \"hello\"]",
        ]
    );
    let got =
        only_problem("jobs:\n  - name: a\n    schedule: \"* * * * *\"\n    command: {prog: x}\n");
    assert!(got.starts_with("jobs.yaml:4:14: jobs[0].command: expected a list of arguments or a shell command string, found a mapping"), "{got}");
}

/// Every problem in the file is reported at once, in file order, and `Display` prints one per line.
#[test]
fn all_problems_at_once() {
    let text = "lock:\n  ttl: forever\njobs:\n  - name: a\n    schedule: \"* * * *\"\n    timezone: Mars/Olympus\n    command: [\"true\"]\n    overlap: maybe\n  - name: a\n    schedule: \"@hourly\"\n    command: \"true\"\n    enabled: yes\n";
    let error = parse(text).expect_err("bad file");
    let fields: Vec<&str> = error.problems().iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "lock.ttl",
            "jobs[0].schedule",
            "jobs[0].timezone",
            "jobs[0].overlap",
            "jobs[1].name",
            "jobs[1].enabled"
        ]
    );
    assert_eq!(error.to_string().lines().count(), 6);
    assert!(error
        .to_string()
        .lines()
        .all(|line| line.starts_with("jobs.yaml:")));
}

/// Shapes: a scalar where a mapping belongs, a list where a value belongs, duplicate keys.
#[test]
fn wrong_shapes_and_duplicate_keys() {
    let got = only_problem(&format!("lock: 30s\n{JOB}"));
    assert!(
        got.starts_with("jobs.yaml:1:7: lock: expected a mapping"),
        "{got}"
    );
    let got = only_problem(&format!("lock:\n  ttl: [30s]\n{JOB}"));
    assert!(
        got.starts_with("jobs.yaml:2:8: lock.ttl: expected a single value, found a list"),
        "{got}"
    );
    let got = only_problem(&format!("lock:\n  ttl: 30s\n  ttl: 40s\n{JOB}"));
    assert_eq!(
        got,
        "jobs.yaml:3:3: lock.ttl: duplicate key `ttl` (first given on line 2)"
    );
    let got = only_problem("- a\n- b\n");
    assert!(
        got.starts_with(
            "jobs.yaml:1:1: expected a mapping (`key: value` lines) for the file, found a list"
        ),
        "{got}"
    );
}

/// YAML anchors and aliases work, so common settings can be shared between jobs.
#[test]
fn anchors_and_aliases() {
    let config = ok("jobs:\n  - name: a\n    schedule: \"* * * * *\"\n    command: &cmd [\"echo\", \"hi\"]\n  - name: b\n    schedule: \"@daily\"\n    command: *cmd\n");
    assert_eq!(
        config.jobs[1].command,
        Command::Argv(vec!["echo".into(), "hi".into()])
    );
}

/// An empty file is valid (and warned about); a missing file is a read error naming it.
#[test]
fn empty_and_missing_files() {
    let config = ok("");
    assert!(config.jobs.is_empty());
    assert!(
        config
            .warnings
            .iter()
            .any(|w| w.contains("no `jobs:` list")),
        "{:?}",
        config.warnings
    );
    let error =
        redcron::config::load(Path::new("/nonexistent/jobs.yaml")).expect_err("missing file");
    assert!(
        error
            .to_string()
            .starts_with("/nonexistent/jobs.yaml: cannot read the configuration file"),
        "{error}"
    );
}

/// `worker.listen`: off by default; an IP address and a port; anything else names the line and field.
#[test]
fn listen_address() {
    assert_eq!(ok(JOB).worker.listen, None);
    for address in ["127.0.0.1:9464", "0.0.0.0:9464", "[::]:9464"] {
        let config = ok(&format!("worker:\n  listen: \"{address}\"\n{JOB}"));
        assert_eq!(
            config.worker.listen,
            Some(address.parse().expect("an address"))
        );
    }
    let got = only_problem(&format!("worker:\n  listen: localhost:9464\n{JOB}"));
    assert!(
        got.starts_with("jobs.yaml:2:11: worker.listen: invalid listen address \"localhost:9464\": expected an IP address and a port"),
        "{got}"
    );
    let got = only_problem(&format!("worker:\n  listen: 127.0.0.1:0\n{JOB}"));
    assert!(
        got.contains("port 0 would listen on a random port"),
        "{got}"
    );
    let got = only_problem(&format!("worker:\n  listen: 9464\n{JOB}"));
    assert!(got.starts_with("jobs.yaml:2:11: worker.listen:"), "{got}");
}

/// `history:` and `worker.heartbeat_every`: defaults when absent; bad values name the line and field.
#[test]
fn history_and_heartbeat_settings() {
    let config = ok(JOB);
    assert_eq!(config.history.keep_ticks, 200);
    assert_eq!(config.history.missed_lookback, Duration::from_secs(3600));
    assert_eq!(config.worker.heartbeat_every, Duration::from_secs(5));
    let config = ok(&format!(
        "history:\n  keep_ticks: 50\n  missed_lookback: 10m\nworker:\n  heartbeat_every: 1s\n{JOB}"
    ));
    assert_eq!(config.history.keep_ticks, 50);
    assert_eq!(config.history.missed_lookback, Duration::from_secs(600));
    assert_eq!(config.worker.heartbeat_every, Duration::from_secs(1));
    let got = only_problem(&format!("history:\n  keep_ticks: 0\n{JOB}"));
    assert!(
        got.starts_with("jobs.yaml:2:15: history.keep_ticks: invalid keep_ticks \"0\""),
        "{got}"
    );
    let got = only_problem(&format!("worker:\n  heartbeat_every: 0s\n{JOB}"));
    assert!(
        got.starts_with("jobs.yaml:2:20: worker.heartbeat_every:"),
        "{got}"
    );
}

/// `jitter`: part of the job's definition, the same delay for a (job, tick) wherever it is computed,
/// spread over the whole jitter, and below the misfire grace.
#[test]
fn jitter_is_derived_from_the_job_and_tick() {
    let config = ok(&format!("{JOB}    jitter: 10s\n"));
    let job = &config.jobs[0];
    assert_eq!(job.jitter, Duration::from_secs(10));
    let again = ok(&format!("{JOB}    jitter: 10s\n"));
    let delays: Vec<Duration> = (0..50)
        .map(|i| redcron::schedule::Tick(1_700_000_000_000 + i * 60_000))
        .map(|tick| {
            assert_eq!(job.jitter_for(tick), again.jobs[0].jitter_for(tick));
            job.jitter_for(tick)
        })
        .collect();
    assert!(delays.iter().all(|d| *d < Duration::from_secs(10)));
    assert!(delays.iter().any(|d| *d < Duration::from_secs(3)));
    assert!(delays.iter().any(|d| *d > Duration::from_secs(7)));
    assert_ne!(job.fingerprint(), ok(JOB).jobs[0].fingerprint());
    let got = only_problem(&format!("{JOB}    misfire_grace: 5s\n    jitter: 5s\n"));
    assert!(
        got.contains("jobs[0].jitter: jitter (5s) must be below misfire_grace (5s)"),
        "{got}"
    );
}

/// Alert hooks: `alerts:` gives the defaults, a job's own hooks replace them one by one, and a bad
/// hook names its field.
#[test]
fn alert_hooks_default_and_override() {
    let config = ok(&format!(
        "alerts:\n  on_failure: 'page fail'\n  on_recovery: [page, ok]\n{JOB}    on_failure: [mine]\n  - name: b\n    schedule: \"* * * * *\"\n    command: [\"true\"]\n"
    ));
    let (a, b) = (&config.jobs[0].alerts, &config.jobs[1].alerts);
    assert_eq!(a.on_failure, Some(Command::Argv(vec!["mine".into()])));
    assert_eq!(
        a.on_recovery,
        Some(Command::Argv(vec!["page".into(), "ok".into()]))
    );
    assert_eq!(b.on_failure, Some(Command::Shell("page fail".into())));
    assert!(ok(JOB).jobs[0].alerts.on_failure.is_none());
    let got = only_problem(&format!("{JOB}    on_recovery: []\n"));
    assert!(
        got.starts_with("jobs.yaml:5:18: jobs[0].on_recovery: empty command"),
        "{got}"
    );
}

/// The embedded store's database: `embedded.path` relative to the config file's directory; by default
/// `<key_prefix>.db` in `$STATE_DIRECTORY` (systemd) or beside the config file; always absolute.
#[test]
fn embedded_path_and_its_default() {
    let at = |text: &str, file: &str, env: &dyn Fn(&str) -> Option<String>| {
        let config = parse_with_env(text, Path::new(file), env)
            .unwrap_or_else(|e| panic!("expected a valid config, got:\n{e}"));
        match config.store {
            StoreConfig::Embedded(embedded) => embedded.path,
            other => panic!("expected the embedded store, got {other:?}"),
        }
    };
    let cwd = std::env::current_dir().expect("a working directory");
    let none = |_: &str| None;
    assert_eq!(at(JOB, "jobs.yaml", &none), cwd.join("redcron.db"));
    assert_eq!(
        at(JOB, "/etc/redcron/jobs.yaml", &none),
        Path::new("/etc/redcron/redcron.db")
    );
    let systemd = |name: &str| (name == "STATE_DIRECTORY").then(|| "/var/lib/redcron".to_string());
    assert_eq!(
        at(JOB, "/etc/redcron/jobs.yaml", &systemd),
        Path::new("/var/lib/redcron/redcron.db")
    );
    let given = format!("embedded:\n  path: state/cron.db\n{JOB}");
    assert_eq!(
        at(&given, "/srv/jobs.yaml", &systemd),
        Path::new("/srv/state/cron.db")
    );
    let absolute = format!("embedded: {{path: /data/cron.db}}\n{JOB}");
    assert_eq!(
        at(&absolute, "/srv/jobs.yaml", &none),
        Path::new("/data/cron.db")
    );
    assert!(matches!(
        ok(&format!("redis: {{nodes: [redis://a:1]}}\n{JOB}")).store,
        StoreConfig::Redis(_)
    ));
}

/// `embedded:` with `redis:` is an error at the `embedded` key, and so is a path that names no file.
#[test]
fn embedded_with_redis_or_without_a_file_name_is_rejected() {
    let cases = [
        (
            "redis:\n  nodes: [redis://a:1]\nembedded:\n  path: cron.db\n",
            "jobs.yaml:3:1: embedded: `embedded:` and `redis:` cannot both be given",
        ),
        (
            "embedded:\n  path: /var/lib/\n",
            "jobs.yaml:2:9: embedded.path: invalid path",
        ),
        (
            "embedded:\n  file: cron.db\n",
            "jobs.yaml:2:3: embedded.file: unknown field",
        ),
    ];
    for (section, expected) in cases {
        let got = only_problem(&format!("{section}{JOB}"));
        assert!(got.starts_with(expected), "{got}");
    }
}

/// Two store sections are one error, at the second, that names both and the line of the first; three
/// are two errors.
#[test]
fn a_second_store_section_names_the_first_and_its_line() {
    let got = only_problem(&format!(
        "etcd:\n  endpoints: [http://b:2379]\nembedded:\n  path: cron.db\n{JOB}"
    ));
    assert!(
        got.starts_with("jobs.yaml:3:1: embedded: `embedded:` and `etcd:` cannot both be given: workers claim ticks in one store, and `etcd:` (line 1) names it"),
        "{got}"
    );
    let all = "redis:\n  nodes: [redis://a:1]\netcd:\n  endpoints: [http://b:2379]\nembedded: {path: x.db}\n";
    let problems = problems(&format!("{all}{JOB}"));
    let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(fields, ["etcd", "embedded"]);
    assert!(
        problems
            .iter()
            .all(|p| p.message.contains("`redis:` (line 1)")),
        "{problems:?}"
    );
}

/// `etcd:` as etcd's clients write it: endpoints, user and password (`${VAR}` kept from jobs), TLS files
/// relative to the config file; the node timeout defaults to 500 ms, and the key prefix may hold `/`.
#[test]
fn etcd_section_reads_back() {
    let config = ok(&format!(
        "etcd:\n  endpoints: [https://10.0.0.1:2379, \"https://etcd-2:2379\"]\n  key_prefix: /redcron/prod\n  \
         username: cron\n  password: \"${{REDIS_PASSWORD}}\"\n  trusted_ca_file: tls/ca.pem\n  \
         cert_file: /etc/etcd/client.pem\n  key_file: /etc/etcd/client-key.pem\n{JOB}"
    ));
    let StoreConfig::Etcd(etcd) = &config.store else {
        panic!("expected an etcd store, got {:?}", config.store)
    };
    assert_eq!(
        etcd.endpoints,
        ["https://10.0.0.1:2379", "https://etcd-2:2379"]
    );
    assert_eq!(etcd.user, Some(("cron".to_string(), "s3cret".to_string())));
    let ca = etcd.trusted_ca_file.as_ref().expect("a CA file");
    assert!(ca.is_absolute() && ca.ends_with("tls/ca.pem"), "{ca:?}");
    assert!(etcd.client_identity.is_some());
    assert_eq!(config.lock.key_prefix, "/redcron/prod");
    assert_eq!(config.lock.node_timeout, Duration::from_millis(500));
    assert_eq!(
        config.secret_env_vars,
        BTreeSet::from(["REDIS_PASSWORD".to_string()])
    );
}

/// One store per config, and each etcd setting checked with its line, column and field.
#[test]
fn etcd_section_problems_name_their_field() {
    let cases = [
        (
            "redis:\n  nodes: [redis://a:1]\netcd:\n  endpoints: [http://b:2379]\n",
            "jobs.yaml:3:1: etcd: `etcd:` and `redis:` cannot both be given",
        ),
        (
            "etcd:\n  endpoints: [http://b:2379]\nembedded:\n  path: cron.db\n",
            "jobs.yaml:3:1: embedded: `embedded:` and `etcd:` cannot both be given",
        ),
        (
            "etcd:\n  key_prefix: x\n",
            "jobs.yaml:1:1: etcd.endpoints: missing field",
        ),
        (
            "etcd:\n  endpoints: [http://b]\n",
            "jobs.yaml:2:15: etcd.endpoints[0]: invalid etcd endpoint \"http://b\": missing port",
        ),
        (
            "etcd:\n  endpoints: [http://b:1, \"b:1\"]\n",
            "jobs.yaml:2:27: etcd.endpoints[1]: b:1 is already etcd.endpoints[0]",
        ),
        (
            "etcd:\n  endpoints: [http://b:1, https://c:1]\n",
            "jobs.yaml:2:14: etcd.endpoints: endpoints mix http:// and https://",
        ),
        (
            "etcd:\n  endpoints: [http://b:1]\n  trusted_ca_file: ca.pem\n",
            "jobs.yaml:3:20: etcd.trusted_ca_file: trusted_ca_file needs https:// endpoints",
        ),
        (
            "etcd:\n  endpoints: [https://b:1]\n  cert_file: c.pem\n",
            "jobs.yaml:3:14: etcd.cert_file: missing `key_file`",
        ),
        (
            "etcd:\n  endpoints: [https://b:1]\n  password: x\n",
            "jobs.yaml:3:13: etcd.password: missing `username`",
        ),
        (
            "etcd:\n  endpoints: [http://b:1]\n  key_prefix: \"{x}\"\n",
            "jobs.yaml:3:15: etcd.key_prefix: invalid key_prefix",
        ),
        (
            "etcd:\n  endpoints: [http://b:1]\n  user: x\n",
            "jobs.yaml:3:3: etcd.user: unknown field",
        ),
    ];
    let wrong: Vec<String> = cases
        .iter()
        .map(|(section, expected)| (only_problem(&format!("{section}{JOB}")), expected))
        .filter(|(got, expected)| !got.starts_with(*expected))
        .map(|(got, expected)| format!("got      {got}\nexpected {expected}"))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `postgres:` and `mysql:` read back as written, files relative to the config file and made absolute;
/// the URL's `${VAR}` is the store's (kept from jobs), the node timeout defaults as etcd's (a commit is an
/// fsync on the server), and the key prefix names tables.
#[test]
fn sql_sections_read_back() {
    let config = ok(&format!(
        "postgres:\n  url: \"postgres://cron:${{SQL_PASSWORD}}@db.example:5432/redcron\"\n  key_prefix: cron_prod\n  \
         tls: verify-full\n  ca_file: tls/ca.pem\n  cert_file: /etc/redcron/client.pem\n  key_file: tls/client.key\n  \
         pool_size: 16\n{JOB}    env: {{B: \"${{BUCKET}}\"}}\n"
    ));
    let absolute = |path: &str| std::path::absolute(path).expect("an absolute path");
    let expected = SqlConfig {
        dialect: SqlDialect::Postgres,
        url: "postgres://cron:pg-s3cret@db.example:5432/redcron".to_string(),
        tls: SqlTls::VerifyFull,
        ca_file: Some(absolute("tls/ca.pem")),
        client_identity: Some(("/etc/redcron/client.pem".into(), absolute("tls/client.key"))),
        pool_size: 16,
    };
    assert_eq!(config.store, StoreConfig::Sql(expected));
    assert_eq!(config.lock.key_prefix, "cron_prod");
    assert_eq!(config.lock.node_timeout, Duration::from_millis(500));
    // The job inherits everything but the password's variable (`inherit_env: all` less these).
    assert_eq!(
        config.secret_env_vars,
        BTreeSet::from(["SQL_PASSWORD".to_string()])
    );
    assert_eq!(config.jobs[0].inherit_env, InheritEnv::All);

    let config = ok(&format!(
        "mysql:\n  url: mariadb://db/cron\nlock:\n  ttl: 2s\n{JOB}"
    ));
    let expected = SqlConfig {
        dialect: SqlDialect::Mysql,
        url: "mariadb://db/cron".to_string(),
        tls: SqlTls::Prefer,
        ca_file: None,
        client_identity: None,
        pool_size: SqlConfig::DEFAULT_POOL_SIZE,
    };
    assert_eq!(config.store, StoreConfig::Sql(expected));
    assert_eq!(config.lock.key_prefix, "redcron");
    // 500 ms, capped at ttl/10.
    assert_eq!(config.lock.node_timeout, Duration::from_millis(200));
    assert!(config.secret_env_vars.is_empty());
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

/// The `url` values each check refuses, under `postgres:` (or `mysql:`), with the start of the message:
/// each is reported at the URL with its field, and none shows the password (`hunter2`).
const BAD_SQL_URLS: &[(&str, &str, &str)] = &[
    (
        "postgres",
        "db.example/cron",
        "invalid PostgreSQL URL: expected postgres://",
    ),
    (
        "postgres",
        "mysql://u:hunter2@h/cron",
        "invalid PostgreSQL URL mysql://u:***@h/cron: mysql:// is a MySQL URL: write it under `mysql:` instead of `postgres:`",
    ),
    (
        "mysql",
        "postgresql://u:hunter2@h/cron",
        "invalid MySQL URL postgresql://u:***@h/cron: postgresql:// is a PostgreSQL URL: write it under `postgres:`",
    ),
    (
        "postgres",
        "u:hunter2@h://cron",
        "invalid PostgreSQL URL: no scheme; use postgres:// or postgresql://",
    ),
    (
        "postgres",
        "redis://u:hunter2@h/cron",
        "invalid PostgreSQL URL redis://u:***@h/cron: scheme redis:// is not supported; use postgres:// or postgresql://",
    ),
    (
        "postgres",
        "postgres://u:hunter2@/cron",
        "invalid PostgreSQL URL postgres://u:***@/cron: missing host",
    ),
    (
        "mysql",
        "mysql://u:hunter2@h:3306",
        "invalid MySQL URL mysql://u:***@h:3306: missing database",
    ),
    (
        "postgres",
        "postgres://u:hunter2@h/cron/x",
        "invalid PostgreSQL URL postgres://u:***@h/cron/x: database \"cron/x\" has more than one path segment",
    ),
    (
        "postgres",
        "postgres://u:hunter2@h:0/cron",
        "invalid PostgreSQL URL postgres://u:***@h:0/cron: invalid port \"0\": expected a number from 1 to 65535, or none for 5432",
    ),
    (
        "mysql",
        "mysql://u:hunter2@h:99999/cron",
        "invalid MySQL URL mysql://u:***@h:99999/cron: invalid port \"99999\": expected a number from 1 to 65535, or none for 3306",
    ),
    (
        "postgres",
        "postgres://u:hunter2@h/cron?sslmode=require&password=hunter2",
        "invalid PostgreSQL URL postgres://u:***@h/cron: a query string (`?...`) is not read: set TLS with the fields `tls`, `ca_file`",
    ),
    (
        "mysql",
        "mysql://u:hunter2@h/cron#hunter2",
        "invalid MySQL URL mysql://u:***@h/cron: a fragment (`#...`) is not read",
    ),
    (
        "postgres",
        "postgres://u:hunter2/x@h/cron",
        "invalid PostgreSQL URL postgres://u:***@h/cron: an `@` after a `/`, `?` or `#`: percent-encode",
    ),
];

/// Each bad URL is one problem at `<section>.url`, with its line and column, and no password.
#[test]
fn bad_sql_urls_name_their_field_and_hide_the_password() {
    for (section, url, expected) in BAD_SQL_URLS {
        let got = only_problem(&format!("{section}:\n  url: \"{url}\"\n{JOB}"));
        let expected = format!("jobs.yaml:2:8: {section}.url: {expected}");
        assert!(
            got.starts_with(&expected),
            "got      {got}\nexpected {expected}"
        );
        assert!(!got.contains("hunter2"), "{got}");
    }
}

/// `redcron check` on each bad URL, the password given through `${VAR}`: exit 2, the problem's
/// `file:line:column: field:`, and the password nowhere in the output.
#[test]
fn check_refuses_bad_sql_urls_with_exit_2_and_no_password() {
    use crate::cli::{output, redcron};
    for (section, url, expected) in BAD_SQL_URLS {
        let dir = crate::support::TestDir::new();
        let url = url.replace("hunter2", "${SQL_PASSWORD}");
        dir.write("jobs.yaml", format!("{section}:\n  url: \"{url}\"\n{JOB}"));
        let mut command = redcron(dir.path());
        command.arg("check").env("SQL_PASSWORD", "hunter2");
        let (code, stdout, stderr) = output(&mut command);
        assert_eq!(code, 2, "{url}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        let prefix = format!("jobs.yaml:2:8: {section}.url: ");
        assert!(
            stderr.lines().any(|line| line.starts_with(&prefix)),
            "no line starting with {prefix:?} ({expected}) in:\n{stderr}"
        );
        assert!(
            !stdout.contains("hunter2") && !stderr.contains("hunter2"),
            "{stderr}"
        );
    }
}

/// `redcron check` names the SQL store, its database, TLS mode and pool, with the password redacted.
#[test]
fn check_prints_the_sql_store_without_its_password() {
    use crate::cli::{output, redcron};
    let dir = crate::support::TestDir::new();
    let yaml = format!("postgres:\n  url: \"postgres://cron:${{SQL_PASSWORD}}@db.example:5432/redcron\"\n  tls: require\n{JOB}");
    dir.write("jobs.yaml", yaml);
    let (code, stdout, stderr) = output(
        redcron(dir.path())
            .arg("check")
            .env("SQL_PASSWORD", "hunter2"),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.lines().any(|line| line
            == "store: PostgreSQL, database postgres://cron:***@db.example:5432/redcron (TLS require, a pool of 8 connections)"),
        "{stdout}"
    );
    assert!(stdout.contains("key prefix redcron"), "{stdout}");
    assert!(
        !stdout.contains("hunter2") && !stderr.contains("hunter2"),
        "{stdout}{stderr}"
    );
}

/// Every other setting of a SQL section checked with its line, column and field; one store per config.
#[test]
fn sql_section_problems_name_their_field() {
    let url = "  url: postgres://h/cron\n";
    let cases = [
        (
            "postgres:\n  pool_size: 4\n".to_string(),
            "jobs.yaml:1:1: postgres.url: missing field `url`",
        ),
        (
            format!("postgres:\n{url}  password: x\n"),
            "jobs.yaml:3:3: postgres.password: unknown field `password`; expected one of `url`, `key_prefix`, `tls`, `ca_file`, `cert_file`, `key_file`, `pool_size`",
        ),
        (
            format!("postgres:\n{url}  tls: verify\n"),
            "jobs.yaml:3:8: postgres.tls: invalid tls \"verify\": expected disable, prefer, require, verify-ca or verify-full",
        ),
        (
            format!("postgres:\n{url}  tls: true\n"),
            "jobs.yaml:3:8: postgres.tls: invalid tls \"true\"",
        ),
        (
            format!("postgres:\n{url}  pool_size: 0\n"),
            "jobs.yaml:3:14: postgres.pool_size: invalid pool_size \"0\": expected a whole number from 1 to 64",
        ),
        (
            "mysql:\n  url: mysql://h/cron\n  pool_size: 65\n".to_string(),
            "jobs.yaml:3:14: mysql.pool_size: invalid pool_size \"65\"",
        ),
        (
            format!("postgres:\n{url}  pool_size: many\n"),
            "jobs.yaml:3:14: postgres.pool_size: invalid pool_size \"many\"",
        ),
        (
            format!("postgres:\n{url}  cert_file: c.pem\n"),
            "jobs.yaml:3:14: postgres.cert_file: missing `key_file`: a client certificate needs its key",
        ),
        (
            "mysql:\n  url: mysql://h/cron\n  key_file: k.pem\n".to_string(),
            "jobs.yaml:3:13: mysql.key_file: missing `cert_file`",
        ),
        (
            format!("postgres:\n{url}  tls: disable\n  ca_file: ca.pem\n"),
            "jobs.yaml:4:12: postgres.ca_file: ca_file needs TLS: with tls: disable the connection does not use TLS",
        ),
        (
            format!("postgres:\n{url}  ca_file: ca.pem\n"),
            "jobs.yaml:3:12: postgres.ca_file: ca_file is not used with tls: prefer (the default), which does not check the server's certificate: verify-ca or verify-full checks the certificate against ca_file",
        ),
        (
            format!("postgres:\n{url}  tls: require\n  ca_file: ca.pem\n"),
            "jobs.yaml:4:12: postgres.ca_file: ca_file is not used with tls: require,",
        ),
        (
            format!("postgres:\n{url}  key_prefix: red-cron\n"),
            "jobs.yaml:3:15: postgres.key_prefix: invalid key_prefix \"red-cron\": it begins the table names",
        ),
        (
            format!("mysql:\n  url: mysql://h/cron\n  key_prefix: {}\n", "c".repeat(41)),
            "jobs.yaml:3:15: mysql.key_prefix: key_prefix \"ccccccccccccccccccccccccccccccccccccccccc\" has 41 characters, more than 40",
        ),
        (
            format!("redis:\n  nodes: [redis://a:1]\npostgres:\n{url}"),
            "jobs.yaml:3:1: postgres: `postgres:` and `redis:` cannot both be given",
        ),
        (
            format!("postgres:\n{url}mysql:\n  url: mysql://h/cron\n"),
            "jobs.yaml:3:1: mysql: `mysql:` and `postgres:` cannot both be given",
        ),
        (
            "mysql:\n  url: mysql://h/cron\nembedded:\n  path: cron.db\n".to_string(),
            "jobs.yaml:3:1: embedded: `embedded:` and `mysql:` cannot both be given",
        ),
    ];
    let wrong: Vec<String> = cases
        .iter()
        .map(|(section, expected)| (only_problem(&format!("{section}{JOB}")), expected))
        .filter(|(got, expected)| !got.starts_with(*expected))
        .map(|(got, expected)| format!("got      {got}\nexpected {expected}"))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // With TLS on, every file is taken; a verifying mode takes the CA.
    let config = ok(&format!(
        "postgres:\n{url}  tls: verify-ca\n  ca_file: ca.pem\n{JOB}"
    ));
    let StoreConfig::Sql(sql) = &config.store else {
        panic!("expected a SQL store, got {:?}", config.store)
    };
    assert_eq!(sql.tls, SqlTls::VerifyCa);
    assert!(sql.ca_file.as_ref().is_some_and(|ca| ca.is_absolute()));
}

/// A SQL store keeps job names in indexed key columns of bounded width: a name longer than the store takes
/// is a config error at the name, not a claim the database refuses at every tick; other stores take it.
#[test]
fn a_job_name_too_long_for_a_sql_store_is_refused_at_the_name() {
    let name = "j".repeat(201);
    let job =
        format!("jobs:\n  - name: {name}\n    schedule: \"* * * * *\"\n    command: [\"true\"]\n");
    let problem = only_problem(&format!("postgres:\n  url: postgres://h/cron\n{job}"));
    assert!(
        problem.starts_with("jobs.yaml:4:11: jobs[0].name: a job name of 201 characters: a SQL store takes at most 200"),
        "{problem}"
    );
    ok(&format!("redis:\n  nodes: [\"redis://h:6379\"]\n{job}"));
}

/// A node of `redis.nodes` may be a Sentinel group: its fields read back (passwords from `${VAR}`),
/// servers and groups mix, and a group's `Debug` and label show no password.
#[test]
fn sentinel_groups_read_back_and_mix_with_servers() {
    let config = ok(&format!(
        "redis:\n  nodes:\n    - sentinels: [10.0.0.1:26379, \"10.0.0.2\", \"[::1]:5000\"]\n      master: mymaster\n      password: ${{REDIS_PASSWORD}}\n      sentinel_password: ${{SQL_PASSWORD}}\n      username: app\n      db: 2\n      min_replicas_acked: 2\n    - redis://h2:6379\n    - {{sentinels: [s3:1], master: other, tls: true}}\n{JOB}"
    ));
    let StoreConfig::Redis(redis) = &config.store else {
        panic!("expected a Redis store, got {:?}", config.store)
    };
    assert_eq!(redis.nodes.len(), 3);
    let RedisNode::Sentinel(group) = &redis.nodes[0] else {
        panic!("expected a group, got {:?}", redis.nodes[0])
    };
    assert_eq!(group.master, "mymaster");
    assert_eq!(
        group.sentinels,
        ["10.0.0.1:26379", "10.0.0.2:26379", "[::1]:5000"]
    );
    assert_eq!(group.password.as_deref(), Some("s3cret"));
    assert_eq!(group.sentinel_password.as_deref(), Some("pg-s3cret"));
    assert_eq!(group.username.as_deref(), Some("app"));
    assert_eq!(
        (group.db, group.min_replicas_acked, group.tls),
        (2, ReplicaAcks::Exactly(2), false)
    );
    let shown = format!("{group:?} {}", redis.nodes[0].label());
    assert!(!shown.contains("s3cret"), "{shown}");
    assert_eq!(
        redis.nodes[0].label(),
        "sentinel://mymaster@10.0.0.1:26379,10.0.0.2:26379,[::1]:5000"
    );
    let RedisNode::Sentinel(other) = &redis.nodes[2] else {
        panic!("expected a group, got {:?}", redis.nodes[2])
    };
    assert_eq!(
        (other.tls, other.min_replicas_acked, other.db),
        (true, ReplicaAcks::All, 0)
    );
    assert_eq!(redis.nodes[1], RedisNode::Server("redis://h2:6379".into()));
}

/// A group's mistakes name the file, line and field; a group listed twice is refused; 0 replicas acked
/// is a warning that says what it costs.
#[test]
fn bad_sentinel_groups() {
    let got = only_problem(&format!(
        "redis:\n  nodes:\n    - {{sentinels: [h1:26379]}}\n{JOB}"
    ));
    assert!(
        got.starts_with("jobs.yaml:3:7: redis.nodes[0].master: missing field `master`"),
        "{got}"
    );
    let got = only_problem(&format!("redis:\n  nodes:\n    - {{master: m}}\n{JOB}"));
    assert!(
        got.contains("redis.nodes[0].sentinels: missing field `sentinels`"),
        "{got}"
    );
    let got = only_problem(&format!(
        "redis:\n  nodes:\n    - {{sentinels: [\"redis://:pw@h1:1\"], master: m}}\n{JOB}"
    ));
    assert!(
        got.starts_with("jobs.yaml:3:20: redis.nodes[0].sentinels[0]: invalid Sentinel address \"***@h1:1\": expected host:port"),
        "{got}"
    );
    assert!(!got.contains("pw"), "{got}");
    let got = only_problem(&format!(
        "redis:\n  nodes:\n    - {{sentinels: [h1], master: \"a b\"}}\n{JOB}"
    ));
    assert!(
        got.contains("redis.nodes[0].master: invalid master name"),
        "{got}"
    );
    let got = only_problem(&format!(
        "redis:\n  nodes:\n    - {{sentinels: [h1], master: m, colour: red}}\n{JOB}"
    ));
    assert!(got.contains("unknown field `colour`"), "{got}");
    let got = only_problem(&format!(
        "redis:\n  nodes:\n    - {{sentinels: [h1], master: m, min_replicas_acked: many}}\n{JOB}"
    ));
    assert!(
        got.contains("redis.nodes[0].min_replicas_acked: invalid min_replicas_acked \"many\""),
        "{got}"
    );
    let got = only_problem(&format!(
        "redis:\n  nodes:\n    - {{sentinels: [h1, h2], master: m}}\n    - {{sentinels: [h2], master: m}}\n    - redis://h3\n{JOB}"
    ));
    assert!(
        got.starts_with("jobs.yaml:4:7: redis.nodes[1]: master m of the Sentinel at h2:26379 is already redis.nodes[0]"),
        "{got}"
    );
    let config = ok(&format!(
        "redis:\n  nodes:\n    - {{sentinels: [h1], master: m, min_replicas_acked: 0}}\n{JOB}"
    ));
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    assert!(
        config.warnings[0].contains("min_replicas_acked: 0: the master's answer counts alone"),
        "{:?}",
        config.warnings
    );
}

/// `redis.ca_file`, `cert_file` and `key_file` read back relative to the config file's directory; they
/// need a TLS node, and a certificate needs its key — each mistake named at its line and field.
#[test]
fn redis_tls_files_resolve_beside_the_config_and_need_a_tls_node() {
    let config = parse_with_env(
        &format!(
            "redis:\n  nodes: [rediss://h1:6380, {{sentinels: [s1], master: m, tls: true}}, redis://h3]\n  ca_file: certs/ca.pem\n  cert_file: /etc/redcron/client.pem\n  key_file: client-key.pem\n{JOB}"
        ),
        Path::new("/srv/redcron/jobs.yaml"),
        &env,
    )
    .unwrap_or_else(|e| panic!("expected a valid config, got:\n{e}"));
    let StoreConfig::Redis(redis) = &config.store else {
        panic!("expected a Redis store, got {:?}", config.store)
    };
    assert_eq!(
        redis.tls.ca_file.as_deref(),
        Some(Path::new("/srv/redcron/certs/ca.pem"))
    );
    assert_eq!(
        redis.tls.client_identity,
        Some((
            "/etc/redcron/client.pem".into(),
            "/srv/redcron/client-key.pem".into()
        ))
    );

    let got = only_problem(&format!(
        "redis:\n  nodes: [redis://h1, redis://h2, redis://h3]\n  ca_file: ca.pem\n{JOB}"
    ));
    assert!(
        got.starts_with("jobs.yaml:3:12: redis.ca_file: ca_file needs a TLS node: no node is a rediss:// URL or a group with `tls: true`"),
        "{got}"
    );
    let got = only_problem(&format!(
        "redis:\n  nodes: [rediss://h1]\n  cert_file: client.pem\n{JOB}"
    ));
    assert!(
        got.starts_with("jobs.yaml:3:14: redis.cert_file: missing `key_file`: a client certificate needs its key"),
        "{got}"
    );
    let got = only_problem(&format!(
        "redis:\n  nodes: [rediss://h1]\n  ca_file: \"\"\n{JOB}"
    ));
    assert!(got.contains("redis.ca_file: an empty file name"), "{got}");
}

/// `redis.cluster` reads back as the store's one node, its password kept for the connections and not in
/// its label; `min_replicas_acked` defaults to `all` and belongs to it.
#[test]
fn a_redis_cluster_reads_back_as_the_stores_one_node() {
    let config = ok(&format!(
        "redis:\n  cluster: [\"redis://:${{REDIS_PASSWORD}}@10.0.0.1:7000\", redis://10.0.0.2:7000]\n{JOB}"
    ));
    let StoreConfig::Redis(redis) = &config.store else {
        panic!("expected a Redis store, got {:?}", config.store)
    };
    let [RedisNode::Cluster(cluster)] = redis.nodes.as_slice() else {
        panic!("expected one cluster node, got {:?}", redis.nodes)
    };
    assert_eq!(cluster.seeds[0], "redis://:s3cret@10.0.0.1:7000");
    assert_eq!(cluster.min_replicas_acked, ReplicaAcks::All);
    assert_eq!(cluster.label(), "cluster://10.0.0.1:7000,10.0.0.2:7000");

    let config = ok(&format!(
        "redis:\n  cluster: [redis://10.0.0.1:7000]\n  min_replicas_acked: 2\n{JOB}"
    ));
    let StoreConfig::Redis(redis) = &config.store else {
        panic!("expected a Redis store")
    };
    assert!(
        matches!(&redis.nodes[..], [RedisNode::Cluster(c)] if c.min_replicas_acked == ReplicaAcks::Exactly(2)),
        "{:?}",
        redis.nodes
    );
    assert!(
        config.warnings[0].contains("redis.min_replicas_acked: 2:"),
        "{:?}",
        config.warnings
    );
}

/// Each mistake in `redis.cluster` is named at its line and field, a seed's password hidden.
#[test]
fn redis_cluster_problems_name_their_field() {
    let cases = [
        (
            "redis:\n  cluster: [redis://a:1]\n  nodes: [redis://b:1]\n",
            "jobs.yaml:3:10: redis.nodes: `nodes` and `cluster` are alternatives",
        ),
        (
            "redis:\n  cluster: []\n",
            "jobs.yaml:2:12: redis.cluster: no seeds",
        ),
        (
            "redis:\n  cluster: [\"redis://:pw@a:1/2\"]\n",
            "jobs.yaml:2:13: redis.cluster[0]: invalid seed URL redis://:***@a:1/2: database 2: a Redis Cluster has only database 0",
        ),
        (
            "redis:\n  cluster: [redis://a:1, \"redis://A:1\"]\n",
            "jobs.yaml:2:26: redis.cluster[1]: invalid seed URL redis://A:1: a:1 is listed twice",
        ),
        (
            "redis:\n  cluster: [redis://a:1, rediss://b:1]\n",
            "jobs.yaml:2:12: redis.cluster: some seeds are rediss:// and some redis://",
        ),
        (
            "redis:\n  cluster: [http://a:1]\n",
            "jobs.yaml:2:13: redis.cluster[0]: invalid seed URL",
        ),
        (
            "redis:\n  nodes: [redis://a:1]\n  min_replicas_acked: 1\n",
            "jobs.yaml:3:23: redis.min_replicas_acked: only for `cluster`",
        ),
        (
            "redis:\n  cluster: [redis://a:1]\n  min_replicas_acked: some\n",
            "jobs.yaml:3:23: redis.min_replicas_acked: invalid min_replicas_acked \"some\"",
        ),
    ];
    let wrong: Vec<String> = cases
        .iter()
        .map(|(section, expected)| (only_problem(&format!("{section}{JOB}")), expected))
        .filter(|(got, expected)| !got.starts_with(*expected) || got.contains("pw@"))
        .map(|(got, expected)| format!("got      {got}\nexpected {expected}"))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
