//! Stage two for `zookeeper:`: the ZooKeeper ensemble that holds the store, with the settings
//! ZooKeeper's own clients take (a connect string's `host:port` list, a session timeout, digest auth,
//! TLS files).
//!
//! Hosts are `host:port` (a bracketed IPv6 address as `[::1]:2181`), each given once. The chroot is
//! `/<key_prefix>` (the section's `key_prefix`, default `redcron`), so its prefix is one path element.
//! `session_timeout` (default `lock.ttl`) is the lease: a holder's lease ends with its session, so it
//! must outlast two renewal periods (one renewal may fail) and must not exceed `lock.ttl`, which every
//! other part of redcron takes as the longest a crashed holder keeps a job busy. TLS files must be
//! absolute paths: they are read when the store opens, by a worker started from anywhere.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::raw::{RawZookeeper, Spanned};
use super::validate::{client_identity, duration, pair};
use super::{Report, ZookeeperConfig, ZookeeperTls};
use crate::clock::show_duration;
use crate::lock::LockSettings;

/// `lock.node_timeout` with a ZooKeeper store, unless given: a ZooKeeper write is a quorum commit (an
/// fsync on a majority of members), slower than a Redis script; at most `ttl/10`.
pub(super) const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// The zookeeper section, or `None` after reporting why it cannot name an ensemble.
pub(super) fn zookeeper(
    raw: &RawZookeeper,
    lock: &LockSettings,
    report: &mut Report,
) -> Option<ZookeeperConfig> {
    let Some(hosts) = &raw.hosts else {
        report.error(raw.mark, "zookeeper.hosts", "missing field `hosts`: list the client addresses of the ZooKeeper members (host:2181), or leave out `zookeeper:`");
        return None;
    };
    if hosts.value.is_empty() {
        report.error(
            hosts.mark,
            "zookeeper.hosts",
            "no hosts: list at least one client address of a ZooKeeper member (host:2181)",
        );
        return None;
    }
    let mut seen: Vec<(String, usize)> = Vec::new();
    for (i, host) in hosts.value.iter().enumerate() {
        let field = format!("zookeeper.hosts[{i}]");
        match address(&host.value) {
            Err(why) => report.error(
                host.mark,
                &field,
                format!("invalid ZooKeeper host {:?}: {why}", host.value),
            ),
            Ok(address) => match seen.iter().find(|(other, _)| *other == address) {
                Some((_, first)) => {
                    let why = format!(
                        "{address} is already zookeeper.hosts[{first}]: list each member once"
                    );
                    report.error(host.mark, &field, why);
                }
                None => seen.push((address, i)),
            },
        }
    }
    let session_timeout = session_timeout(raw.session_timeout.as_ref(), lock, report);
    let auth = pair(
        (
            raw.username.as_ref().map(|u| u.value.clone()),
            &raw.username,
            "username",
        ),
        (
            raw.password.as_ref().map(|p| p.value.clone()),
            &raw.password,
            "password",
        ),
        "ZooKeeper's digest auth takes a user name with its password",
        ("zookeeper", raw.mark),
        report,
    );
    if let Some((user, _)) = &auth {
        if user.is_empty() || user.contains(':') {
            let at = raw.username.as_ref().map_or(raw.mark, |u| u.mark);
            report.error(
                at,
                "zookeeper.username",
                "a digest user name is not empty and holds no `:`",
            );
        }
    }
    let tls = raw.tls.as_ref().and_then(|tls| {
        let ca = absolute(&tls.ca_file, "zookeeper.tls.ca_file", report);
        let cert = absolute(&tls.cert_file, "zookeeper.tls.cert_file", report);
        let key = absolute(&tls.key_file, "zookeeper.tls.key_file", report);
        let identity = client_identity(
            (cert, &tls.cert_file),
            (key, &tls.key_file),
            ("zookeeper.tls", tls.mark),
            report,
        );
        match ca {
            Some(ca_file) => Some(ZookeeperTls {
                ca_file,
                client_identity: identity,
            }),
            None => {
                if tls.ca_file.is_none() {
                    report.error(tls.mark, "zookeeper.tls.ca_file", "missing `ca_file`: the CA that signed the members' certificates (an absolute path)");
                }
                None
            }
        }
    });
    Some(ZookeeperConfig {
        hosts: seen.into_iter().map(|(address, _)| address).collect(),
        session_timeout,
        auth,
        tls,
    })
}

