//! Stage two for `etcd:`: the etcd cluster that holds the store, with the settings etcd's own clients
//! take (the names of etcd's client config file: `endpoints`, `username`, `password`, `trusted_ca_file`,
//! `cert_file`, `key_file`).
//!
//! Endpoints are a member's client URL as `etcdctl --endpoints` takes it: `http://host:port`,
//! `https://host:port`, or a bare `host:port` (http). TLS settings need https endpoints, and https
//! endpoints are all or none, so that one setting never means two things. Files are named relative to
//! the config file's directory and read when the store opens (an unreadable file stops the worker with
//! its path); here they are only checked to be given in pairs.

use std::path::Path;
use std::time::Duration;

use super::raw::{RawEtcd, Spanned};
use super::validate::{client_identity, config_file, pair};
use super::{EtcdConfig, Report};

/// `lock.node_timeout` with an etcd store, unless given: an etcd write is a Raft commit (an fsync on a
/// majority of members), slower than a Redis script; at most `ttl/10`.
pub(super) const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(500);

/// The etcd section, or `None` after reporting why it cannot name a cluster.
pub(super) fn etcd(raw: &RawEtcd, config_path: &Path, report: &mut Report) -> Option<EtcdConfig> {
    let Some(endpoints) = &raw.endpoints else {
        report.error(raw.mark, "etcd.endpoints", "missing field `endpoints`: list the client URLs of the etcd members (http://host:2379), or leave out `etcd:`");
        return None;
    };
    if endpoints.value.is_empty() {
        report.error(
            endpoints.mark,
            "etcd.endpoints",
            "no endpoints: list at least one client URL of an etcd member (http://host:2379)",
        );
        return None;
    }
    let mut seen: Vec<(String, usize)> = Vec::new();
    let mut schemes: Vec<&str> = Vec::new();
    for (i, url) in endpoints.value.iter().enumerate() {
        let field = format!("etcd.endpoints[{i}]");
        match endpoint(&url.value) {
            Err(why) => report.error(
                url.mark,
                &field,
                format!("invalid etcd endpoint {:?}: {why}", url.value),
            ),
            Ok((scheme, address)) => {
                schemes.push(scheme);
                match seen.iter().find(|(other, _)| *other == address) {
                    Some((_, first)) => {
                        let why = format!(
                            "{address} is already etcd.endpoints[{first}]: list each member once"
                        );
                        report.error(url.mark, &field, why);
                    }
                    None => seen.push((address, i)),
                }
            }
        }
    }
    let https = schemes.first() == Some(&"https");
    if schemes.iter().any(|scheme| (*scheme == "https") != https) {
        let why = "endpoints mix http:// and https://: a cluster serves its clients one way; write every endpoint with the same scheme";
        report.error(endpoints.mark, "etcd.endpoints", why);
    }
    let file = |value: &Option<Spanned<String>>, field: &str, report: &mut Report| {
        let value = value.as_ref()?;
        if !https {
            let why = format!("{field} needs https:// endpoints: the endpoints are http://, so the connection would not use TLS");
            report.error(value.mark, &format!("etcd.{field}"), why);
        }
        config_file(value, &format!("etcd.{field}"), config_path, report)
    };
    let trusted_ca_file = file(&raw.trusted_ca_file, "trusted_ca_file", report);
    let cert_file = file(&raw.cert_file, "cert_file", report);
    let key_file = file(&raw.key_file, "key_file", report);
    let client_identity = client_identity(
        (cert_file, &raw.cert_file),
        (key_file, &raw.key_file),
        ("etcd", raw.mark),
        report,
    );
    let user = pair(
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
        "etcd's auth takes a user name with its password",
        ("etcd", raw.mark),
        report,
    );
    Some(EtcdConfig {
        endpoints: endpoints
            .value
            .iter()
            .map(|url| url.value.clone())
            .collect(),
        user,
        trusted_ca_file,
        client_identity,
    })
}

/// The scheme (`http` or `https`) and `host:port` of an endpoint, or why it is not one.
fn endpoint(url: &str) -> Result<(&'static str, String), String> {
    let (scheme, rest) = match url.split_once("://") {
        Some(("http", rest)) => ("http", rest),
        Some(("https", rest)) => ("https", rest),
        Some((other, _)) => {
            return Err(format!(
                "scheme {other}:// is not supported; use http:// or https://"
            ))
        }
        None => ("http", url),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '@', '?', '#']) || rest.chars().any(char::is_whitespace) {
        return Err("expected http[s]://host:port, with no user, path or query".to_string());
    }
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or("missing port: etcd serves clients on port 2379 by default, write host:2379")?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|port| *port != 0)
        .ok_or_else(|| format!("invalid port {port:?}"))?;
    if host.is_empty() {
        return Err("missing host".to_string());
    }
    Ok((scheme, format!("{}:{port}", host.to_ascii_lowercase())))
}

#[cfg(test)]
mod tests {
    use super::endpoint;

    #[test]
    fn endpoints_are_read_as_etcdctl_reads_them() {
        assert_eq!(
            endpoint("http://127.0.0.1:2379"),
            Ok(("http", "127.0.0.1:2379".to_string()))
        );
        assert_eq!(
            endpoint("https://Etcd-1:2379/"),
            Ok(("https", "etcd-1:2379".to_string()))
        );
        assert_eq!(
            endpoint("10.0.0.1:2379"),
            Ok(("http", "10.0.0.1:2379".to_string()))
        );
        assert!(endpoint("http://10.0.0.1").is_err());
        assert!(endpoint("http://10.0.0.1:0").is_err());
        assert!(endpoint("unix://x:1").is_err());
        assert!(endpoint("http://u:p@h:1").is_err());
    }
}
