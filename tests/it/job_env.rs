//! A job's environment, end to end: what of the worker's environment a child inherits (`inherit_env`),
//! and that the lock store's password never reaches a job that did not ask for it by name.
//!
//! Each job writes its whole environment (`env`) to a file in the test directory; the assertions read
//! those files and the worker's own output.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::{RedisCluster, TestDir, Worker};

/// A job every second that writes its environment to `<name>.env` (and, if `echo`, to its stdout too),
/// with `extra` lines (already indented) added to its entry.
fn env_job(name: &str, extra: &str, echo: bool) -> String {
    let echo = if echo { "; env" } else { "" };
    format!("  - name: {name}\n    schedule: \"* * * * * *\"\n    command: 'env > {name}.env{echo}'\n{extra}")
}

/// Waits for a run of `job` to finish and returns the environment it wrote, by name.
fn environment_of(worker: &Worker, dir: &TestDir, job: &str) -> BTreeMap<String, String> {
    let finished = worker
        .wait_for(Duration::from_secs(15), |e| {
            e["event"] == "run.finished" && e["job"] == job
        })
        .unwrap_or_else(|| panic!("{job} did not run"));
    assert_eq!(finished["outcome"], "success", "{finished}");
    let text = dir
        .read(format!("{job}.env"))
        .unwrap_or_else(|| panic!("{job} wrote no environment"));
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

const REDCRON_VARS: [&str; 6] = [
    "REDCRON_ATTEMPT",
    "REDCRON_JOB",
    "REDCRON_TICK",
    "REDCRON_FENCING_TOKEN",
    "REDCRON_RUN_ID",
    "REDCRON_WORKER_ID",
];

/// `inherit_env: all` (the default) passes the worker's environment; `none` passes only the job's `env`
/// and `REDCRON_*`; a list passes only the variables it names. The job's `env` and `REDCRON_*` always
/// come on top.
#[test]
fn inherit_env_all_none_and_a_list() {
    let dir = TestDir::new();
    let jobs = env_job("all", "    env: {JOBENV_B: from-job}\n", false)
        + &env_job(
            "none",
            "    inherit_env: none\n    env: {OWN: mine}\n",
            false,
        )
        + &env_job("list", "    inherit_env: [JOBENV_A, PATH]\n", false);
    let path = dir.write_config(&format!("worker:\n  id: env-test\njobs:\n{jobs}"));
    let worker = Worker::builder(&path)
        .env("JOBENV_A", "from-worker-a")
        .env("JOBENV_B", "from-worker-b")
        .spawn();

    let all = environment_of(&worker, &dir, "all");
    assert_eq!(
        all.get("JOBENV_A").map(String::as_str),
        Some("from-worker-a")
    );
    assert_eq!(all.get("JOBENV_B").map(String::as_str), Some("from-job"));
    assert!(all.contains_key("PATH"), "{all:?}");
    assert_eq!(all.get("REDCRON_JOB").map(String::as_str), Some("all"));

    let none = environment_of(&worker, &dir, "none");
    assert_eq!(none.get("OWN").map(String::as_str), Some("mine"));
    for name in REDCRON_VARS {
        assert!(none.contains_key(name), "{name} missing: {none:?}");
    }
    assert_eq!(
        none.get("REDCRON_WORKER_ID").map(String::as_str),
        Some("env-test")
    );
    // `/bin/sh` exports PWD by itself; nothing else may be there.
    let unexpected: Vec<&String> = none
        .keys()
        .filter(|name| !(*name == "OWN" || *name == "PWD" || REDCRON_VARS.contains(&name.as_str())))
        .collect();
    assert!(unexpected.is_empty(), "inherited {unexpected:?}: {none:?}");

    let list = environment_of(&worker, &dir, "list");
    assert_eq!(
        list.get("JOBENV_A").map(String::as_str),
        Some("from-worker-a")
    );
    assert!(!list.contains_key("JOBENV_B"), "{list:?}");
    assert!(!list.contains_key("HOME"), "{list:?}");
    assert!(list.contains_key("PATH"), "{list:?}");
    assert_eq!(list.get("REDCRON_JOB").map(String::as_str), Some("list"));
}

/// Nodes that require a password given as `${REDIS_PASSWORD}`: a job does not inherit the variable,
/// not even when `inherit_env` lists it (a warning says so), and gets it when its `env` names it; the
/// password appears nowhere in the worker's output, though a job prints its whole environment there.
#[test]
fn store_password_is_kept_from_jobs() {
    let password = format!("pw-{:08x}", rand::random::<u32>());
    let cluster = RedisCluster::builder().nodes(3).password(&password).start();
    let dir = TestDir::new();
    let nodes = (0..cluster.len())
        .map(|i| {
            format!(
                "\"redis://:${{REDIS_PASSWORD}}@127.0.0.1:{}\"",
                cluster.port(i)
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let jobs = env_job("plain", "", true)
        + &env_job(
            "given",
            "    env: {REDIS_PASSWORD: \"${REDIS_PASSWORD}\"}\n",
            false,
        )
        + &env_job("listed", "    inherit_env: [REDIS_PASSWORD, PATH]\n", true);
    let path = dir.write_config(&format!(
        "redis:\n  nodes: [{nodes}]\nworker:\n  id: secretive\njobs:\n{jobs}"
    ));
    let worker = Worker::builder(&path)
        .env("REDIS_PASSWORD", &password)
        .spawn();

    let plain = environment_of(&worker, &dir, "plain");
    assert!(!plain.contains_key("REDIS_PASSWORD"), "{plain:?}");
    assert!(
        plain.contains_key("PATH"),
        "the rest is inherited: {plain:?}"
    );
    let given = environment_of(&worker, &dir, "given");
    assert_eq!(given.get("REDIS_PASSWORD"), Some(&password), "named in env");
    let listed = environment_of(&worker, &dir, "listed");
    assert!(!listed.contains_key("REDIS_PASSWORD"), "{listed:?}");
    assert!(listed.contains_key("PATH"), "{listed:?}");

    let warned = worker.logs().into_iter().any(|event| {
        event["level"] == "WARN"
            && event
                .to_string()
                .contains("REDIS_PASSWORD is used by the store")
    });
    assert!(warned, "no warning about listing the store's variable");
    let printed = worker.events("run.output");
    assert!(
        printed.iter().any(|e| e["job"] == "plain"),
        "the plain job printed its environment"
    );
    let (stdout, stderr) = (worker.lines().join("\n"), worker.stderr());
    assert!(
        !stdout.contains(&password),
        "password in the worker's stdout"
    );
    assert!(
        !stderr.contains(&password),
        "password in the worker's stderr"
    );
}

/// A worker run as an unprivileged user, with the store's password in its environment: a job of that
/// user (`inherit_env: none`) that reads its parent's `/proc/<pid>/environ` (the worker's) gets nothing,
/// and cannot attach to it either; the job runs, and its parent is the worker.
#[test]
fn jobs_cannot_read_the_workers_environment() {
    use std::os::unix::fs::PermissionsExt as _;
    let password = format!("pw-{:08x}", rand::random::<u32>());
    let cluster = RedisCluster::builder().nodes(1).password(&password).start();
    let dir = TestDir::new();
    // The worker and its job run as `nobody`: the directory is theirs to write in.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
        .expect("chmod the test directory");
    let node = format!(
        "\"redis://:${{REDIS_PASSWORD}}@127.0.0.1:{}\"",
        cluster.port(0)
    );
    let command = "echo $PPID > ppid; cat /proc/$PPID/environ > stolen 2> denied; \
                   cat /proc/$PPID/task/$PPID/environ >> stolen 2>> denied; echo tried > tried";
    let path = dir.write_config(&format!(
        "redis:\n  nodes: [{node}]\nworker:\n  id: unprivileged\njobs:\n  - name: thief\n    \
         schedule: \"* * * * * *\"\n    inherit_env: none\n    command: '{command}'\n"
    ));
    let worker = Worker::builder(&path)
        .env("REDIS_PASSWORD", &password)
        .user(65534, 65534)
        .spawn();
    let finished = worker
        .wait_for(Duration::from_secs(20), |e| {
            e["event"] == "run.finished" && e["job"] == "thief"
        })
        .expect("the job ran");
    assert_eq!(finished["outcome"], "success", "{finished}");
    assert_eq!(dir.read("tried").as_deref(), Some("tried\n"));
    let parent = dir.read("ppid").unwrap_or_default();
    assert_eq!(parent.trim(), worker.pid().to_string(), "the job's parent");
    let stolen = std::fs::read(dir.join("stolen")).unwrap_or_default();
    let leaked = stolen
        .windows(password.len())
        .any(|window| window == password.as_bytes());
    assert!(
        !leaked,
        "the job read the password from the worker's environ"
    );
    assert!(stolen.is_empty(), "{}", String::from_utf8_lossy(&stolen));
    let denied = dir.read("denied").unwrap_or_default();
    assert!(denied.contains("Permission denied"), "{denied}");
}
