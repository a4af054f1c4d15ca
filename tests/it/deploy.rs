//! deploy/: the local cluster script run for real, and the recipes checked for what docs/protocol.md asks
//! of a deployment — Redis persistence on every node, more time to stop than the worker's shutdown grace,
//! jobs files that the worker accepts.
//!
//! There is no Docker engine, systemd or Kubernetes here, so those recipes are checked as files only.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use yaml_rust2::{Yaml, YamlLoader};

use redcron::config::{parse_with_env, Config, StoreConfig};

use crate::support::{require_program, TestDir};

/// `deploy/local-cluster.sh` starts 3 nodes and 3 workers; every demo tick runs exactly once, with
/// increasing tokens; the workers stop cleanly and nothing the script started outlives it.
#[test]
fn local_cluster_runs_every_tick_once_and_leaves_nothing_behind() {
    require_program("redis-server", "redis-server");
    require_program("redis-cli", "redis-tools");
    let dir = TestDir::new();
    let cluster = dir.join("cluster");
    let cluster_arg = cluster.to_str().expect("temp paths are UTF-8 here");
    let mut script = Script::start(
        &["--seconds", "8", "--dir", cluster_arg, "--format", "json"],
        &cluster,
    );
    let (status, stdout, stderr) = script.wait(Duration::from_secs(180));
    assert!(
        status.success(),
        "local-cluster.sh ended with {status}:\n{stderr}"
    );

    let events: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let workers_that_logged = |event: &str| -> BTreeSet<String> {
        events
            .iter()
            .filter(|e| e["event"] == event)
            .filter_map(|e| e["worker"].as_str().map(str::to_owned))
            .collect()
    };
    let all: BTreeSet<String> = (1..=3).map(|i| format!("worker-{i}")).collect();
    assert_eq!(
        workers_that_logged("worker.started"),
        all,
        "merged output:\n{stdout}"
    );
    assert_eq!(
        workers_that_logged("worker.stopped"),
        all,
        "merged output:\n{stdout}"
    );

    // The demo job `ledger` appends "job tick token worker" every 2 s.
    let ledger =
        std::fs::read_to_string(cluster.join("ledger")).expect("the demo job wrote no ledger");
    let mut runs: BTreeMap<chrono::DateTime<chrono::Utc>, Vec<(u64, String)>> = BTreeMap::new();
    for line in ledger.lines() {
        let [job, tick, token, worker] = line.split_whitespace().collect::<Vec<_>>()[..] else {
            panic!("bad ledger line {line:?}")
        };
        assert_eq!(job, "ledger");
        let tick = chrono::DateTime::parse_from_rfc3339(tick)
            .expect("RFC 3339 tick")
            .to_utc();
        let token = token
            .parse()
            .unwrap_or_else(|_| panic!("bad token in {line:?}"));
        assert!(all.contains(worker), "unknown worker in {line:?}");
        runs.entry(tick)
            .or_default()
            .push((token, worker.to_owned()));
    }
    assert!(
        runs.len() >= 3,
        "expected at least 3 ticks in 8 s, ledger:\n{ledger}"
    );
    for (tick, ran) in &runs {
        assert_eq!(
            ran.len(),
            1,
            "tick {tick} ran {} times, ledger:\n{ledger}",
            ran.len()
        );
    }
    let ticks: Vec<_> = runs.keys().collect();
    for pair in ticks.windows(2) {
        assert_eq!(
            *pair[1] - *pair[0],
            chrono::TimeDelta::seconds(2),
            "a tick is missing, ledger:\n{ledger}"
        );
    }
    let tokens: Vec<u64> = runs.values().map(|ran| ran[0].0).collect();
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens do not increase: {tokens:?}"
    );

    let left = leftovers(&cluster, Duration::from_secs(5));
    assert!(
        left.is_empty(),
        "processes still running in {}: {left:?}",
        cluster.display()
    );
}