/// `zookeeper.session_timeout` (default `lock.ttl`): at least 2 × `renew_every`, so that one failed
/// renewal does not end the lease, and at most `ttl`.
fn session_timeout(
    value: Option<&Spanned<String>>,
    lock: &LockSettings,
    report: &mut Report,
) -> Duration {
    let default = lock.ttl;
    let Some(value) = value else {
        return default;
    };
    let Some(given) = duration(Some(value), "zookeeper.session_timeout", report) else {
        return default;
    };
    let low = lock.renew_every * 2;
    if given < low || given > lock.ttl {
        let why = format!(
            "session_timeout ({}) must be from 2 × lock.renew_every ({}) to lock.ttl ({}): a holder's lease ends with its session, which must outlive one failed renewal, and a crashed holder must not keep its job longer than ttl",
            show_duration(given),
            show_duration(low),
            show_duration(lock.ttl)
        );
        report.error(value.mark, "zookeeper.session_timeout", why);
        return default;
    }
    given
}

/// A TLS file's path, which must be absolute; `None` when absent or not (reported).
fn absolute(value: &Option<Spanned<String>>, field: &str, report: &mut Report) -> Option<PathBuf> {
    let value = value.as_ref()?;
    let path = Path::new(value.value.trim());
    if value.value.trim().is_empty() || !path.is_absolute() {
        let why = format!(
            "{:?} is not an absolute path: write the file's full path (/etc/redcron/zk-ca.pem)",
            value.value
        );
        report.error(value.mark, field, why);
        return None;
    }
    Some(path.to_path_buf())
}

