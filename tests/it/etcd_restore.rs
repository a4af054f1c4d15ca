//! An etcd cluster restored from a snapshot, end to end: the restored cluster's revisions restart at the
//! snapshot's, and so do the jobs' fences — but a token is `max(fence + 1, T_ms × 1000)`, so the runs on
//! the restored cluster still carry tokens above every run before it, as on the other stores.

use std::time::{Duration, Instant};

use crate::support::{worker_config, Backend, EtcdCluster, TestDir, Worker};
use crate::worker::{ledger, ledger_job};

/// Waits until the ledger holds at least `n` runs; panics with what the worker said otherwise.
fn wait_runs(dir: &TestDir, n: usize, worker: &Worker) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while dir.ledger_lines().len() < n {
        assert!(
            Instant::now() < deadline,
            "fewer than {n} runs within 30 s; the worker said:\n{:?}",
            worker.lines()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stops `worker` with SIGTERM and waits for it to exit.
fn stop(mut worker: Worker) {
    worker.signal(libc::SIGTERM);
    assert!(
        worker.wait_timeout(Duration::from_secs(20)).is_some(),
        "the worker did not stop"
    );
}

/// A job every second on a 3-member cluster: a few runs, `etcdctl snapshot save`, more runs; then the
/// snapshot restored into a fresh 3-member cluster (`etcdctl snapshot restore`) and a worker on it. Its
/// runs' tokens are above every token before the restore (with the revision as the token, they went
/// down: the restored cluster's revisions start again at the snapshot's), and tokens rise in tick order
/// throughout.
#[test]
fn tokens_rise_across_a_restore_from_a_snapshot() {
    let dir = TestDir::new();
    let jobs = ledger_job("j1", "* * * * * *", &dir.ledger());
    let snapshot = dir.join("snapshot.db");

    let before = EtcdCluster::start();
    let yaml = |cluster: &EtcdCluster, name: &str| {
        let text = worker_config(Backend::Etcd, &cluster.endpoints(), "  id: w0\n", &jobs);
        dir.write(name, text)
    };
    let worker = Worker::spawn(yaml(&before, "before.yaml"), &[]);
    wait_runs(&dir, 3, &worker);
    before.snapshot_save(&snapshot);
    let at_snapshot = dir.ledger_lines().len();
    wait_runs(&dir, at_snapshot + 3, &worker);
    stop(worker);
    drop(before);
    let runs_before = dir.ledger_lines().len();
    let highest_before = ledger(&dir)
        .values()
        .flatten()
        .map(|(token, _)| *token)
        .max()
        .expect("runs before the restore");

    // The restored cluster has forgotten every claim and fence written after the snapshot: a worker that
    // started within the last run's window (a second, for a job every second) would race that tick again,
    // and win it at the same floor token — the limit of a restore that docs/protocol.md states. Start
    // after that window, to test what a restore must keep: tokens above every earlier run's.
    std::thread::sleep(Duration::from_millis(2_100));
    let after = EtcdCluster::restored_from(&snapshot, 3);
    let worker = Worker::spawn(yaml(&after, "after.yaml"), &[]);
    wait_runs(&dir, runs_before + 3, &worker);
    stop(worker);

    let runs = ledger(&dir);
    let mut last = 0;
    for ((_, tick), entries) in &runs {
        assert_eq!(entries.len(), 1, "{tick} ran {entries:?}");
        let token = entries[0].0;
        assert!(
            token > last,
            "token {token} at {tick} after {last}: {runs:?}"
        );
        last = token;
    }
    let after_restore: Vec<u64> = runs
        .values()
        .flatten()
        .map(|(token, _)| *token)
        .filter(|token| *token > highest_before)
        .collect();
    assert!(
        after_restore.len() >= 3,
        "the runs on the restored cluster are not above {highest_before}: {runs:?}"
    );
    eprintln!(
        "{at_snapshot} runs before the snapshot, {} after it, highest token {highest_before}; on the \
         restored cluster {after_restore:?}",
        runs_before - at_snapshot
    );
}
