//! Garbage for the store, planted straight into it as no `redcron` would write it: trigger requests with
//! absurd times, that are not JSON, that lack fields, carry a bad id or are huge; member records that are
//! not announcements; a history entry that is not one. Shared by `store_garbage` (one worker, every kind,
//! once) and the chaos test (a few plants per run, while faults go on).
//!
//! Every write here is bounded in time and returns what failed instead of panicking: the chaos harness
//! plants while nodes are killed and hung, and must go on. On a SQL server the same garbage goes into
//! the workers' tables as rows (a request, a member, an entry each), through the server's own client;
//! the caller plants only while the server serves (a hung one would hold the client for its 30 s bound).
//! On ZooKeeper it goes into the store's nodes under the chroot (`/redcron/triggers/<id>`,
//! `/redcron/members/<id>`, `/redcron/history/<job>/<tick>-<id>`) through the harness's own client; the
//! ensemble has no expiring nodes, so a plant stays for the rest of the run.

use std::time::Duration;

use chrono::Utc;

use testkit::zookeeper::{WireError, ZkSession, NODE_EXISTS};
use testkit::{SqlKind, SqlServer, ZkEnsemble};

use testkit::sharded::ShardedRedis;

use crate::support::{Cluster, EtcdCluster, RedisCluster};

/// How long one node (or the etcd cluster) may take to take a plant.
const TIMEOUT: Duration = Duration::from_millis(1_000);
/// The key prefix of the workers (the default `redis.key_prefix` and `etcd.key_prefix`).
const PREFIX: &str = "redcron";

