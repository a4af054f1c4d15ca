//! Worker processes and what the benchmark reads about them: their config, their `/proc` figures
//! (CPU, RSS, the machine's load), their ledger and their JSON log. Used by [`super::cluster`].

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use testkit::Worker;

use super::cluster::Load;
use super::nodes::Backend;
use super::proxy::Proxy;

/// A jobs.yaml on `store`'s nodes at `urls`: `jobs` jobs named `j00000…` on `schedule`, all running
/// `command`; the store's default lock settings.
pub fn config_yaml(
    store: Backend,
    urls: &[String],
    id: &str,
    jobs: usize,
    schedule: &str,
    command: &[String],
) -> String {
    // JSON strings are YAML strings; `$` is doubled because the config expands `${VAR}`.
    let quote = |s: &str| serde_json::to_string(&s.replace('$', "$$")).unwrap_or_default();
    let argv: Vec<String> = command.iter().map(|a| quote(a)).collect();
    let mut yaml = format!(
        "{}worker:\n  id: {id}\n  shutdown_grace: 5s\njobs:\n",
        store.section(urls)
    );
    for j in 0..jobs {
        yaml.push_str(&format!(
            "  - name: j{j:05}\n    schedule: \"{schedule}\"\n    command: [{}]\n",
            argv.join(", ")
        ));
    }
    yaml
}

/// Starts a `redcron run` worker of `binary` on `config`; it is SIGKILLed (with its jobs) on drop.
pub fn spawn(binary: &Path, config: &Path) -> Worker {
    Worker::builder(config).binary(binary).spawn()
}

/// Waits until every worker logged `worker.started`.
pub fn wait_started(workers: &[Worker], timeout: Duration) -> Result<(), String> {
    for worker in workers {
        if worker.wait_for_event("worker.started", timeout).is_none() {
            return Err(format!(
                "worker {} did not log worker.started within {timeout:?}: {}",
                worker.pid(),
                worker.stderr()
            ));
        }
    }
    Ok(())
}

/// SIGTERM to every worker, then up to 15 s for each to exit.
pub fn stop_all(workers: &mut [Worker]) {
    workers
        .iter_mut()
        .for_each(|worker| worker.signal(libc::SIGTERM));
    let deadline = Instant::now() + Duration::from_secs(15);
    for worker in workers.iter_mut() {
        worker.wait_timeout(deadline.saturating_duration_since(Instant::now()));
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub fn sleep_until_ms(at: i64) {
    let wait = at - now_ms();
    if wait > 0 {
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
}

/// utime + stime of a process, in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    stat_ticks(pid, 11) + stat_ticks(pid, 12)
}

/// CPU clock ticks (user + system) of the process's children that it has reaped: its jobs.
pub fn children_ticks(pid: u32) -> u64 {
    stat_ticks(pid, 13) + stat_ticks(pid, 14)
}

/// Field `n` of `/proc/<pid>/stat`, counted from 0 after the command name.
fn stat_ticks(pid: u32, n: usize) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may contain spaces; fields are counted after its closing parenthesis.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    rest.split_whitespace()
        .nth(n)
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0)
}

