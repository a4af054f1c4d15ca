//! The performance benchmark (`benches/lease`, run with `cargo bench --bench lease`) in smoke mode: every
//! item runs for about a second, so that the benchmark cannot rot while it is not part of the test command.
//!
//! The benchmark's code is compiled into this test binary by path. A smoke run measures nothing: figures
//! are not checked, only that every contender, scenario and worker phase ran and was reported — and that
//! no tick ran twice, which must hold under any load.

#[path = "../../benches/lease/bench.rs"]
mod bench;

use bench::cycle::Kind;

/// Every item of the benchmark runs end to end (5 redis-server nodes, the peers, a slow and a hung node,
/// 3 worker processes, the in-process batch race, the herd, the same on 3 etcd members) and reports every
/// contender and scenario.
#[test]
fn benchmark_runs_in_smoke_mode() {
    let _heavy = super::support::heavy();
    super::support::require_program("redis-server", "redis-server");
    super::support::require_program("etcd", "etcd-server");
    // The benchmark's own job, compiled as `cargo bench` compiles it: a probe that cannot be built or
    // does not record its runs fails here (the ledgers would be empty).
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let probe = bench::job::compile_probe(scratch.path())
        .unwrap_or_else(|why| panic!("the benchmark's probe: {why}"));
    let options = bench::Options {
        smoke: true,
        sections: vec![1, 2, 3, 4, 5, 6, 7],
        cycles: 20,
        contenders: Kind::ALL.to_vec(),
        current_thread: false,
        worker: Some(env!("CARGO_BIN_EXE_redcron").into()),
        probe: vec![probe.display().to_string()],
        etcd_herd: 20,
        stores: Vec::new(),
    };
    let report =
        bench::run(&options, &mut |_| {}).unwrap_or_else(|why| panic!("benchmark failed: {why}"));

    let scenarios: Vec<&str> = report.lease.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(scenarios, ["healthy", "slow", "hung"]);
    for (scenario, series) in &report.lease {
        let kinds: Vec<Kind> = series.iter().map(|s| s.kind).collect();
        assert_eq!(kinds, Kind::ALL, "{scenario}: every contender reported");
        for kind in [Kind::Floor, Kind::Lease, Kind::Claim] {
            let s = series
                .iter()
                .find(|s| s.kind == kind)
                .expect("listed above");
            // Refused or timed-out cycles are figures (a loaded machine makes them): some cycles completing
            // is what shows the contender ran.
            assert!(
                !s.samples.is_empty(),
                "{scenario}: {} completed no cycle: {s:?}",
                kind.name()
            );
        }
    }
    for heading in [
        "## 1. Lease cycle",
        "## 2. One slow node",
        "## 3–4. Tick to start",
        "## 4b. The lock alone",
        "## 4c. Cost per operation",
        "## 5. Worker memory",
        "## 6. The herd",
        "## 7. Every shared store beside Redis",
        "## Targets",
    ] {
        assert!(
            report.text.contains(heading),
            "missing {heading:?} in:\n{}",
            report.text
        );
    }

    let cluster = report.cluster.expect("item 3 ran");
    let load = &cluster.loads[0];
    assert!(
        load.once > 0,
        "no job ran in the smoke window: {load:?}\n{}",
        report.text
    );
    assert_eq!(load.duplicates, 0, "a tick ran twice: {load:?}");
    assert!(
        load.claim_round_trips.is_some(),
        "the counting proxies reported nothing: {load:?}"
    );
    assert!(
        cluster.idle_rss_kb.iter().all(|kb| *kb > 0),
        "no idle RSS: {cluster:?}"
    );
    let batch = &report.batches[0];
    assert_eq!(batch.twice, 0, "a job was won twice in one tick: {batch:?}");
    assert!(batch.once > 0, "the batch race won nothing: {batch:?}");
    assert!(batch.peer.is_some(), "the peer did not race: {batch:?}");
    assert_eq!(
        report.ops.len(),
        4,
        "claim, renew, history, release measured"
    );
    let herd = report.herd.expect("item 6 ran");
    // A herd job that did not start within the smoke's short window is a figure of a loaded machine; a
    // job run twice is a fault under any load.
    assert!(
        herd.twice == 0 && herd.once > 0,
        "the herd runs no job twice, and some at all: {herd:?}"
    );
    assert!(
        herd.peer.is_some_and(|peer| peer.twice == 0),
        "the peer raced once per job"
    );
    let versus = report.versus.expect("item 7 ran");
    let stores: Vec<&str> = versus.sides.iter().map(|s| s.store.name()).collect();
    assert_eq!(
        stores,
        [
            "Redis",
            "Redis (a Sentinel group)",
            "Redis Cluster",
            "etcd",
            "PostgreSQL",
            "MariaDB",
            "ZooKeeper"
        ]
    );
    for side in &versus.sides {
        assert!(!side.claim.is_empty(), "no claim timed: {side:?}");
        let (race, herd) = (&side.race, &side.herd);
        assert!(
            race.twice == 0 && race.once > 0,
            "{}: the race: {race:?}",
            side.store.name()
        );
        assert!(
            herd.twice == 0 && herd.once > 0,
            "{}: the herd runs no job twice, and some at all: {herd:?}",
            side.store.name()
        );
        let herd_race = &side.herd_race;
        assert!(
            herd_race.twice == 0 && herd_race.once > 0,
            "{}: the lock-alone herd wins no job twice, and some at all: {herd_race:?}",
            side.store.name()
        );
        let steady = &side.steady;
        assert!(
            steady.duplicates == 0 && steady.commands_per_run.is_some_and(|n| n > 0.0),
            "{}: the steady phase ran no tick twice and counted the store's requests: {steady:?}",
            side.store.name()
        );
    }
}