/// The failover demo: with `deploy/local-cluster.sh` running, a worker and a node SIGKILLed are each
/// reported and the demo goes on — the other workers run the ticks after the kill, each once — and the
/// `redcron` wrapper it writes beside its files answers `status` from outside (it sets the jobs file's
/// variables); the script still ends with 0, naming what exited.
#[test]
fn local_cluster_goes_on_when_a_worker_and_a_node_are_killed() {
    require_program("redis-server", "redis-server");
    require_program("redis-cli", "redis-tools");
    let dir = TestDir::new();
    let cluster = dir.join("cluster");
    let cluster_arg = cluster.to_str().expect("temp paths are UTF-8 here");
    let mut script = Script::start(
        &["--seconds", "20", "--dir", cluster_arg, "--format", "json"],
        &cluster,
    );
    let ledger_lines = || {
        std::fs::read_to_string(cluster.join("ledger"))
            .map(|text| text.lines().count())
            .unwrap_or(0)
    };
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(90);
        while !done() {
            assert!(Instant::now() < deadline, "{what} did not happen in 90 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    until("two runs of the demo job", &|| ledger_lines() >= 2);

    // worker-1's pid is in its worker.started event; node 1's is what it answers itself.
    let log = std::fs::read_to_string(cluster.join("worker-1.log")).expect("worker-1.log");
    let worker_pid: libc::pid_t = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|e| e["event"] == "worker.started")
        .and_then(|e| e["pid"].as_i64())
        .and_then(|pid| pid.try_into().ok())
        .expect("worker.started names its pid");
    let env = std::fs::read_to_string(cluster.join("env")).expect("the script writes env");
    let port = env
        .lines()
        .find_map(|line| line.strip_prefix("REDCRON_NODE_1=redis://127.0.0.1:"))
        .expect("env names node 1")
        .to_owned();
    let info = Command::new("redis-cli")
        .args(["-p", &port, "info", "server"])
        .output()
        .expect("redis-cli");
    let node_pid: libc::pid_t = String::from_utf8_lossy(&info.stdout)
        .lines()
        .find_map(|line| line.trim().strip_prefix("process_id:")?.parse().ok())
        .expect("node 1 names its process_id");
    for pid in [worker_pid, node_pid] {
        // SAFETY: kill has no memory effects; both pids are processes the script started in this test's
        // directory and still runs (it has not reaped them: they are alive).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let killed_at = ledger_lines();
    until("three runs after the kills", &|| {
        ledger_lines() >= killed_at + 3
    });

    let status = Command::new(cluster.join("redcron"))
        .args(["status", "--json"])
        .output()
        .expect("the redcron wrapper runs");
    assert!(
        status.status.success(),
        "\"$DIR/redcron\" status failed: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let status_text = String::from_utf8_lossy(&status.stdout);
    assert!(status_text.contains("worker-2"), "{status_text}");

    let (exit, _stdout, stderr) = script.wait(Duration::from_secs(180));
    assert!(
        exit.success(),
        "local-cluster.sh ended with {exit}:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "worker-1 (pid {worker_pid}) exited: killed by SIGKILL; the other workers go on"
        )) && stderr.contains(&format!(
            "redis node 1 (pid {node_pid}) exited: killed by SIGKILL; the workers go on"
        )),
        "{stderr}"
    );
    // The summary lists what exited, in the order the script noticed it.
    let summary = stderr
        .lines()
        .find(|line| line.contains("exited before the stop:"))
        .unwrap_or_default();
    assert!(
        summary.contains(&format!("worker-1 (pid {worker_pid}): killed by SIGKILL"))
            && summary.contains(&format!("redis node 1 (pid {node_pid}): killed by SIGKILL")),
        "{stderr}"
    );
    assert!(
        stderr.contains("\"/redcron\" status") || stderr.contains("/redcron\" status"),
        "the script prints a paste-ready status command:\n{stderr}"
    );

    let ledger = std::fs::read_to_string(cluster.join("ledger")).expect("ledger");
    let mut ticks = BTreeMap::<&str, usize>::new();
    for line in ledger.lines() {
        let tick = line.split_whitespace().nth(1).expect("a tick");
        *ticks.entry(tick).or_default() += 1;
    }
    let twice: Vec<_> = ticks.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "ticks run twice: {twice:?}\n{ledger}");
    let left = leftovers(&cluster, Duration::from_secs(5));
    assert!(left.is_empty(), "processes still running: {left:?}");
}

