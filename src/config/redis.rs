//! The `redis:` section: the nodes of the Redlock majority, each a server's URL or a Sentinel-managed
//! group, checked for what the lock needs of them (distinct servers, an odd count, reachable names).

use ::redis::IntoConnectionInfo as _;

use std::path::Path;

use super::dashboard::flag;
use super::raw::{RawRedis, RawRedisNode, RawSentinelGroup, Spanned};
use super::validate::{client_identity, config_file, whole_number};
use super::{
    redact, ClusterSeeds, RedisConfig, RedisNode, RedisTls, ReplicaAcks, Report, SentinelGroup,
};

/// The port a Sentinel listens on when an address names none.
const SENTINEL_PORT: u16 = 26379;
/// The most replicas `min_replicas_acked` may ask for (more than any group runs).
const MOST_REPLICAS_ACKED: usize = 16;

/// Validates `redis:` (`config_path` is what its file names are relative to); `None` when its nodes
/// are missing.
pub(super) fn redis(
    raw: &RawRedis,
    config_path: &Path,
    report: &mut Report,
) -> Option<RedisConfig> {
    if let Some(seeds) = &raw.cluster {
        if let Some(nodes) = &raw.nodes {
            let why =
                "`nodes` and `cluster` are alternatives: a Redis Cluster is the whole store; \
                       list its seeds under `cluster` only";
            report.error(nodes.mark, "redis.nodes", why);
        }
        let cluster = cluster(seeds, raw.min_replicas_acked.as_ref(), report)?;
        let nodes = vec![RedisNode::Cluster(cluster)];
        let tls = tls(raw, &nodes, config_path, report);
        return Some(RedisConfig { nodes, tls });
    }
    if let Some(acks) = &raw.min_replicas_acked {
        let why = "only for `cluster`: a Sentinel group takes its own (redis.nodes[i].min_replicas_acked), \
                   and a standalone server has no replicas to wait for";
        report.error(acks.mark, "redis.min_replicas_acked", why);
    }
    let Some(nodes) = &raw.nodes else {
        report.error(raw.mark, "redis.nodes", "missing field `nodes`: list the Redis URLs or Sentinel groups (or a Redis Cluster's seeds under `cluster`), or leave out `redis:` for the embedded store");
        return None;
    };
    // What makes two entries one node: a server's `host:port`, a group's master name with each Sentinel.
    let mut seen: Vec<(String, usize)> = Vec::new();
    let mut valid = Vec::new();
    for (i, entry) in nodes.value.iter().enumerate() {
        let field = format!("redis.nodes[{i}]");
        let (node, names, mark) = match entry {
            RawRedisNode::Url(url) => match node_address(&url.value) {
                Err(reason) => {
                    let why = format!("invalid Redis node URL {}: {reason}", redact(&url.value));
                    report.error(url.mark, &field, why);
                    continue;
                }
                Ok(address) => (
                    Some(RedisNode::Server(url.value.clone())),
                    vec![address],
                    url.mark,
                ),
            },
            RawRedisNode::Sentinel(raw) => {
                let group = sentinel_group(raw, &field, report);
                let names = group.as_ref().map_or_else(Vec::new, |group| {
                    let master = &group.master;
                    group
                        .sentinels
                        .iter()
                        .map(|sentinel| format!("master {master} of the Sentinel at {sentinel}"))
                        .collect()
                });
                (group.map(RedisNode::Sentinel), names, raw.mark)
            }
        };
        let again = names.iter().find_map(|name| {
            let (_, first) = seen.iter().find(|(other, _)| other == name)?;
            Some((name, *first))
        });
        if let Some((name, first)) = again {
            let why = format!("{name} is already redis.nodes[{first}]: list each node once, or its vote would count twice");
            report.error(mark, &field, why);
            continue;
        }
        seen.extend(names.into_iter().map(|name| (name, i)));
        valid.extend(node);
    }
    let count = nodes.value.len();
    if count == 0 {
        report.error(
            nodes.mark,
            "redis.nodes",
            "no nodes: list at least one Redis URL or Sentinel group, or leave out `redis:` for the embedded store",
        );
    } else if count % 2 == 0 {
        let why = format!(
            "{count} nodes: a quorum needs {} of them, so only {} may fail, no more than with {} node{}; use an odd number",
            count / 2 + 1,
            count / 2 - 1,
            count - 1,
            if count == 2 { "" } else { "s" }
        );
        report.warn(nodes.mark, "redis.nodes", why);
    }
    let tls = tls(raw, &valid, config_path, report);
    Some(RedisConfig { nodes: valid, tls })
}