/// Item 8 (the dashboard's page of many jobs) runs end to end in smoke mode: 20 jobs, a few seconds, and
/// both phases report every job's row, a page weight, and the worker's render and store times.
#[test]
fn dashboard_item_runs_in_smoke_mode() {
    super::support::require_program("redis-server", "redis-server");
    let options = bench::Options {
        smoke: true,
        sections: vec![8],
        cycles: 20,
        contenders: Vec::new(),
        current_thread: false,
        worker: Some(env!("CARGO_BIN_EXE_redcron").into()),
        probe: Vec::new(),
        etcd_herd: 20,
        stores: Vec::new(),
    };
    let report =
        bench::run(&options, &mut |_| {}).unwrap_or_else(|why| panic!("benchmark failed: {why}"));
    let page = report.dashboard.expect("item 8 ran");
    assert_eq!(page.phases.len(), 2, "{}", report.text);
    for phase in &page.phases {
        assert_eq!(phase.rows, page.size.jobs, "{phase:?}");
        assert!(phase.bytes > 0 && phase.wire_bytes > 0, "{phase:?}");
        assert_eq!(phase.render.len(), page.size.requests, "{phase:?}");
        assert!(phase.store.p50().is_some_and(|d| !d.is_zero()), "{phase:?}");
    }
    assert!(
        report.text.contains("## 8. The dashboard"),
        "{}",
        report.text
    );
}

/// Item 9 (a Sentinel group's failovers and a Redis Cluster's) runs end to end in smoke mode: on each,
/// one crash and one planned failover, each followed by a claim won, with tokens in order.
#[test]
fn failover_item_runs_in_smoke_mode() {
    super::support::require_program("redis-server", "redis-server");
    let options = bench::Options {
        smoke: true,
        sections: vec![9],
        cycles: 20,
        contenders: Vec::new(),
        current_thread: false,
        worker: None,
        probe: Vec::new(),
        etcd_herd: 20,
        stores: Vec::new(),
    };
    let report =
        bench::run(&options, &mut |_| {}).unwrap_or_else(|why| panic!("benchmark failed: {why}"));
    let failovers = report.failovers.expect("item 9 ran");
    assert_eq!(
        (failovers.crashes.len(), failovers.planned.len()),
        (1, 1),
        "{}",
        report.text
    );
    assert_eq!(
        (
            failovers.cluster_crashes.len(),
            failovers.cluster_planned.len()
        ),
        (1, 1),
        "{}",
        report.text
    );
    assert_eq!(failovers.token_out_of_order, None, "{}", report.text);
    assert!(
        report
            .text
            .contains("## 9. A Sentinel group's failover and a Redis Cluster's"),
        "{}",
        report.text
    );
}

/// The counting proxy frames RESP values split across reads, and tells redcron's scripts apart.
#[test]
fn counting_proxy_frames_resp_and_classifies_scripts() {
    let mut resp = bench::proxy::Resp::default();
    let mut seen = Vec::new();
    assert_eq!(
        resp.feed(b"*2\r\n$3\r\nGET\r\n$1", |v| seen.push(v.to_vec())),
        0
    );
    assert_eq!(
        resp.feed(b"\r\nk\r\n*1\r\n$4\r\nPING\r\n", |v| seen.push(v.to_vec())),
        2
    );
    assert_eq!(seen[0], b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    let replies = b"*2\r\n$2\r\nok\r\n$1\r\n0\r\n+OK\r\n$-1\r\n:1\r\n-ERR x\r\n";
    assert_eq!(resp.feed(replies, |_| {}), 5);

    let acquire = "a".repeat(40);
    let release = "b".repeat(40);
    let shas = [acquire.as_str(), release.as_str()];
    let evalsha = |sha: &str| {
        format!("*5\r\n$7\r\nEVALSHA\r\n$40\r\n{sha}\r\n$1\r\n1\r\n$1\r\nk\r\n$1\r\nv\r\n")
    };
    assert_eq!(
        bench::proxy::classify(&shas, evalsha(&release).as_bytes()),
        1
    );
    assert_eq!(
        bench::proxy::classify(&shas, evalsha(&acquire).as_bytes()),
        0
    );
    assert_eq!(bench::proxy::classify(&shas, b"*1\r\n$4\r\nPING\r\n"), 2);
}

/// Percentiles are nearest-rank: p99 of 100 samples is the 99th.
#[test]
fn percentiles_are_nearest_rank() {
    let mut samples = bench::stats::Samples::default();
    (1..=100).for_each(|n| samples.push(std::time::Duration::from_millis(n)));
    assert_eq!(samples.p50(), Some(std::time::Duration::from_millis(50)));
    assert_eq!(samples.p99(), Some(std::time::Duration::from_millis(99)));
}
