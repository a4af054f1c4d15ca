//! Which names the dashboard answers to: the `Host` of every dashboard request, and the `Origin` of a
//! state-changing one, must be one of them ([`Hosts::allows`]), or the request is refused (421).
//!
//! DNS rebinding: a page of `evil.example` that the operator opens can point `evil.example` at
//! `127.0.0.1` and read the loopback dashboard as its own origin; the browser then sends
//! `Host: evil.example:PORT`. A request whose `Host` is a name the dashboard does not know is such a
//! request. So the dashboard answers to:
//! - any IP address (`127.0.0.1:9464`, `[::1]:9464`, `10.0.0.5:8080`): a rebinding page always reaches it
//!   by a name, since its origin is the name; an address is what a browser sends only when the operator
//!   typed it. This covers the listen address, a `0.0.0.0` listener reached by any of the host's
//!   addresses, and a port forwarded elsewhere (the port is not compared, for the same reason);
//! - `localhost`, which no other site's page can be served as;
//! - this host's name (`gethostname`, read at start);
//! - the names of `dashboard.allowed_hosts` (a reverse proxy's, a DNS name of the fleet).
//!
//! A request without `Host` (HTTP/1.0) is let through: no browser sends one. `/metrics`, `/healthz` and
//! `/readyz` are not checked: kubelets and Prometheus reach them by a pod's address or a service name
//! with any `Host`, and they carry no command, output or token — only counts and job names.

use std::net::IpAddr;

/// The names of this host that the dashboard answers to, beside those of the config in force.
pub(super) struct Hosts {
    /// This host's name, lower case, if it has one.
    hostname: Option<String>,
}

impl Hosts {
    /// This host's names, read now.
    pub(super) fn of_this_host() -> Hosts {
        Hosts {
            hostname: hostname(),
        }
    }

    /// Whether `authority` (a `Host` header, or an `Origin`'s host and port) names this dashboard, with
    /// the config's `allowed`.
    pub(super) fn allows(&self, authority: &str, allowed: &[String]) -> bool {
        let Some(host) = host_of(authority) else {
            return false;
        };
        if host.parse::<IpAddr>().is_ok() {
            return true;
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        host == "localhost"
            || self.hostname.as_deref() == Some(host.as_str())
            || allowed.contains(&host)
    }

    /// The names `allows` takes, for a refusal's message.
    pub(super) fn describe(&self, allowed: &[String]) -> String {
        let mut names = vec!["an IP address".to_string(), "localhost".to_string()];
        names.extend(self.hostname.clone());
        names.extend(allowed.iter().cloned());
        names.join(", ")
    }
}

/// The host of an authority (`host`, `host:port`, `[v6]`, `[v6]:port`), without brackets or port;
/// `None` if it is not one.
fn host_of(authority: &str) -> Option<&str> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return (after.is_empty() || port(after.strip_prefix(':')?)).then_some(host);
    }
    let host = match authority.rsplit_once(':') {
        Some((host, tail)) if port(tail) => host,
        Some(_) => return None,
        None => authority,
    };
    (!host.is_empty()).then_some(host)
}

fn port(text: &str) -> bool {
    !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit())
}

/// This host's name, lower case.
fn hostname() -> Option<String> {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let result = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    if result != 0 {
        return None;
    }
    let end = buffer.iter().position(|b| *b == 0).unwrap_or(buffer.len());
    let name = std::str::from_utf8(&buffer[..end]).ok()?.trim();
    (!name.is_empty()).then(|| name.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_localhost_this_host_and_the_configured_names_only() {
        let hosts = Hosts {
            hostname: Some("cron-7".to_string()),
        };
        let allowed = ["cron.example.com".to_string()];
        for ok in [
            "127.0.0.1:9464",
            "127.0.0.1",
            "[::1]:9464",
            "[::1]",
            "10.0.0.5:8080",
            "localhost:9464",
            "LOCALHOST",
            "cron-7:9464",
            "cron.example.com",
            "Cron.Example.Com.:443",
        ] {
            assert!(hosts.allows(ok, &allowed), "{ok}");
        }
        for refused in [
            "evil.example:9464",
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.nip.io:9464",
            "",
            ":9464",
            "[::1",
            "127.0.0.1:x",
            "cron.example.com.evil",
        ] {
            assert!(!hosts.allows(refused, &allowed), "{refused}");
        }
        assert!(hostname().is_some_and(|name| !name.is_empty()));
    }
}