/// `host:port` as a connect string takes it, host lowercased, or why it is not one.
fn address(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.contains(['/', '@', '?', '#', ',']) || text.chars().any(char::is_whitespace) {
        return Err("expected host:port, with no scheme, user, path or list".to_string());
    }
    let (host, port) = text
        .rsplit_once(':')
        .ok_or("missing port: ZooKeeper serves clients on port 2181 by default, write host:2181")?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|port| *port != 0)
        .ok_or_else(|| format!("invalid port {port:?}"))?;
    let bracketed = host.starts_with('[') && host.ends_with(']');
    if host.is_empty() || (host.contains(':') && !bracketed) {
        return Err("missing host (write an IPv6 address in brackets: [::1]:2181)".to_string());
    }
    Ok(format!("{}:{port}", host.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::address;
    use crate::config::{parse_with_env, StoreConfig};

    const JOB: &str = "jobs:\n  - name: a\n    schedule: \"* * * * *\"\n    command: [\"true\"]\n";

    fn parse(text: &str) -> Result<crate::config::Config, String> {
        let env = |name: &str| (name == "ZK_PASSWORD").then(|| "s3cret".to_string());
        parse_with_env(
            &format!("{text}{JOB}"),
            Path::new("/etc/redcron/jobs.yaml"),
            &env,
        )
        .map_err(|e| e.to_string())
    }

    /// The contract's example reads back: hosts, chroot prefix, session timeout, auth kept from jobs and
    /// from `Debug`, TLS files.
    #[test]
    fn the_section_reads_back_and_keeps_its_password_secret() {
        let config = parse(
            "lock:\n  ttl: 6s\n  renew_every: 1s\nzookeeper:\n  hosts: [\"127.0.0.1:2181\", \"ZK-2:2182\"]\n  \
             key_prefix: cron-prod\n  session_timeout: 4s\n  username: redcron\n  password: ${ZK_PASSWORD}\n  \
             tls: { ca_file: /etc/zk/ca.pem, cert_file: /etc/zk/c.pem, key_file: /etc/zk/k.pem }\n",
        )
        .expect("valid");
        let StoreConfig::Zookeeper(zk) = &config.store else {
            panic!("expected a ZooKeeper store, got {:?}", config.store)
        };
        assert_eq!(zk.hosts, ["127.0.0.1:2181", "zk-2:2182"]);
        assert_eq!(zk.session_timeout, Duration::from_secs(4));
        assert_eq!(zk.auth, Some(("redcron".into(), "s3cret".into())));
        let tls = zk.tls.as_ref().expect("TLS");
        assert_eq!(tls.ca_file, Path::new("/etc/zk/ca.pem"));
        assert!(tls.client_identity.is_some());
        assert_eq!(config.lock.key_prefix, "cron-prod");
        assert_eq!(config.lock.node_timeout, Duration::from_millis(500));
        assert!(config.secret_env_vars.contains("ZK_PASSWORD"));
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(config.store.summary().contains("2 hosts"));
        assert!(!config.store.summary().contains("s3cret"));
    }

    /// No `session_timeout`: the lease's TTL.
    #[test]
    fn the_session_timeout_defaults_to_the_ttl() {
        let config = parse("zookeeper:\n  hosts: [\"zk:2181\"]\n").expect("valid");
        let StoreConfig::Zookeeper(zk) = &config.store else {
            panic!("a ZooKeeper store")
        };
        assert_eq!(zk.session_timeout, config.lock.ttl);
        assert_eq!(config.lock.key_prefix, "redcron");
    }

    /// Each problem is reported at its line and column, with its field.
    #[test]
    fn problems_name_their_field() {
        let cases = [
            ("zookeeper:\n  hosts: [\"zk\"]\n", "jobs.yaml:2:11: zookeeper.hosts[0]: invalid ZooKeeper host \"zk\": missing port"),
            ("zookeeper:\n  hosts: [\"zk:1\", \"ZK:1\"]\n", "jobs.yaml:2:19: zookeeper.hosts[1]: zk:1 is already zookeeper.hosts[0]"),
            ("zookeeper:\n  hosts: []\n", "jobs.yaml:2:10: zookeeper.hosts: no hosts"),
            ("zookeeper:\n  hosts: [\"zk:1\"]\n  username: u\n", "jobs.yaml:3:13: zookeeper.username: missing `password`"),
            ("zookeeper:\n  hosts: [\"zk:1\"]\n  tls: {ca_file: ca.pem}\n", "jobs.yaml:3:18: zookeeper.tls.ca_file: \"ca.pem\" is not an absolute path"),
            ("lock:\n  ttl: 9s\n  renew_every: 3s\nzookeeper:\n  hosts: [\"zk:1\"]\n  session_timeout: 5s\n", "jobs.yaml:6:20: zookeeper.session_timeout: session_timeout (5s) must be from 2 × lock.renew_every (6s) to lock.ttl (9s)"),
            ("lock:\n  ttl: 9s\nzookeeper:\n  hosts: [\"zk:1\"]\n  session_timeout: 10s\n", "zookeeper.session_timeout: session_timeout (10s) must be"),
            ("etcd:\n  endpoints: [http://b:2379]\nzookeeper:\n  hosts: [\"zk:1\"]\n", "jobs.yaml:3:1: zookeeper: `zookeeper:` and `etcd:` cannot both be given"),
            ("zookeeper:\n  hosts: [\"zk:1\"]\n  key_prefix: a/b\n", "zookeeper.key_prefix: invalid key_prefix \"a/b\""),
        ];
        for (text, expected) in cases {
            let got = parse(text).expect_err(text);
            assert!(
                got.contains(expected),
                "{text}\n  expected: {expected}\n  got: {got}"
            );
        }
    }

    #[test]
    fn hosts_are_read_as_a_connect_string_takes_them() {
        assert_eq!(address("127.0.0.1:2181"), Ok("127.0.0.1:2181".to_string()));
        assert_eq!(address("ZK-1:2181"), Ok("zk-1:2181".to_string()));
        assert_eq!(address("[::1]:2181"), Ok("[::1]:2181".to_string()));
        assert!(address("zk-1").is_err());
        assert!(address("zk-1:0").is_err());
        assert!(address("::1:2181").is_err());
        assert!(address("zk-1:2181/chroot").is_err());
        assert!(address("a:1,b:2").is_err());
        assert!(address(":2181").is_err());
    }
}