/// `--help` documents the options, and a bad option is a usage error (exit 2) that starts nothing.
#[test]
fn local_cluster_help_and_usage_errors() {
    let script = deploy_dir().join("local-cluster.sh");
    let help = Command::new("bash")
        .arg(&script)
        .arg("--help")
        .output()
        .expect("bash runs");
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for option in [
        "--dir",
        "--seconds",
        "--workers",
        "--base-port",
        "--jobs",
        "--format",
        "REDCRON_BIN",
    ] {
        assert!(
            text.contains(option),
            "--help does not mention {option}:\n{text}"
        );
    }
    let bad = Command::new("bash")
        .arg(&script)
        .args(["--seconds", "soon"])
        .output()
        .expect("bash runs");
    assert_eq!(
        bad.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// Every YAML file in deploy/ parses, every document of it.
#[test]
fn deploy_yaml_files_parse() {
    let mut files = Vec::new();
    collect_yaml(&deploy_dir(), &mut files);
    assert!(
        files.len() >= 8,
        "expected the compose, jobs and Kubernetes files, found {files:?}"
    );
    for file in files {
        assert!(
            !yaml_documents(&file).is_empty(),
            "{} has no YAML document",
            file.display()
        );
    }
}

/// Every Redis node that deploy/ starts logs each write to the AOF and fsyncs it before answering
/// (docs/protocol.md, assumption 1): the local script and compose load deploy/redis/redis.conf,
/// Kubernetes has the same settings in its ConfigMap.
#[test]
fn redis_nodes_use_the_persistence_the_protocol_requires() {
    let conf = std::fs::read_to_string(deploy_dir().join("redis/redis.conf"))
        .expect("deploy/redis/redis.conf");
    let settings = directives(&conf);
    for required in [
        ("appendonly", "yes"),
        ("appendfsync", "always"),
        ("maxmemory-policy", "noeviction"),
    ] {
        assert!(
            settings
                .iter()
                .any(|(k, v)| (k.as_str(), v.as_str()) == required),
            "redis.conf lacks {required:?}"
        );
    }

    let script =
        std::fs::read_to_string(deploy_dir().join("local-cluster.sh")).expect("local-cluster.sh");
    assert!(
        script.contains(r#"redis-server "$here/redis/redis.conf""#),
        "local-cluster.sh does not load redis.conf"
    );

    let compose = compose_file();
    let redis_services: Vec<&Yaml> = compose["services"]
        .as_hash()
        .expect("compose services")
        .values()
        .filter(|service| {
            field(service, "image")
                .as_str()
                .is_some_and(|image| image.starts_with("redis"))
        })
        .collect();
    assert_eq!(
        redis_services.len(),
        5,
        "docker-compose.yml should run 5 Redis nodes"
    );
    for service in redis_services {
        let loaded = field(service, "command")[1]
            .as_str()
            .expect("redis-server <config file> ...");
        let mount = format!("./redis/redis.conf:{loaded}:ro");
        let volumes = field(service, "volumes").as_vec().expect("volumes");
        assert!(
            volumes.iter().any(|v| v.as_str() == Some(&mount)),
            "a compose Redis node does not mount {mount}"
        );
    }

    let kubernetes = yaml_documents(&deploy_dir().join("kubernetes/redis.yaml"));
    let kind = |kind: &str| {
        kubernetes
            .iter()
            .find(|doc| doc["kind"].as_str() == Some(kind))
    };
    let config_map = kind("ConfigMap").expect("the redis ConfigMap");
    let in_cluster = config_map["data"]["redis.conf"]
        .as_str()
        .expect("data.redis.conf");
    assert_eq!(
        directives(in_cluster),
        settings,
        "kubernetes/redis.yaml and redis/redis.conf disagree"
    );
    let stateful_set = kind("StatefulSet").expect("the StatefulSet");
    let pod = &stateful_set["spec"]["template"]["spec"];
    let args = pod["containers"][0]["args"].as_vec().expect("redis args");
    let loads_conf = args
        .iter()
        .any(|a| a.as_str() == Some("/etc/redis/redis.conf"));
    assert!(
        loads_conf,
        "the StatefulSet does not load /etc/redis/redis.conf"
    );
    assert_eq!(
        pod["volumes"][0]["configMap"]["name"],
        config_map["metadata"]["name"]
    );
    assert_eq!(stateful_set["spec"]["replicas"].as_i64(), Some(5));
    let claims = stateful_set["spec"]["volumeClaimTemplates"].as_vec();
    assert!(
        claims.is_some_and(|c| !c.is_empty()),
        "Redis data must be on persistent volumes"
    );
}

/// Kubernetes probes the workers' `/healthz` (liveness) and `/readyz` (readiness) on the port the jobs
/// ConfigMap makes them listen on; deploy/prometheus/ loads its alert rules, keeps redcron's own `job`
/// label, and every rule is well formed, covers the alerts an operator needs, and names only metrics that
/// the worker exports.
#[test]
fn probes_and_alert_rules_match_what_the_worker_serves() {
    let config_map = &yaml_documents(&deploy_dir().join("kubernetes/jobs-configmap.yaml"))[0];
    let kube_jobs = jobs(
        config_map["data"]["jobs.yaml"]
            .as_str()
            .expect("data.jobs.yaml"),
    );
    let listen = kube_jobs
        .worker
        .listen
        .expect("the ConfigMap sets worker.listen");
    let deployment = &yaml_documents(&deploy_dir().join("kubernetes/worker-deployment.yaml"))[0];
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let ports = container["ports"].as_vec().expect("container ports");
    let metrics_port = ports
        .iter()
        .find(|port| port["name"].as_str() == Some("metrics"))
        .expect("a port named metrics");
    assert_eq!(
        metrics_port["containerPort"].as_i64(),
        Some(i64::from(listen.port()))
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(get["port"].as_str(), Some("metrics"), "{probe}");
    }

    let prometheus = &yaml_documents(&deploy_dir().join("prometheus/prometheus.yml"))[0];
    let rule_files = prometheus["rule_files"].as_vec().expect("rule_files");
    assert_eq!(rule_files, &vec![Yaml::String("alerts.yml".to_owned())]);
    let scrape = &prometheus["scrape_configs"][0];
    assert_eq!(scrape["job_name"].as_str(), Some("redcron"));
    assert_eq!(scrape["honor_labels"].as_bool(), Some(true));

    // Every metric name the worker exports, with the suffixes of its type.
    let exported = redcron::metrics::Metrics::new(["job"]).encode();
    let families = prometheus_parse::Scrape::parse(exported.lines().map(|l| Ok(l.to_owned())))
        .expect("the worker's metrics parse")
        .docs;
    let names: BTreeSet<String> = families
        .keys()
        .flat_map(|family| {
            ["", "_total", "_bucket", "_sum", "_count"].map(|suffix| format!("{family}{suffix}"))
        })
        .collect();
    let alerts = &yaml_documents(&deploy_dir().join("prometheus/alerts.yml"))[0];
    let rules = alerts["groups"][0]["rules"]
        .as_vec()
        .expect("groups[0].rules");
    let mut alert_names = BTreeSet::new();
    for rule in rules {
        let alert = rule["alert"].as_str().expect("every rule is an alert");
        let expr = rule["expr"].as_str().expect("expr");
        if let Err(error) = promql_parser::parser::parse(expr) {
            panic!("{alert}: expr is not PromQL: {error}\n{expr}");
        }
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("warning" | "critical")),
            "{alert}: {severity:?}"
        );
        assert!(
            rule["annotations"]["summary"].as_str().is_some(),
            "{alert}: summary"
        );
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("redcron_") {
                assert!(
                    names.contains(word),
                    "{alert}: the worker exports no {word}"
                );
            }
        }
        alert_names.insert(alert.to_owned());
    }
    for needed in [
        "RedcronJobFailing",
        "RedcronTicksMissed",
        "RedcronNoQuorum",
        "RedcronStoreNodeDown",
        "RedcronClockOffsetHigh",
        "RedcronNoLiveWorker",
    ] {
        assert!(
            alert_names.contains(needed),
            "no {needed} in {alert_names:?}"
        );
    }
}