/// `redis.ca_file`, `cert_file` and `key_file`: each relative to the config file, and only where a node
/// uses TLS (a certificate no connection presents would be a setting that does nothing).
fn tls(raw: &RawRedis, nodes: &[RedisNode], config_path: &Path, report: &mut Report) -> RedisTls {
    let uses_tls = nodes.iter().any(|node| match node {
        RedisNode::Server(url) => url.starts_with("rediss://"),
        RedisNode::Sentinel(group) => group.tls,
        RedisNode::Cluster(cluster) => cluster.seeds.iter().any(|s| s.starts_with("rediss://")),
    });
    let file = |value: &Option<Spanned<String>>, name: &str, report: &mut Report| {
        let value = value.as_ref()?;
        let field = format!("redis.{name}");
        if !uses_tls && !nodes.is_empty() {
            let why = format!("{name} needs a TLS node: no node is a rediss:// URL or a group with `tls: true`, so no connection would use it");
            report.error(value.mark, &field, why);
        }
        config_file(value, &field, config_path, report)
    };
    let ca_file = file(&raw.ca_file, "ca_file", report);
    let cert_file = file(&raw.cert_file, "cert_file", report);
    let key_file = file(&raw.key_file, "key_file", report);
    let client_identity = client_identity(
        (cert_file, &raw.cert_file),
        (key_file, &raw.key_file),
        ("redis", raw.mark),
        report,
    );
    RedisTls {
        ca_file,
        client_identity,
    }
}

/// `redis.cluster`: seed URLs of one Redis Cluster, distinct, all with or all without TLS, on database
/// 0 (a cluster has no other); or `None` after reporting what is wrong.
fn cluster(
    seeds: &Spanned<Vec<Spanned<String>>>,
    acks: Option<&Spanned<String>>,
    report: &mut Report,
) -> Option<ClusterSeeds> {
    if seeds.value.is_empty() {
        let why =
            "no seeds: list the redis:// URL of at least one node of the cluster (two or three, \
                   on different hosts, so that one down does not stop a worker from starting)";
        report.error(seeds.mark, "redis.cluster", why);
        return None;
    }
    let mut ok = true;
    let mut addresses: Vec<String> = Vec::new();
    for (i, seed) in seeds.value.iter().enumerate() {
        let field = format!("redis.cluster[{i}]");
        let shown = redact(&seed.value);
        let checked = node_address(&seed.value).and_then(|address| {
            let db = ::redis::parse_redis_url(&seed.value)
                .map(|url| url.path().trim_matches('/').to_string())
                .unwrap_or_default();
            if !db.is_empty() && db != "0" {
                return Err(format!(
                    "database {db}: a Redis Cluster has only database 0; leave the path out"
                ));
            }
            if addresses.contains(&address) {
                return Err(format!("{address} is listed twice: list each seed once"));
            }
            Ok(address)
        });
        match checked {
            Ok(address) => addresses.push(address),
            Err(why) => {
                report.error(
                    seed.mark,
                    &field,
                    format!("invalid seed URL {shown}: {why}"),
                );
                ok = false;
            }
        }
    }
    let tls: Vec<bool> = seeds
        .value
        .iter()
        .map(|seed| seed.value.starts_with("rediss://"))
        .collect();
    if tls.iter().any(|&t| t) && !tls.iter().all(|&t| t) {
        let why =
            "some seeds are rediss:// and some redis://: a cluster's nodes are all reached the \
                   same way; use one scheme";
        report.error(seeds.mark, "redis.cluster", why);
        ok = false;
    }
    let min_replicas_acked = replica_acks(acks, "redis", report);
    ok.then(|| ClusterSeeds {
        seeds: seeds.value.iter().map(|seed| seed.value.clone()).collect(),
        min_replicas_acked,
    })
}