/// Where garbage goes: some nodes of a Redis cluster, written directly (not through any proxy), or an etcd
/// cluster through a plain client.
pub enum Target<'a> {
    Redis {
        nodes: &'a RedisCluster,
        on: Vec<usize>,
    },
    Etcd(&'a EtcdCluster),
    /// A SQL server, written with SQL as its administrator into the workers' tables (`redcron_*`).
    Sql(&'a SqlServer),
    /// A ZooKeeper ensemble, written through the harness's own client into the store's nodes.
    Zookeeper(&'a ZkEnsemble),
    /// A Redis Cluster, each key written on the master of its slot, under the names the store gives it
    /// on a cluster (`<prefix>:{triggers}`, `<prefix>:{members}`).
    Sharded(&'a ShardedRedis),
}

impl<'a> Target<'a> {
    /// Every node of `cluster`.
    pub fn everywhere(cluster: &'a Cluster) -> Target<'a> {
        match cluster {
            Cluster::Redis(nodes) => Target::Redis {
                nodes,
                on: (0..nodes.len()).collect(),
            },
            Cluster::Sentinel(group) => Target::Redis {
                nodes: &group.data,
                on: vec![group.master().expect("the group has a master")],
            },
            Cluster::Etcd(members) => Target::Etcd(members),
            Cluster::Embedded(_) => {
                panic!("the embedded store's garbage is planted in its file (store_garbage.rs)")
            }
            Cluster::Sql(server) => Target::Sql(server),
            Cluster::Zookeeper(members) => Target::Zookeeper(members),
            Cluster::SharedZookeeper(_) | Cluster::SharedSharded(_) => {
                panic!("garbage is planted at the store's default prefix: on an ensemble of the test's own")
            }
            Cluster::Sharded(cluster) => Target::Sharded(cluster),
        }
    }
}

/// A request id: `tag` (two hex digits), then `n` in 30 — the 32 hex digits of a real id.
fn request_id(tag: u8, n: u8) -> String {
    format!("{tag:02x}{n:0>30x}")
}

/// Garbage trigger requests for `job`: `(store key, stored value)`, every key starting with `tag` in hex
/// (so that plants with different tags never share a key). Every one names `job` where it names a job at
/// all, so that only its validation keeps it from being raced. With `huge`, two entries of that many
/// bytes: a request whose `by` is that long, and a blob that is nothing at all.
pub fn trigger_requests(job: &str, tag: u8, huge: Option<usize>) -> Vec<(String, String)> {
    let now = Utc::now().to_rfc3339();
    let later = (Utc::now() + chrono::Duration::seconds(30)).to_rfc3339();
    let request = |id: &str, requested_at: &str, not_after: &str, by: &str| {
        serde_json::json!({"id": id, "job": job, "requested_at": requested_at, "not_after": not_after, "by": by})
            .to_string()
    };
    let id = |n: u8| request_id(tag, n);
    let mut entries = vec![
        // The review's request: its window ends in the year 262142.
        (
            id(1),
            request(&id(1), &now, "+262142-12-31T23:59:30Z", "mallory@x"),
        ),
        // Asked for in the year 262142 too.
        (
            id(2),
            request(
                &id(2),
                "+262142-12-31T23:59:00Z",
                "+262142-12-31T23:59:30Z",
                "mallory@x",
            ),
        ),
        // A window that ends before it begins.
        (id(3), request(&id(3), &later, &now, "mallory@x")),
        // Not JSON, JSON of the wrong shape, fields missing or of the wrong type.
        (id(0xa), "not json {".into()),
        (id(0xb), "[1, 2, 3]".into()),
        (
            id(4),
            serde_json::json!({"id": id(4), "job": job}).to_string(),
        ),
        (
            id(5),
            serde_json::json!({"id": 5, "job": job, "requested_at": now, "not_after": later})
                .to_string(),
        ),
        // An id that is no request id (it ends up in store keys).
        (
            id(0xc),
            request(&format!("../../x:{{{job}}}"), &now, &later, "mallory@x"),
        ),
    ];
    if let Some(len) = huge {
        entries.push((id(6), request(&id(6), &now, &later, &"x".repeat(len))));
        entries.push((id(0xd), "x".repeat(len)));
    }
    entries
}

/// Two member records that no worker announced: `<prefix>-1` (not JSON) and `<prefix>-2` (a `host` of
/// `huge` bytes), as of now: `(id, stored value)`.
pub fn members(prefix: &str, huge: usize) -> Vec<(String, String)> {
    let now = Utc::now().timestamp_millis();
    let id = |n: u8| format!("{prefix}-{n}");
    let big = serde_json::json!({"id": id(2), "host": "h".repeat(huge), "started_at": "2026-11-23T10:00:00Z"});
    vec![
        (id(1), format!("{now} not json")),
        (id(2), format!("{now} {big}")),
    ]
}

/// Writes `entries` as trigger requests; on Redis, with an expiry at `expires_ms` (Unix ms) in the set the
/// nodes drop requests by, or none (kept for good). Returns what failed, per node.
pub fn plant_triggers(
    target: &Target<'_>,
    entries: &[(String, String)],
    expires_ms: Option<i64>,
) -> Vec<String> {
    plant_keyed(target, "triggers", entries, expires_ms)
}

/// Writes `entries` (from [`members`]) as member records, alive for an hour. Returns what failed.
pub fn plant_members(target: &Target<'_>, entries: &[(String, String)]) -> Vec<String> {
    let alive_until = Utc::now().timestamp_millis() + 3_600_000;
    plant_keyed(target, "members", entries, Some(alive_until))
}

/// Writes `entries` under `<prefix>:<kind>`: on Redis into that hash, each id also into the sorted set
/// `<prefix>:<kind>:expiry` at `expires_ms` if given; on etcd as `<prefix>:<kind>/<id>`.
fn plant_keyed(
    target: &Target<'_>,
    kind: &str,
    entries: &[(String, String)],
    expires_ms: Option<i64>,
) -> Vec<String> {
    match target {
        Target::Redis { nodes, on } => on_nodes(nodes, on, |pipe| {
            for (id, value) in entries {
                pipe.cmd("HSET")
                    .arg(format!("{PREFIX}:{kind}"))
                    .arg(id)
                    .arg(value)
                    .ignore();
                if let Some(at) = expires_ms {
                    pipe.cmd("ZADD")
                        .arg(format!("{PREFIX}:{kind}:expiry"))
                        .arg(at)
                        .arg(id)
                        .ignore();
                }
            }
        }),
        Target::Sql(server) => {
            let rows: Vec<(String, String)> = entries
                .iter()
                .map(|(id, value)| (format!("{kind}/{id}"), match kind {
                    // A member row: its id, when it was seen, its announcement (the stored value is
                    // `<seen ms> <announcement>`, as on Redis), alive until `expires_ms`.
                    "members" => {
                        let (seen, member) = value.split_once(' ').unwrap_or(("0", value));
                        let until = expires_ms.unwrap_or(i64::MAX / 1000);
                        format!(
                            "INSERT INTO {PREFIX}_members (id, seen_ms, member, expires_us, expired_ms) \
                             VALUES ({}, {}, {}, {}, {until})",
                            literal(server.kind(), id),
                            seen.parse::<i64>().unwrap_or(0),
                            literal(server.kind(), member),
                            until.saturating_mul(1000),
                        )
                    }
                    // A trigger request row: its id, the job it names (the request's own, or the one
                    // named in the id's plant), the request, kept until `expires_ms` (or for good).
                    _ => format!(
                        "INSERT INTO {PREFIX}_triggers (id, job, request, expires_ms) VALUES ({}, {}, {}, {})",
                        literal(server.kind(), id),
                        literal(server.kind(), &job_of(value)),
                        literal(server.kind(), value),
                        expires_ms.unwrap_or(i64::MAX),
                    ),
                }))
                .collect();
            exec_sql(server, &rows)
        }
        Target::Sharded(cluster) => {
            let base = format!("{PREFIX}:{{{kind}}}");
            let failed = on_master(cluster, &base, |pipe| {
                for (id, value) in entries {
                    pipe.cmd("HSET").arg(&base).arg(id).arg(value).ignore();
                    if let Some(at) = expires_ms {
                        pipe.cmd("ZADD")
                            .arg(format!("{base}:expiry"))
                            .arg(at)
                            .arg(id)
                            .ignore();
                    }
                }
            });
            // The hash and its expiry set share a slot: a failure fails every entry.
            failed
                .iter()
                .flat_map(|why| {
                    entries
                        .iter()
                        .map(move |(id, _)| format!("cluster: {kind}/{id}: {why}"))
                })
                .collect()
        }
        // No expiry on ZooKeeper: a node stays until deleted (the store deletes requests only once
        // they are read as expired, which garbage never is).
        Target::Zookeeper(members) => create_all(
            members,
            entries
                .iter()
                .map(|(id, value)| (format!("/{PREFIX}/{kind}/{id}"), value.clone()))
                .collect(),
        ),
        // On etcd the same expiry, as an etcd lease of the time left: garbage that stayed for good made
        // every worker read megabytes of it each second by the end of a long chaos run, and the cluster
        // too slow to take a member back (the soaks' "not healthy within 20 s").
        Target::Etcd(members) => put_all(
            members,
            entries
                .iter()
                .map(|(id, value)| (format!("{PREFIX}:{kind}/{id}"), value.clone()))
                .collect(),
            expires_ms.map(|at| {
                let left = at.saturating_sub(chrono::Utc::now().timestamp_millis());
                Duration::from_millis(u64::try_from(left).unwrap_or(0)).max(Duration::from_secs(1))
            }),
        ),
    }
}

/// Writes a history entry of `job` for `tick` (Unix ms) under `id` whose value is `value`, indexed as a
/// real entry is (so that a read of the job's newest entries meets it). Returns what failed.
pub fn plant_history(
    target: &Target<'_>,
    job: &str,
    tick: i64,
    id: &str,
    value: &str,
) -> Vec<String> {
    let base = format!("{PREFIX}:{{{job}}}:history");
    match target {
        Target::Redis { nodes, on } => on_nodes(nodes, on, |pipe| {
            pipe.cmd("HSET").arg(&base).arg(id).arg(value).ignore();
            pipe.cmd("ZADD")
                .arg(format!("{base}:index"))
                .arg(tick)
                .arg(id)
                .ignore();
        }),
        Target::Sharded(cluster) => on_master(cluster, &base, |pipe| {
            pipe.cmd("HSET").arg(&base).arg(id).arg(value).ignore();
            pipe.cmd("ZADD")
                .arg(format!("{base}:index"))
                .arg(tick)
                .arg(id)
                .ignore();
        })
        .into_iter()
        .map(|why| format!("cluster: history/{id}: {why}"))
        .collect(),
        Target::Sql(server) => exec_sql(
            server,
            &[(
                format!("history/{id}"),
                format!(
                "INSERT INTO {PREFIX}_history (job, id, tick, entry) VALUES ({}, {}, {tick}, {})",
                literal(server.kind(), job),
                literal(server.kind(), id),
                literal(server.kind(), value),
            ),
            )],
        ),
        Target::Etcd(members) => {
            // The tick as the store writes it into keys: 20 digits that sort as the tick does.
            let sortable = (i128::from(tick) - i128::from(i64::MIN)) as u64;
            let key = format!("{base}/{sortable:020}/{id}");
            put_all(members, vec![(key, value.to_string())], None)
        }
        Target::Zookeeper(members) => {
            // The store's node: the tick as 20 digits that sort as it does, then the id, each made a
            // node name as the store makes it (bytes outside [A-Za-z0-9_:-] as `%XX`).
            let sortable = (i128::from(tick) - i128::from(i64::MIN)) as u64;
            let path = format!(
                "/{PREFIX}/history/{}/{sortable:020}-{}",
                node_name(job),
                node_name(id)
            );
            create_all(members, vec![(path, value.to_string())])
        }
    }
}

/// The job a planted request names, or `?` for one that names none (not JSON, of the wrong shape).
fn job_of(request: &str) -> String {
    serde_json::from_str::<serde_json::Value>(request)
        .ok()
        .and_then(|v| v["job"].as_str().map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

/// `text` as a SQL string literal for `kind` (MariaDB also takes backslashes as escapes).
fn literal(kind: SqlKind, text: &str) -> String {
    let quoted = text.replace('\'', "''");
    match kind {
        SqlKind::Postgres => format!("'{quoted}'"),
        SqlKind::Mariadb => format!("'{}'", quoted.replace('\\', "\\\\")),
    }
}

/// Runs `statements` (`(what it writes, SQL)`) in one transaction on `server` as its administrator;
/// what failed — all of them, as the transaction did — each as `sql: <what it writes>: why`.
fn exec_sql(server: &SqlServer, statements: &[(String, String)]) -> Vec<String> {
    let script: String = statements.iter().map(|(_, s)| format!("{s};\n")).collect();
    match server.try_exec(&format!("BEGIN;\n{script}COMMIT;\n")) {
        Ok(_) => Vec::new(),
        Err(why) => statements
            .iter()
            .map(|(what, _)| format!("sql: {what}: {why}"))
            .collect(),
    }
}

/// Runs the pipeline that `fill` builds on each node of `on`, at once, each bounded by [`TIMEOUT`];
/// returns the failures.
fn on_nodes(
    nodes: &RedisCluster,
    on: &[usize],
    fill: impl Fn(&mut redis::Pipeline),
) -> Vec<String> {
    let mut pipe = redis::pipe();
    fill(&mut pipe);
    let pipe = &pipe;
    std::thread::scope(|scope| {
        let writes: Vec<_> = on
            .iter()
            .map(|&node| {
                let client = nodes.client(node);
                scope.spawn(move || {
                    let attempt = || -> redis::RedisResult<()> {
                        let mut connection = client.get_connection_with_timeout(TIMEOUT)?;
                        connection.set_read_timeout(Some(TIMEOUT))?;
                        connection.set_write_timeout(Some(TIMEOUT))?;
                        pipe.query(&mut connection)
                    };
                    attempt().err().map(|e| format!("node {node}: {e}"))
                })
            })
            .collect();
        writes
            .into_iter()
            .filter_map(|w| w.join().unwrap_or_else(|_| Some("panicked".into())))
            .collect()
    })
}

/// Runs the pipeline that `fill` builds on the master serving `key`'s slot, bounded by [`TIMEOUT`];
/// the failure, if any (no master serves the slot, or it failed the pipeline).
fn on_master(
    cluster: &ShardedRedis,
    key: &str,
    fill: impl Fn(&mut redis::Pipeline),
) -> Vec<String> {
    match cluster.master_of(key) {
        Some(master) => on_nodes(cluster.nodes(), &[master], fill),
        None => vec![format!("no master serves the slot of {key}")],
    }
}

/// A job, request or entry id as the ZooKeeper store names its node: bytes outside `[A-Za-z0-9_:-]` as
/// `%XX`, so that no name makes a path.
fn node_name(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b':') {
                char::from(byte).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

/// Writes each `(path, data)` into the ensemble (its parents made as needed, an existing node's data
/// replaced) through one session on the first member that grants one, each request bounded by twice
/// [`TIMEOUT`]; returns the failures, each naming its path without the chroot (`triggers/<id>`).
fn create_all(members: &ZkEnsemble, entries: Vec<(String, String)>) -> Vec<String> {
    let not_planted = |path: &str, why: &dyn std::fmt::Display| {
        let key = path.trim_start_matches(&format!("/{PREFIX}/"));
        format!("zookeeper: {key}: {why}")
    };
    let session = (0..members.len())
        .filter(|&i| members.is_serving(i))
        .find_map(|i| ZkSession::connect(members.client_port(i), TIMEOUT * 2).ok());
    let Some(mut session) = session else {
        return entries
            .iter()
            .map(|(path, _)| not_planted(path, &"no member granted a session"))
            .collect();
    };
    let mut failures = Vec::new();
    for (path, data) in entries {
        let written = match session.create_all(&path, data.as_bytes()) {
            Ok(()) => session.set_data(&path, data.as_bytes()),
            Err(e) => Err(e),
        };
        match written {
            Ok(()) | Err(WireError::Code(NODE_EXISTS)) => {}
            Err(e) => failures.push(not_planted(&path, &e)),
        }
    }
    failures
}

/// Puts each `(key, value)` through a plain client (one request each: etcd takes at most 1.5 MiB per
/// request), each within twice [`TIMEOUT`] (an election may be going on), bound to an etcd lease of
/// `expires_in` if given (etcd then deletes them); returns the failures.
fn put_all(
    members: &EtcdCluster,
    entries: Vec<(String, String)>,
    expires_in: Option<Duration>,
) -> Vec<String> {
    let endpoints = members.endpoints();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return vec![format!("runtime: {e}")],
    };
    runtime.block_on(async {
        // The whole plant within one bound: the chaos executor waits for it, and 28 puts of 2 s each
        // while etcd had no leader held every other fault back (a hang outlived its time, a kill overlapped
        // it, and the restarted member found no leader: "not healthy within 20 s").
        let deadline = tokio::time::Instant::now() + TIMEOUT * 3;
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(TIMEOUT)
            .with_timeout(TIMEOUT * 2);
        let connect = etcd_client::Client::connect(&endpoints, Some(options));
        let not_planted = |why: &str| -> Vec<String> {
            (entries.iter())
                .map(|(key, _)| format!("etcd: {key}: {why}"))
                .collect()
        };
        let mut client = match tokio::time::timeout_at(deadline, connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return not_planted(&format!("no connection: {e}")),
            Err(_) => return not_planted("no connection within the plant's time"),
        };
        let mut failures = Vec::new();
        let mut options = None;
        if let Some(ttl) = expires_in {
            let seconds = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
            let granted =
                tokio::time::timeout_at(deadline, client.lease_grant(seconds, None)).await;
            let why = match granted {
                Ok(Ok(lease)) => {
                    options = Some(etcd_client::PutOptions::new().with_lease(lease.id()));
                    None
                }
                Ok(Err(e)) => Some(format!("no lease to expire it with: {e}")),
                Err(_) => Some("no lease to expire it with within the plant's time".to_string()),
            };
            // Without its lease nothing is planted: each entry is reported as not planted, by its key.
            if let Some(why) = why {
                return not_planted(&why);
            }
        }
        for (key, value) in entries {
            let put = client.put(key.as_str(), value, options.clone());
            match tokio::time::timeout_at(deadline, put).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => failures.push(format!("etcd: {key}: {e}")),
                Err(_) => failures.push(format!("etcd: {key}: no answer within the plant's time")),
            }
        }
        failures
    })
}