/// Each recipe gives a stopping worker longer than its `shutdown_grace` plus its jobs' `stop_grace`
/// before SIGKILL, so that running jobs can finish (or be stopped) and leases are released; and the jobs
/// files parse with the variables each recipe sets.
#[test]
fn stop_timeouts_exceed_the_shutdown_grace() {
    let local = jobs(
        &std::fs::read_to_string(deploy_dir().join("local-cluster.jobs.yaml")).expect("demo jobs"),
    );
    let script =
        std::fs::read_to_string(deploy_dir().join("local-cluster.sh")).expect("local-cluster.sh");
    let stop_timeout = script
        .lines()
        .find_map(|l| l.split(" stop_timeout=").nth(1))
        .expect("stop_timeout=");
    let stop_timeout = Duration::from_secs(stop_timeout.trim().parse().expect("seconds"));
    assert!(
        stop_timeout > time_to_stop(&local),
        "local-cluster.sh --stop-timeout default"
    );

    let compose = compose_file();
    let compose_jobs = jobs(
        &std::fs::read_to_string(deploy_dir().join("docker-compose.jobs.yaml")).expect("jobs"),
    );
    let period = compose["services"]["worker"]["stop_grace_period"]
        .as_str()
        .expect("stop_grace_period");
    let period = humantime::parse_duration(period).expect("a duration");
    assert!(
        period > time_to_stop(&compose_jobs),
        "compose stop_grace_period {period:?}"
    );

    let config_map = &yaml_documents(&deploy_dir().join("kubernetes/jobs-configmap.yaml"))[0];
    let kube_jobs = jobs(
        config_map["data"]["jobs.yaml"]
            .as_str()
            .expect("data.jobs.yaml"),
    );
    let deployment = &yaml_documents(&deploy_dir().join("kubernetes/worker-deployment.yaml"))[0];
    let pod = &deployment["spec"]["template"]["spec"];
    let grace = pod["terminationGracePeriodSeconds"]
        .as_i64()
        .expect("seconds");
    let grace = Duration::from_secs(grace.try_into().expect("not negative"));
    assert!(
        grace > time_to_stop(&kube_jobs),
        "terminationGracePeriodSeconds {grace:?}"
    );
    assert_eq!(deployment["spec"]["replicas"].as_i64(), Some(3));

    // The unit runs whatever jobs file the operator installs: compare with the default grace (30 s) and
    // the longest default stop grace.
    let unit =
        std::fs::read_to_string(deploy_dir().join("systemd/redcron.service")).expect("the unit");
    let unit_value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(str::trim)
    };
    let timeout = humantime::parse_duration(unit_value("TimeoutStopSec").expect("TimeoutStopSec"))
        .expect("a duration");
    assert!(
        timeout > Duration::from_secs(30) + redcron::lock::MAX_DEFAULT_STOP_GRACE,
        "TimeoutStopSec {timeout:?}"
    );
    assert_eq!(unit_value("KillSignal"), Some("SIGTERM"));
    // control-group (the default) would SIGTERM the jobs too, at once, instead of giving them the grace.
    assert_eq!(unit_value("KillMode"), Some("mixed"));
    assert_eq!(unit_value("Restart"), Some("always"));
}

