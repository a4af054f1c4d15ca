//! Item 7, every shared store beside Redis in the same run: one uncontended claim, the lock-alone race,
//! the herd and a steady load, on 5 Redis nodes, one Sentinel group (a master, a replica, a Sentinel:
//! each answer waits for the replica's `WAIT`), a Redis Cluster (3 masters with a replica each, each
//! master's answer waiting for its replica's `WAIT`), 3 etcd members, one PostgreSQL and one MariaDB server
//! and 3 ZooKeeper members, with each one's ratio to Redis.
//!
//! One item rather than a `--store` option across the others: the ratios must come from one run on one
//! machine at one load, and the other items are Redis-shaped (the Redlock peers of items 1–2 and the
//! RESP-counting proxies of items 3–4 have no etcd counterpart). The three measurements reuse the other
//! items' code on either store: [`super::batch::race_ticks`] for the race and [`super::herd::on_nodes`]
//! for the herd. The stores' own counters differ: Redis counts commands (summed over its 5 nodes), etcd
//! counts Raft entries committed (the same on every member); CPU is summed over the nodes either way.
//! A steady phase (item 3's load: 10 jobs every second on 3 workers) gives the store's traffic per run
//! from its own counters: Redis commands summed over the nodes, etcd requests answered
//! (`grpc_server_handled_total`) summed over the members, each request being answered by one.

use std::path::Path;
use std::time::{Duration, Instant};

use redcron::lock::{ClaimOutcome, ClaimRequest, LockSettings, Overlap};
use redcron::schedule::Tick;

use super::batch::{race_once, race_ticks, Batch};
use super::cluster::Load;
use super::cycle::settings;
use super::herd::{self, Herd};
use super::nodes::{Backend, Cluster, Counters};
use super::peer::CONTENDERS;
use super::stats::{ms, quotient, Samples, Table, Verdict};
use super::workers::{
    config_yaml, now_ms, read_ledger, sleep_until_ms, spawn, stop_all, wait_started,
};

/// The steady phase: jobs, each due every second, on this many workers.
const STEADY_JOBS: usize = 10;
const STEADY_WORKERS: usize = 3;

/// How much of each measurement to run.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Uncontended claims timed, after 5 not timed.
    pub claims: usize,
    /// Jobs per tick and ticks of the lock-alone race.
    pub race_jobs: usize,
    pub race_ticks: usize,
    /// Jobs of the herd, the same on both stores.
    pub herd: usize,
    /// Ticks of the lock-alone herd: the herd's jobs raced by 3 contenders in this process, no processes.
    pub herd_race_ticks: usize,
    /// Ticks measured in the steady phase.
    pub steady_seconds: u64,
    /// Whole seconds the steady phase's workers get to settle once started, before its window: 2 for
    /// figures; a smoke run checks no figure (only that no tick ran twice and requests were counted).
    pub settle_seconds: u64,
}

/// What one store measured.
#[derive(Debug, Clone)]
pub struct Side {
    pub store: Backend,
    pub nodes: usize,
    /// One claimant claims a new tick of one job, then releases it.
    pub claim: Samples,
    pub release: Samples,
    /// Uncontended claims that were not won (no quorum within `node_timeout`, …).
    pub failed: usize,
    pub race: Batch,
    /// The lock-alone race for the herd's jobs at one tick: the claims alone, which the herd's own claim
    /// time no longer is on Redis (a worker's later attempts go out among its first jobs' spawns).
    pub herd_race: Batch,
    pub herd: Herd,
    pub steady: Load,
    /// The store's CPU (all nodes) per run in the steady phase.
    pub steady_cpu_per_run: Option<f64>,
}

/// Both stores, Redis first.
#[derive(Debug, Clone)]
pub struct Versus {
    pub sizes: Sizes,
    pub sides: Vec<Side>,
}

/// The lock settings of the item: those of items 1–4, with etcd's default `node_timeout` (500 ms: a
/// write is a Raft commit, fsynced on a majority) on etcd.
fn settings_for(store: Backend) -> LockSettings {
    match store {
        Backend::Redis | Backend::Embedded => settings(),
        Backend::RedisSentinel
        | Backend::RedisCluster
        | Backend::Etcd
        | Backend::Postgres
        | Backend::Mariadb
        | Backend::Zookeeper => LockSettings {
            node_timeout: Duration::from_millis(500),
            ..settings()
        },
    }
}

