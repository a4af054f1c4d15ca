//! What a run may leave behind: nothing. A job's background processes — in its process group, escaped
//! from it with `setsid`, ignoring SIGTERM — are ended when the job's own process exits, before the run
//! releases its lease, so `overlap: skip` holds; a worker's shutdown leaves none of them either.
//!
//! Each job process writes `<run id> <pid>` to `pids` as it starts; the test checks those pids with
//! `kill(pid, 0)` (and that a live pid still carries the run's id, against pid reuse).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::embedded::config;
use crate::support::{TestDir, Worker};

/// A job every second that starts, and leaves behind: a `sleep 40` in its group, a `setsid` shell with a
/// `sleep 41` of its own (out of its group), and a shell that ignores SIGTERM; then exits 0. Before that,
/// it notes in `overlap` every process of an earlier run that is still alive.
fn leaving_job(dir: &TestDir) -> String {
    let pids = dir.join("pids");
    let overlap = dir.join("overlap");
    let p = pids.display();
    format!(
        "  - name: leaver\n    schedule: \"* * * * * *\"\n    overlap: skip\n    stop_grace: 1200ms\n    command: |\n      \
         for pid in $(cut -d' ' -f2 {p} 2>/dev/null); do kill -0 $pid 2>/dev/null && echo \"$REDCRON_RUN_ID $pid\" >> {o}; done\n      \
         sh -c 'echo \"$REDCRON_RUN_ID $$$$\" >> {p}; exec sleep 40' >/dev/null 2>&1 &\n      \
         setsid sh -c 'echo \"$REDCRON_RUN_ID $$$$\" >> {p}; sleep 41 & echo \"$REDCRON_RUN_ID $!\" >> {p}; wait' >/dev/null 2>&1 </dev/null &\n      \
         sh -c 'trap \"\" TERM; echo \"$REDCRON_RUN_ID $$$$\" >> {p}; while :; do sleep 1; done' >/dev/null 2>&1 &\n      \
         sleep 0.2; exit 0\n",
        o = overlap.display(),
    )
}

/// The pids each run wrote, by run id.
fn pids_by_run(dir: &TestDir) -> BTreeMap<String, BTreeSet<i32>> {
    let mut runs: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    for line in dir.read("pids").unwrap_or_default().lines() {
        if let Some((run, pid)) = line.split_once(' ') {
            if let Ok(pid) = pid.trim().parse() {
                runs.entry(run.to_string()).or_default().insert(pid);
            }
        }
    }
    runs
}

/// Whether `pid` is a live process of run `run` (not a zombie, not a reused pid).
fn alive(pid: i32, run: &str) -> bool {
    // SAFETY: signal 0 only checks for existence.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = stat
        .rsplit(')')
        .next()
        .is_some_and(|rest| rest.trim_start().starts_with('Z'));
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let marker = format!("REDCRON_RUN_ID={run}");
    let ours = environ
        .split(|&b| b == 0)
        .any(|entry| entry == marker.as_bytes());
    !zombie && ours
}

/// The live processes of `runs`, as (run, pid).
fn survivors(dir: &TestDir, runs: &BTreeSet<String>) -> Vec<(String, i32)> {
    let pids = pids_by_run(dir);
    let mut left = Vec::new();
    for run in runs {
        for &pid in pids.get(run).into_iter().flatten() {
            if alive(pid, run) {
                left.push((run.clone(), pid));
            }
        }
    }
    left
}

/// Kills whatever a failing run of this test left (as root, it could be anything of the test's).
struct KillLeftovers<'a>(&'a TestDir);

impl Drop for KillLeftovers<'_> {
    fn drop(&mut self) {
        for (run, pids) in pids_by_run(self.0) {
            for pid in pids {
                if alive(pid, &run) {
                    // SAFETY: a pid that carries this test's run id in its environment.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
    }
}

/// A job that leaves a `sleep` in its group, a `setsid` shell with a child and a SIGTERM-ignoring shell
/// behind: each run ends them all (SIGKILL after `stop_grace` for the stubborn one) before `run.finished`
/// and before its lease is released, so no run under `overlap: skip` starts while an earlier one's
/// processes live; and after the worker's SIGTERM, with a run ending, none of them is left.
#[test]
fn a_run_leaves_no_process_behind() {
    let dir = TestDir::new();
    let _cleanup = KillLeftovers(&dir);
    let path = dir.write_config(&config("leaver", &leaving_job(&dir)));
    let mut worker = Worker::spawn(path, &[]);
    let deadline = Instant::now() + Duration::from_secs(40);
    let finished = loop {
        let finished: BTreeSet<String> = worker
            .events("run.finished")
            .iter()
            .filter_map(|event| event["run_id"].as_str().map(str::to_string))
            .collect();
        // Checked as soon as each run is seen finished: its processes must be gone by then already.
        let left = survivors(&dir, &finished);
        assert!(
            left.is_empty(),
            "processes of finished runs alive: {left:?}"
        );
        let noted = pids_by_run(&dir);
        let complete = finished
            .iter()
            .all(|run| noted.get(run).map(BTreeSet::len) == Some(4));
        if finished.len() >= 3 && complete {
            break finished;
        }
        assert!(Instant::now() < deadline, "fewer than 3 runs finished");
        std::thread::sleep(Duration::from_millis(50));
    };
    for event in worker.events("run.finished") {
        assert_eq!(event["outcome"], "success", "{event}");
        // The stubborn shell takes the whole stop_grace (1.2 s) before its SIGKILL: the run outlasts the
        // next tick whenever it started.
        let duration = event["duration_ms"].as_u64().unwrap_or_default();
        assert!(duration >= 1_200, "{event}");
    }
    let ending = worker.events("run.ending_rest");
    assert!(ending.len() >= finished.len(), "{ending:?}");
    assert_eq!(
        dir.read("overlap").unwrap_or_default(),
        "",
        "runs overlapped"
    );
    // A run lasts past the next tick, which `overlap: skip` skips.
    let skipped = worker.events("tick.skipped");
    assert!(
        skipped.iter().any(|e| e["reason"] == "overlap"),
        "{skipped:?}"
    );

    // Stop while a run is under way: one not finished whose four processes wrote their pids.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pids_by_run(&dir)
        .iter()
        .any(|(run, pids)| !finished.contains(run) && pids.len() >= 4)
    {
        assert!(Instant::now() < deadline, "no further run started");
        std::thread::sleep(Duration::from_millis(20));
    }
    worker.signal(libc::SIGTERM);
    let status = worker
        .wait_timeout(Duration::from_secs(20))
        .expect("the worker stops after SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", worker.stderr());
    let every: BTreeSet<String> = pids_by_run(&dir).into_keys().collect();
    assert!(every.len() > finished.len(), "no run under way at the stop");
    let left = survivors(&dir, &every);
    assert!(
        left.is_empty(),
        "processes alive after the worker stopped: {left:?}"
    );
}