/// No recipe gives every host a store of its own: the jobs files of compose and systemd (the one the
/// unit's install steps copy) name a shared store, and their workers serve `/metrics`, `/healthz` and
/// `/readyz`; the workers of Kubernetes have a PodDisruptionBudget, the Redis nodes a `maxmemory` below
/// their container's limit (refusing writes instead of being OOM-killed), and Prometheus's pod discovery
/// the RBAC it needs in the workers' namespace.
#[test]
fn recipes_share_a_store_and_bound_what_they_run_on() {
    let unit =
        std::fs::read_to_string(deploy_dir().join("systemd/redcron.service")).expect("the unit");
    assert!(
        unit.contains("install -m 0644 deploy/systemd/jobs.example.yaml /etc/redcron/jobs.yaml"),
        "the unit's install steps do not install systemd/jobs.example.yaml"
    );
    for file in ["systemd/jobs.example.yaml", "docker-compose.jobs.yaml"] {
        let config = jobs(&std::fs::read_to_string(deploy_dir().join(file)).expect(file));
        assert!(
            !matches!(config.store, StoreConfig::Embedded(_)),
            "{file}: every host would run every job"
        );
        assert!(config.worker.listen.is_some(), "{file}: no worker.listen");
    }

    let workers = yaml_documents(&deploy_dir().join("kubernetes/worker-deployment.yaml"));
    let budget = workers
        .iter()
        .find(|doc| doc["kind"].as_str() == Some("PodDisruptionBudget"))
        .expect("a PodDisruptionBudget for the workers");
    assert_eq!(budget["spec"]["maxUnavailable"].as_i64(), Some(1));
    assert_eq!(
        budget["spec"]["selector"]["matchLabels"], workers[0]["spec"]["selector"]["matchLabels"],
        "the budget selects the Deployment's pods"
    );

    let conf = std::fs::read_to_string(deploy_dir().join("redis/redis.conf")).expect("redis.conf");
    let maxmemory = directives(&conf)
        .into_iter()
        .find(|(key, _)| key == "maxmemory")
        .map(|(_, value)| value)
        .expect("redis.conf sets maxmemory");
    let mb: u64 = maxmemory
        .strip_suffix("mb")
        .and_then(|n| n.parse().ok())
        .expect("maxmemory in mb");
    let redis = yaml_documents(&deploy_dir().join("kubernetes/redis.yaml"));
    let stateful_set = redis
        .iter()
        .find(|doc| doc["kind"].as_str() == Some("StatefulSet"))
        .expect("the StatefulSet");
    let limit = stateful_set["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        ["memory"]
        .as_str()
        .and_then(|limit| limit.strip_suffix("Mi"))
        .and_then(|mi| mi.parse::<u64>().ok())
        .expect("a memory limit in Mi");
    // Redis's mb is 1024², as Kubernetes's Mi; a quarter spare for the AOF rewrite's buffers and the rest.
    assert!(
        mb * 4 <= limit * 3,
        "maxmemory {mb}mb leaves too little of the {limit}Mi limit"
    );

    let prometheus = &yaml_documents(&deploy_dir().join("prometheus/prometheus.yml"))[0];
    let discovered = &prometheus["scrape_configs"][0]["kubernetes_sd_configs"][0];
    let namespace = &discovered["namespaces"]["names"][0];
    let rbac = yaml_documents(&deploy_dir().join("prometheus/rbac.yaml"));
    let role = rbac
        .iter()
        .find(|doc| doc["kind"].as_str() == Some("Role"))
        .expect("a Role for the pod discovery");
    assert_eq!(&role["metadata"]["namespace"], namespace);
    let rule = &role["rules"][0];
    assert_eq!(discovered["role"].as_str(), Some("pod"));
    assert_eq!(rule["resources"][0].as_str(), Some("pods"));
    for verb in ["list", "watch"] {
        assert!(
            rule["verbs"]
                .as_vec()
                .is_some_and(|verbs| verbs.iter().any(|v| v.as_str() == Some(verb))),
            "the Role cannot {verb} pods"
        );
    }
    let binding = rbac
        .iter()
        .find(|doc| doc["kind"].as_str() == Some("RoleBinding"))
        .expect("a RoleBinding");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(&binding["metadata"]["namespace"], namespace);
}

/// A jobs file of deploy/ parsed with the variables its recipe sets (dummy values).
/// How long a worker of `config` may take to stop after SIGTERM: the shutdown grace, then the longest
/// stop grace of its jobs (SIGTERM to SIGKILL).
fn time_to_stop(config: &Config) -> Duration {
    let stop_grace = config.jobs.iter().map(|job| job.stop_grace).max();
    config.worker.shutdown_grace + stop_grace.unwrap_or_default()
}

fn jobs(text: &str) -> Config {
    let env = |name: &str| -> Option<String> {
        match name {
            "REDIS_PASSWORD" => Some("0123abcd".to_owned()),
            "REDCRON_DEMO_DIR" => Some("/tmp/demo".to_owned()),
            "REDCRON_WORKER_NAME" => Some("worker-1".to_owned()),
            "REDCRON_WORKER_PORT" => Some("9464".to_owned()),
            _ => name
                .strip_prefix("REDCRON_NODE_")
                .map(|i| format!("redis://127.0.0.1:700{i}")),
        }
    };
    parse_with_env(text, Path::new("jobs.yaml"), &env).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn compose_file() -> Yaml {
    yaml_documents(&deploy_dir().join("docker-compose.yml")).remove(0)
}

/// `key` of a mapping, or of the mapping it merges in with `<<: *anchor` (the loader resolves aliases,
/// not merge keys).
fn field<'a>(mapping: &'a Yaml, key: &str) -> &'a Yaml {
    let own = &mapping[key];
    if own.is_badvalue() {
        &mapping["<<"][key]
    } else {
        own
    }
}