/// The name `--stores` knows a store by.
fn short(store: Backend) -> &'static str {
    match store {
        Backend::Redis => "redis",
        Backend::RedisSentinel => "redis-sentinel",
        Backend::RedisCluster => "redis-cluster",
        Backend::Etcd => "etcd",
        Backend::Postgres => "postgres",
        Backend::Mariadb => "mariadb",
        Backend::Zookeeper => "zookeeper",
        Backend::Embedded => "embedded",
    }
}

/// Runs every measurement on 5 Redis nodes, then on each other store in turn (those of `only`, if any).
pub fn run(
    worker: &Path,
    probe: &[String],
    sizes: Sizes,
    only: &[String],
    print: &mut dyn FnMut(&str),
) -> Result<Versus, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let mut sides = Vec::new();
    let stores = [
        (Backend::Redis, 5),
        (Backend::RedisSentinel, 1),
        (Backend::RedisCluster, 1),
        (Backend::Etcd, 3),
        (Backend::Postgres, 1),
        (Backend::Mariadb, 1),
        (Backend::Zookeeper, 3),
    ];
    let chosen = |store: Backend| {
        store == Backend::Redis || only.is_empty() || only.iter().any(|name| name == short(store))
    };
    for (store, n) in stores.into_iter().filter(|(store, _)| chosen(*store)) {
        let nodes = store.start_nodes(n);
        let (claim, release, failed) = runtime.block_on(latency(&nodes, sizes.claims))?;
        let herd_race = runtime.block_on(race(&nodes, sizes.herd, sizes.herd_race_ticks))?;
        let race = runtime.block_on(race(&nodes, sizes.race_jobs, sizes.race_ticks))?;
        let herd = herd::on_nodes(&nodes, worker, probe, sizes.herd)?;
        let (steady, steady_cpu_per_run) = steady(&nodes, worker, probe, sizes)?;
        sides.push(Side {
            store,
            nodes: n,
            claim,
            release,
            failed,
            race,
            herd_race,
            herd,
            steady,
            steady_cpu_per_run,
        });
    }
    let versus = Versus { sizes, sides };
    print(&table(&versus));
    Ok(versus)
}