/// A group entry (`{sentinels, master, …}`), or `None` after reporting what is wrong with it.
fn sentinel_group(
    raw: &RawSentinelGroup,
    field: &str,
    report: &mut Report,
) -> Option<SentinelGroup> {
    let mut ok = true;
    let mut sentinels = Vec::new();
    match &raw.sentinels {
        None => {
            let why =
                "missing field `sentinels`: list the Sentinels' host:port that monitor the master";
            report.error(raw.mark, &format!("{field}.sentinels"), why);
            ok = false;
        }
        Some(list) if list.value.is_empty() => {
            let why = "no Sentinels: list at least one host:port (three, on three hosts, is usual)";
            report.error(list.mark, &format!("{field}.sentinels"), why);
            ok = false;
        }
        Some(list) => {
            for (j, address) in list.value.iter().enumerate() {
                let path = format!("{field}.sentinels[{j}]");
                match sentinel_address(&address.value) {
                    Err(why) => {
                        let shown = without_password(&address.value);
                        let why = format!("invalid Sentinel address {shown:?}: {why}");
                        report.error(address.mark, &path, why);
                        ok = false;
                    }
                    Ok(address) if sentinels.contains(&address) => {
                        let why = format!("{address} is listed twice: list each Sentinel once");
                        report.error(list.value[j].mark, &path, why);
                        ok = false;
                    }
                    Ok(address) => sentinels.push(address),
                }
            }
        }
    }
    let master = match &raw.master {
        None => {
            let why =
                "missing field `master`: the name the Sentinels monitor it under (`sentinel monitor NAME …`)";
            report.error(raw.mark, &format!("{field}.master"), why);
            None
        }
        Some(name) if !valid_master_name(name.value.trim()) => {
            let why = format!(
                "invalid master name {:?}: letters, digits and `_.-:` only (as in `sentinel monitor NAME`)",
                name.value
            );
            report.error(name.mark, &format!("{field}.master"), why);
            None
        }
        Some(name) => Some(name.value.trim().to_string()),
    };
    let secret = |value: &Option<Spanned<String>>, name: &str, report: &mut Report| {
        let value = value.as_ref()?;
        if value.value.is_empty() {
            let why = "is empty: leave it out if the server needs none";
            report.error(value.mark, &format!("{field}.{name}"), why);
            return None;
        }
        Some(value.value.clone())
    };
    let username = secret(&raw.username, "username", report);
    let password = secret(&raw.password, "password", report);
    let sentinel_username = secret(&raw.sentinel_username, "sentinel_username", report);
    let sentinel_password = secret(&raw.sentinel_password, "sentinel_password", report);
    let tls = flag(raw.tls.as_ref(), &format!("{field}.tls"), report).unwrap_or(false);
    let db = whole_number(
        raw.db.as_ref(),
        &format!("{field}.db"),
        i64::MAX as usize,
        "a database number (0 or more)",
        report,
    )
    .unwrap_or(0);
    let min_replicas_acked = replica_acks(raw.min_replicas_acked.as_ref(), field, report);
    let master = master?;
    ok.then_some(SentinelGroup {
        master,
        sentinels,
        username,
        password,
        sentinel_username,
        sentinel_password,
        tls,
        db: db as i64,
        min_replicas_acked,
    })
}

/// `min_replicas_acked`: `all` (the default) or a number of replicas; a number warns of what it can
/// lose (0: everything a failover drops; fewer than the replicas: a claim across a planned failover).
fn replica_acks(value: Option<&Spanned<String>>, field: &str, report: &mut Report) -> ReplicaAcks {
    let field = format!("{field}.min_replicas_acked");
    let Some(value) = value else {
        return ReplicaAcks::All;
    };
    if value.value.trim() == "all" {
        return ReplicaAcks::All;
    }
    let what =
        format!("`all` (the default) or a number of replicas from 0 to {MOST_REPLICAS_ACKED}");
    let Some(n) = whole_number(Some(value), &field, MOST_REPLICAS_ACKED, &what, report) else {
        return ReplicaAcks::All;
    };
    let why = match n {
        0 => "0: the master's answer counts alone, so a failover can promote a replica \
              without the claims it confirmed; such a failover is treated as a restart \
              (not counted for the lock's TTL), and a tick may still run twice; see \
              docs/store-redis.md"
            .to_string(),
        n => format!(
            "{n}: with more replicas than {n}, a write counts that the replica promoted next may \
             lack (a planned failover, a master resuming during its failover), and a tick may run \
             twice; `all` (the default) waits for every replica known to be up; see \
             docs/store-redis.md"
        ),
    };
    report.warn(value.mark, &field, why);
    ReplicaAcks::Exactly(n as u32)
}