/// `(VmRSS, VmHWM)` in kB.
pub fn memory(pid: u32) -> (u64, u64) {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The SHA-1s of redcron's scripts, in the order the counters use: acquire, confirm, renew, release.
pub fn script_shas() -> Vec<String> {
    use redcron::store::redis::scripts::{ACQUIRE, CONFIRM, RELEASE, RENEW};
    [&ACQUIRE, &CONFIRM, &RENEW, &RELEASE]
        .iter()
        .map(|s| s.get_hash().to_string())
        .collect()
}

/// Per worker, per kind: `(commands, round trips)` summed over the worker's proxies.
pub fn counts(proxies: &[Vec<Proxy>]) -> Vec<Vec<(u64, u64)>> {
    proxies
        .iter()
        .map(|ps| {
            let mut sum = vec![(0, 0); script_shas().len() + 1];
            for counts in ps.iter().map(Proxy::counts) {
                for (s, (c, r)) in sum.iter_mut().zip(counts) {
                    s.0 += c;
                    s.1 += r;
                }
            }
            sum
        })
        .collect()
}

/// `(busy, total)` clock ticks of the whole machine, from the first line of /proc/stat.
pub fn machine_ticks() -> (u64, u64) {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let first = stat.lines().next().unwrap_or("");
    let fields: Vec<u64> = first
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

pub fn busy_fraction(before: (u64, u64), after: (u64, u64)) -> f64 {
    let total = after.1.saturating_sub(before.1).max(1);
    after.0.saturating_sub(before.0) as f64 / total as f64
}

pub fn tick_ms(rfc3339: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// One line of the ledger that the probe job writes first thing: `$REDCRON_JOB $REDCRON_TICK
/// $REDCRON_WORKER_ID <wall-clock ns>` (see `main.rs`).
pub struct LedgerEntry<'a> {
    /// The job's name.
    pub job: &'a str,
    /// The tick, in ms since the epoch.
    pub tick: i64,
    /// The worker that ran it (its `REDCRON_WORKER_ID`).
    pub worker: &'a str,
    /// From the tick to the job's start (zero if the clock put the start before the tick).
    pub tick_to_start: Duration,
}

impl<'a> LedgerEntry<'a> {
    /// Parses one ledger line; an error names the line.
    pub fn parse(line: &'a str) -> Result<LedgerEntry<'a>, String> {
        let fields: Vec<&str> = line.split(' ').collect();
        let [job, tick, worker, ns] = fields[..] else {
            return Err(format!("bad ledger line {line:?}"));
        };
        let (Some(tick), Ok(ns)) = (tick_ms(tick), ns.parse::<i128>()) else {
            return Err(format!("bad ledger line {line:?}"));
        };
        let delay = ns - i128::from(tick) * 1_000_000;
        Ok(LedgerEntry {
            job,
            tick,
            worker,
            tick_to_start: Duration::from_nanos(delay.max(0) as u64),
        })
    }
}

/// Exactly-once and tick-to-start from the ledger, for ticks in `first..=last`.
pub fn read_ledger(path: &Path, first: i64, last: i64, load: &mut Load) -> Result<(), String> {
    let text = fs::read_to_string(path).unwrap_or_default();
    let mut runs: HashMap<(String, i64), usize> = HashMap::new();
    let mut per_worker: HashMap<String, usize> = HashMap::new();
    for line in text.lines() {
        let entry = LedgerEntry::parse(line)?;
        if entry.tick < first || entry.tick > last {
            continue;
        }
        *runs.entry((entry.job.to_string(), entry.tick)).or_default() += 1;
        *per_worker.entry(entry.worker.to_string()).or_default() += 1;
        load.tick_to_start.push(entry.tick_to_start);
    }
    let expected = load.jobs * load.ticks;
    load.once = runs.values().filter(|n| **n == 1).count();
    load.duplicates = runs.values().filter(|n| **n > 1).count();
    load.missing = expected.saturating_sub(runs.len());
    load.runs_per_worker = per_worker.into_iter().collect();
    load.runs_per_worker.sort();
    Ok(())
}

/// Tick-to-won and skipped ticks from a worker's JSON log, for ticks in `first..=last`.
pub fn read_log(worker: &Worker, first: i64, last: i64, load: &mut Load) {
    for line in worker.lines() {
        let won = line.contains("\"tick.won\"");
        if !won && !line.contains("\"tick.skipped\"") {
            continue;
        }
        let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let Some(tick) = event["tick"].as_str().and_then(tick_ms) else {
            continue;
        };
        if tick < first || tick > last {
            continue;
        }
        if won {
            let Some(at) = event["timestamp"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            else {
                continue;
            };
            let delay = at.timestamp_micros() - tick * 1000;
            load.tick_to_won
                .push(Duration::from_micros(delay.max(0) as u64));
        } else {
            let reason = event["reason"].as_str().unwrap_or("unknown").to_string();
            match load.skipped.iter_mut().find(|(r, _)| *r == reason) {
                Some((_, n)) => *n += 1,
                None => load.skipped.push((reason, 1)),
            }
        }
    }
}