/// Item 3's steady load on `nodes`: [`STEADY_WORKERS`] workers run [`STEADY_JOBS`] jobs every second;
/// once settled (`sizes.settle_seconds`), over `sizes.steady_seconds` ticks, exactly-once from the jobs' ledger and the store's requests per run
/// ([`requests`]) in `commands_per_run`.
fn steady(
    nodes: &Cluster,
    worker: &Path,
    probe: &[String],
    sizes: Sizes,
) -> Result<(Load, Option<f64>), String> {
    let seconds = sizes.steady_seconds;
    nodes.flush();
    let dir = tempfile::Builder::new()
        .prefix("redcron-bench-steady-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let ledger = dir.path().join("ledger");
    let command: Vec<String> = (probe.iter().cloned())
        .chain([ledger.display().to_string()])
        .collect();
    let mut workers = Vec::new();
    for w in 0..STEADY_WORKERS {
        let config = dir.path().join(format!("steady-w{w}.yaml"));
        let (id, urls) = (format!("w{w}"), nodes.urls());
        let yaml = config_yaml(
            nodes.backend(),
            &urls,
            &id,
            STEADY_JOBS,
            "* * * * * *",
            &command,
        );
        std::fs::write(&config, yaml).map_err(|e| e.to_string())?;
        workers.push(spawn(worker, &config));
    }
    wait_started(&workers, Duration::from_secs(30))?;
    // Whole seconds for the workers to settle; the counters are read half a second before the window's
    // first tick and half a second after its last.
    let first = (now_ms() / 1000 + 1 + sizes.settle_seconds as i64) * 1000;
    let last = first + (seconds.max(1) as i64 - 1) * 1000;
    sleep_until_ms(first - 500);
    let (before, cpu_before) = (requests(nodes), nodes.total_usage().cpu);
    sleep_until_ms(last + 500);
    let spent = requests(nodes).saturating_sub(before);
    let cpu = nodes.total_usage().cpu - cpu_before;
    std::thread::sleep(Duration::from_millis(1500));
    stop_all(&mut workers);
    let mut load = Load {
        jobs: STEADY_JOBS,
        ticks: seconds.max(1) as usize,
        ..Load::default()
    };
    read_ledger(&ledger, first, last, &mut load)?;
    let runs = (load.once + load.duplicates).max(1) as f64;
    load.commands_per_run = Some(spent as f64 / runs);
    Ok((load, Some(cpu / runs)))
}

/// The store's own count of what it was asked: Redis commands summed over the nodes ([`Counters`]),
/// etcd requests answered (`grpc_server_handled_total`, every method) summed over the members,
/// ZooKeeper requests received (`srvr`'s `Received`) summed over the members, SQL statements or
/// transactions ([`Counters`]).
fn requests(nodes: &Cluster) -> u64 {
    if let Cluster::Zookeeper(ensemble) = nodes {
        // Every request a member took from its clients (reads, writes, pings): `srvr`'s `Received`.
        return (0..ensemble.len())
            .filter_map(|i| ensemble.srvr(i))
            .filter_map(|answer| {
                answer
                    .lines()
                    .find_map(|l| l.strip_prefix("Received: "))?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .sum();
    }
    let Cluster::Etcd(cluster) = nodes else {
        return nodes.total_usage().commands;
    };
    let handled = |text: String| -> f64 {
        text.lines()
            .filter(|line| line.starts_with("grpc_server_handled_total{"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    (0..cluster.len())
        .filter_map(|i| cluster.metrics(i))
        .map(handled)
        .sum::<f64>() as u64
}

/// `claims` claims of new ticks of one job by one claimant, each released before the next.
async fn latency(nodes: &Cluster, claims: usize) -> Result<(Samples, Samples, usize), String> {
    let store = nodes
        .open(settings_for(nodes.backend()))
        .map_err(|e| e.to_string())?;
    let (mut claim, mut release, mut failed) = (Samples::default(), Samples::default(), 0);
    for i in 0..claims + 5 {
        let tick = Tick(1_000 * (i as i64 + 1));
        let request = ClaimRequest::new("w", "latency", tick, Overlap::Skip, "bench");
        let started = Instant::now();
        let outcome = store.claim(&request).await;
        let claimed = started.elapsed();
        let ClaimOutcome::Won(lease) = outcome else {
            failed += usize::from(i >= 5);
            continue;
        };
        let started = Instant::now();
        store.release(&lease).await;
        if i >= 5 {
            claim.push(claimed);
            release.push(started.elapsed());
        }
    }
    Ok((claim, release, failed))
}

/// The lock-alone race of item 4b on `nodes`: 3 stores race for `jobs` jobs at each of `ticks` ticks,
/// with the nodes' own counters per (job, tick).
async fn race(nodes: &Cluster, jobs: usize, ticks: usize) -> Result<Batch, String> {
    let stores = (0..CONTENDERS)
        .map(|_| {
            nodes
                .open(settings_for(nodes.backend()))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let names: Vec<String> = (0..jobs).map(|j| format!("r{jobs}-{j}")).collect();
    race_once(&stores, &names, Tick(1)).await;
    let before = nodes.total_usage();
    let mut batch = race_ticks(&stores, &names, ticks).await;
    let usage = before.until(nodes.total_usage());
    let claims = (jobs * ticks).max(1) as f64;
    batch.commands_per_claim = usage.commands as f64 / claims;
    batch.redis_cpu_per_claim = usage.cpu / claims;
    Ok(batch)
}

/// A row's figure of one store, for its ratio to Redis.
type Figure<'a> = &'a dyn Fn(&Side) -> Option<f64>;

fn table(versus: &Versus) -> String {
    let Some((redis, others)) = versus.sides.split_first() else {
        return String::new();
    };
    let mut header = vec![String::new()];
    header.extend(versus.sides.iter().map(|side| {
        let unit = match side.store {
            Backend::Redis => "nodes",
            Backend::RedisSentinel => "group",
            Backend::RedisCluster => "cluster",
            Backend::Etcd | Backend::Zookeeper => "members",
            _ => "server",
        };
        format!("{} ({} {unit})", side.store.name(), side.nodes)
    }));
    header.extend(
        others
            .iter()
            .map(|side| format!("{} ÷ Redis", side.store.name())),
    );
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut table = Table::new(&header);
    let mut time = |label: &str, of: &dyn Fn(&Side) -> Option<Duration>| {
        let mut cells = vec![label.to_string()];
        cells.extend(versus.sides.iter().map(|side| ms(of(side))));
        cells.extend(others.iter().map(|side| {
            quotient(of(side), of(redis)).map_or("–".to_string(), |q| format!("{q:.1}×"))
        }));
        table.row(cells);
    };
    time("uncontended claim p50 ms", &|s| s.claim.p50());
    time("uncontended claim p99 ms", &|s| s.claim.p99());
    time("release p50 ms", &|s| s.release.p50());
    time("lock alone: claim p50 ms", &|s| s.race.claim.p50());
    time("lock alone: race p50 ms (with releases)", &|s| {
        s.race.race.p50()
    });
    // The claims alone: since a Redis worker claims a large batch in attempts of 128 that go out among its
    // first jobs' spawns, the herd's last win below waits for those spawns on Redis.
    time("lock alone, herd: settled p50 ms (no processes)", &|s| {
        s.herd_race.claim.p50()
    });
    // The first win marks the end of a worker's reads (and grants): first → last won is its writes.
    time("herd: tick→first won ms", &|s| {
        s.herd.tick_to_won.percentile(0.0)
    });
    time("herd: claim time ms (tick→last won)", &|s| {
        s.herd.claim_time()
    });
    time("herd: herd time ms (tick→last start)", &|s| {
        s.herd.herd_time()
    });
    time("herd: tick→start p50 ms", &|s| s.herd.tick_to_start.p50());
    let ratio = |of: &dyn Fn(&Side) -> Option<f64>, side: &Side| match (of(side), of(redis)) {
        (Some(a), Some(b)) => format!("{:.2}×", a / b.max(1e-12)),
        _ => "–".to_string(),
    };
    let mut row = |label: &str, of: &dyn Fn(&Side) -> String, of_number: Option<Figure>| {
        let mut cells = vec![label.to_string()];
        cells.extend(versus.sides.iter().map(of));
        cells.extend(
            others
                .iter()
                .map(|side| of_number.map_or("–".to_string(), |f| ratio(f, side))),
        );
        table.row(cells);
    };
    row(
        "uncontended claims not won",
        &|s| format!("{} of {}", s.failed, s.failed + s.claim.len()),
        None,
    );
    // Once / twice / never, as each measurement counts them.
    let tally = |once: usize, twice: usize, never: usize| format!("{once} / {twice} / {never}");
    let race = |r: &Batch| tally(r.once, r.twice, r.unclaimed);
    row(
        "lock alone: won exactly once / twice / never",
        &|s| race(&s.race),
        None,
    );
    row(
        "lock alone, herd: won exactly once / twice / never",
        &|s| race(&s.herd_race),
        None,
    );
    row(
        "herd: claimed exactly once / twice / never",
        &|s| tally(s.herd.once, s.herd.twice, s.herd.missing),
        None,
    );
    let runs = |s: &Side| {
        let runs: Vec<String> = s
            .herd
            .runs_per_worker
            .iter()
            .map(|(w, n)| format!("{w} {n}"))
            .collect();
        runs.join(", ")
    };
    row("herd: runs per worker", &runs, None);
    row(
        "lock alone: store's count /claim (see above)",
        &|s| format!("{:.1}", s.race.commands_per_claim),
        Some(&|s| Some(s.race.commands_per_claim)),
    );
    row(
        "lock alone: store CPU µs /claim (all nodes)",
        &|s| format!("{:.0}", s.race.redis_cpu_per_claim * 1e6),
        Some(&|s| Some(s.race.redis_cpu_per_claim)),
    );
    row(
        &format!("steady ({STEADY_JOBS} jobs/s, {STEADY_WORKERS} workers): store's count /run"),
        &|s| {
            s.steady
                .commands_per_run
                .map_or("–".into(), |c| format!("{c:.1}"))
        },
        Some(&|s| s.steady.commands_per_run),
    );
    row(
        "steady: store CPU µs /run (all nodes)",
        &|s| {
            s.steady_cpu_per_run
                .map_or("–".into(), |c| format!("{:.0}", c * 1e6))
        },
        Some(&|s| s.steady_cpu_per_run),
    );
    row(
        "steady: runs exactly once / twice / never",
        &|s| tally(s.steady.once, s.steady.duplicates, s.steady.missing),
        None,
    );
    row(
        "herd: store's count /claim",
        &|s| {
            s.herd
                .commands_per_claim()
                .map_or("–".into(), |c| format!("{c:.1}"))
        },
        None,
    );
    row(
        "herd: store CPU µs /claim (all nodes)",
        &|s| {
            s.herd
                .cpu_per_claim()
                .map_or("–".into(), |c| format!("{:.0}", c * 1e6))
        },
        Some(&|s| s.herd.cpu_per_claim()),
    );
    let sizes = versus.sizes;
    format!(
        "\n## 7. Every shared store beside Redis: a claim, the lock alone, a herd of {} jobs\n\n\
         In this run, on this machine. Uncontended claim: one claimant claims a new tick of one job and \
         releases it, {} times. Lock alone: item 4b's race, 3 contenders in this process for {} jobs at \
         one tick, {} ticks, no proxies; the same for the herd's {} jobs, {} ticks (the claims alone: a \
         worker's herd claims on Redis go out among its first jobs' spawns). Herd: item 6's, {} jobs due at \
         one instant on 3 worker processes. Redis: `node_timeout` 50 ms, no persistence; etcd: `node_timeout` 500 ms (its \
         default), every write a Raft commit fsynced on a majority; PostgreSQL and MariaDB: one server each, \
         `node_timeout` 500 ms (the default), fsync on (`fsync`, `innodb_flush_log_at_trx_commit = 1`); \
         ZooKeeper: 3 members, `node_timeout` 500 ms, every write a quorum commit fsynced (`forceSync`, \
         its default). The store's count: Redis commands summed over the nodes; etcd Raft entries committed \
         (`etcd_server_proposals_committed_total`, one member's) and, in the steady phase, requests answered \
         (`grpc_server_handled_total`, summed over the members); ZooKeeper requests received (`srvr`, summed \
         over the members: reads, writes and pings); PostgreSQL transactions \
         (`xact_commit + xact_rollback` of `pg_stat_database`: each statement outside a transaction is one); \
         MariaDB statements (`Questions`); ZooKeeper transactions (the counter of a member's last zxid). \
         CPU summed over the nodes (`INFO cpu`, \
         `process_cpu_seconds_total`, the SQL server's and the ZooKeeper members' processes from `/proc`). Steady: item 3's load, {} \
         jobs every second on {} workers for {} s.\n\n{}",
        sizes.herd,
        sizes.claims,
        sizes.race_jobs,
        sizes.race_ticks,
        sizes.herd,
        sizes.herd_race_ticks,
        sizes.herd,
        STEADY_JOBS,
        STEADY_WORKERS,
        sizes.steady_seconds,
        table.render()
    )
}

/// What the contenders were told of the (job, tick)s nobody won, if any: `; 198 won by nobody, told
/// no_quorum (…) / contended / …: 150, …`.
fn undecided(race: &Batch) -> String {
    if race.undecided.is_empty() {
        return String::new();
    }
    let told: Vec<String> = race
        .undecided
        .iter()
        .map(|(told, n)| format!("{told}: {n}"))
        .collect();
    format!(
        "; {} won by nobody, the contenders told {}",
        race.unclaimed,
        told.join(", ")
    )
}

/// Exactly once on both stores, in the race and in the herd.
pub fn verdicts(versus: &Versus) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for side in &versus.sides {
        let (herd, name) = (&side.herd, side.store.name());
        for (race, whose) in [(&side.herd_race, "the herd's "), (&side.race, "")] {
            verdicts.push(Verdict::new(
                format!(
                    "{name}: lock alone, each of {whose}{} jobs won exactly once per tick",
                    race.jobs
                ),
                format!(
                    "{} of {}, {} twice{}",
                    race.once,
                    race.jobs * race.ticks,
                    race.twice,
                    undecided(race)
                ),
                Some(race.twice == 0 && race.unclaimed == 0),
            ));
        }
        verdicts.push(Verdict::new(
            format!(
                "{name}: herd, each of {} jobs claimed exactly once",
                herd.jobs
            ),
            format!(
                "{} of {}, {} twice, {} never",
                herd.once, herd.jobs, herd.twice, herd.missing
            ),
            Some(herd.twice == 0 && herd.missing == 0),
        ));
        let steady = &side.steady;
        verdicts.push(Verdict::new(
            format!("{name}: steady load, no run twice"),
            format!(
                "{} once, {} twice, {} never",
                steady.once, steady.duplicates, steady.missing
            ),
            Some(steady.duplicates == 0),
        ));
    }
    verdicts
}