/// Whether `name` can be a Sentinel's master name: what `sentinel monitor` takes, without spaces.
fn valid_master_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | ':'))
}

/// `host:port` of a Sentinel address (`host`, `host:port` or `[v6]:port`; the port defaults to 26379),
/// or why it is not one.
pub(crate) fn sentinel_address(address: &str) -> Result<String, String> {
    let address = address.trim();
    if address.contains("://") || address.contains('@') {
        return Err(
            "expected host:port, as in 10.0.0.1:26379 (no scheme; the Sentinels' password \
                    goes in sentinel_password)"
                .to_string(),
        );
    }
    let (host, port) = match address.strip_prefix('[') {
        Some(bracketed) => {
            let (host, after) = bracketed
                .split_once(']')
                .ok_or("missing `]` after the IPv6 address")?;
            host.parse::<std::net::Ipv6Addr>()
                .map_err(|_| format!("invalid IPv6 address [{host}]"))?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':').ok_or("expected :port after ]")?),
            };
            (format!("[{host}]"), port)
        }
        None if address.matches(':').count() > 1 => {
            return Err("write an IPv6 address in brackets, as in [::1]:26379".to_string())
        }
        None => match address.split_once(':') {
            Some((host, port)) => (host.to_string(), Some(port)),
            None => (address.to_string(), None),
        },
    };
    if host.is_empty() {
        return Err("missing host: expected host:port, as in 10.0.0.1:26379".to_string());
    }
    if !host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._[]:".contains(c))
    {
        return Err(format!(
            "invalid host {host:?}: expected host:port, as in 10.0.0.1:26379"
        ));
    }
    let port = match port {
        None => SENTINEL_PORT,
        Some(port) => match port.parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => return Err(format!("invalid port {port:?}: expected 1 to 65535")),
        },
    };
    Ok(format!("{}:{port}", host.to_ascii_lowercase()))
}

/// A Sentinel address as an error may show it: whatever precedes an `@` (a password) is hidden.
fn without_password(address: &str) -> String {
    match address.rsplit_once('@') {
        Some((_, host)) => format!("***@{host}"),
        None => address.to_string(),
    }
}

/// `host:port` of a node URL, or why it is not a usable `redis://`/`rediss://` URL (never its password).
fn node_address(url: &str) -> Result<String, String> {
    let parsed = ::redis::parse_redis_url(url)
        .ok_or("expected redis://[user:password@]host[:port][/db] or rediss://...")?;
    if !matches!(parsed.scheme(), "redis" | "rediss") {
        return Err(format!(
            "scheme {}:// is not supported; use redis:// or rediss://",
            parsed.scheme()
        ));
    }
    let host = parsed.host_str().unwrap_or_default().to_ascii_lowercase();
    let port = parsed.port().unwrap_or(6379);
    if port == 0 {
        return Err("port 0 is not a port a server listens on".to_string());
    }
    // redis-rs says what is wrong without the URL; drop the error-kind suffix it appends.
    parsed.into_connection_info().map_err(|e| {
        let text = e.to_string();
        text.trim_end_matches(" - InvalidClientConfig").to_string()
    })?;
    Ok(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::sentinel_address;

    #[test]
    fn sentinel_addresses_take_a_default_port_and_refuse_urls() {
        assert_eq!(
            sentinel_address("10.0.0.1:26380").as_deref(),
            Ok("10.0.0.1:26380")
        );
        assert_eq!(
            sentinel_address("Sentinel-A").as_deref(),
            Ok("sentinel-a:26379")
        );
        assert_eq!(sentinel_address("[::1]:5000").as_deref(), Ok("[::1]:5000"));
        assert!(sentinel_address("redis://h:1").is_err());
        assert!(sentinel_address("h:0").is_err());
        assert!(sentinel_address("h:99999").is_err());
        assert!(sentinel_address("::1").is_err());
        assert!(sentinel_address(":26379").is_err());
        assert!(sentinel_address("user:pw@h:1").is_err());
    }
}