fn yaml_documents(path: &Path) -> Vec<Yaml> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", path.display()))
}

fn collect_yaml(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("deploy/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            collect_yaml(&path, files);
        } else if path
            .extension()
            .is_some_and(|ext| ext == "yml" || ext == "yaml")
        {
            files.push(path);
        }
    }
}

/// The `name value` lines of a redis.conf, sorted, without comments and blank lines.
fn directives(conf: &str) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = conf
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (name, value) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            (name.to_lowercase(), value.trim().to_owned())
        })
        .collect();
    found.sort();
    found
}

/// `deploy/local-cluster.sh` with the built binary, in a process group of its own, its output collected.
///
/// Dropping it while it runs sends SIGTERM, so that its trap stops the workers and nodes in order, and
/// SIGKILLs its process group if it does not end; then anything still running in the cluster directory.
struct Script {
    child: Child,
    cluster: PathBuf,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
}

impl Script {
    fn start(args: &[&str], cluster: &Path) -> Script {
        use std::os::unix::process::CommandExt as _;
        let mut command = Command::new("bash");
        command
            .arg(deploy_dir().join("local-cluster.sh"))
            .args(args)
            .env("REDCRON_BIN", env!("CARGO_BIN_EXE_redcron"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                // If this test's thread dies without dropping us, the script's trap still cleans up.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .expect("cannot run bash deploy/local-cluster.sh");
        let stdout = collect(child.stdout.take().expect("piped"));
        let stderr = collect(child.stderr.take().expect("piped"));
        Script {
            child,
            cluster: cluster.to_owned(),
            stdout,
            stderr,
        }
    }

    /// Waits for the script to exit; then its exit status, stdout and stderr.
    fn wait(&mut self, timeout: Duration) -> (ExitStatus, String, String) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("waitpid") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "local-cluster.sh still runs after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        // The pipes close when the script's last viewer exits, a moment after the script.
        let read = |output: &mpsc::Receiver<String>| {
            output
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_default()
        };
        (status, read(&self.stdout), read(&self.stderr))
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let pid = self.child.id() as libc::pid_t;
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: kill has no memory effects; the pid is our unreaped child, so it is not reused.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(60);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if matches!(self.child.try_wait(), Ok(None)) {
                // SAFETY: as above: while our child is unreaped, its pid names its own group.
                unsafe { libc::killpg(pid, libc::SIGKILL) };
                let _ = self.child.wait();
            }
        }
        for pid in leftovers(&self.cluster, Duration::ZERO) {
            // SAFETY: kill has no memory effects; the process runs in this test's own temporary
            // directory, so it is one the script started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Reads `pipe` to its end on a thread of its own; the text arrives on the channel.
fn collect(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        let _ = send.send(String::from_utf8_lossy(&bytes).into_owned());
    });
    receive
}

/// Processes whose working directory is `dir` or below it (the script runs everything it starts there),
/// after waiting up to `patience` for them to go.
fn leftovers(dir: &Path, patience: Duration) -> Vec<libc::pid_t> {
    let deadline = Instant::now() + patience;
    loop {
        let found: Vec<libc::pid_t> = std::fs::read_dir("/proc")
            .map(|entries| {
                entries
                    .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                    .filter(|pid| {
                        std::fs::read_link(format!("/proc/{pid}/cwd"))
                            .is_ok_and(|cwd| cwd.starts_with(dir))
                    })
                    .collect()
            })
            .unwrap_or_default();
        if found.is_empty() || Instant::now() >= deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
