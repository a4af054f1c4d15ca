//! Stage two for `dashboard:`: who may see the worker's web pages (`crate::dashboard`) and whether they
//! may use its controls.
//!
//! Safe by default, after the peers' incidents (a dashboard shipped without auth, a UI that runs shell
//! commands for anyone who reaches the port): without a token the dashboard is read-only and served only
//! on a loopback `worker.listen`, unless `public: true` says that anyone who reaches the port may read it;
//! the controls (pause, resume, trigger) need a token, and `controls: true` without one is an error. A
//! token is a secret (write it as `${VAR}`): at least [`MIN_TOKEN_LEN`] characters, never shown (its
//! `Debug` is redacted), and its variables are never inherited by jobs.

use std::fmt;
use std::net::SocketAddr;

use super::raw::{RawDashboard, Spanned};
use super::Report;

/// The shortest token accepted: 16 characters of a random token leave nothing to guess, even at the
/// dashboard's one failed attempt per second.
pub const MIN_TOKEN_LEN: usize = 16;
/// The longest token: a header line stays small.
const MAX_TOKEN_LEN: usize = 512;
/// The most tokens a config may name.
const MAX_TOKENS: usize = 64;
/// The name `token:` (one token without a name) goes by in the history and the logs.
pub const DEFAULT_TOKEN_NAME: &str = "operator";

/// The validated `dashboard:` section (all defaults without one).
#[derive(Clone, PartialEq, Eq)]
pub struct DashboardConfig {
    /// `enabled` (default true): serve the pages on `worker.listen` at all.
    pub enabled: bool,
    /// The tokens that open the dashboard, each with the name its actions are recorded under. Empty:
    /// read-only, loopback only (or `public`).
    pub tokens: Vec<DashboardToken>,
    /// `controls` (default false): the pause, resume and trigger routes and forms; needs a token.
    pub controls: bool,
    /// `public` (default false): serve the read-only dashboard without a token on a non-loopback address.
    pub public: bool,
    /// `allowed_hosts` (default none): the names, beside an IP address, `localhost` and this host's name,
    /// that a request's `Host` may give for the dashboard (lower case, without a port).
    pub allowed_hosts: Vec<String>,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig {
            enabled: true,
            tokens: Vec::new(),
            controls: false,
            public: false,
            allowed_hosts: Vec::new(),
        }
    }
}

/// A named token. Its `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct DashboardToken {
    /// Who acts with it, as the history and the logs name them.
    pub name: String,
    /// The secret itself.
    pub secret: String,
}

impl fmt::Debug for DashboardToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DashboardToken {{ name: {:?}, secret: *** }}", self.name)
    }
}

impl fmt::Debug for DashboardConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DashboardConfig")
            .field("enabled", &self.enabled)
            .field("tokens", &self.tokens)
            .field("controls", &self.controls)
            .field("public", &self.public)
            .field("allowed_hosts", &self.allowed_hosts)
            .finish()
    }
}

/// Whether, and how, a worker serves its dashboard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Serving {
    /// Not served, and why (for the worker's start-up warning).
    Off(String),
    /// Served to anyone who reaches the port, read-only (loopback, or `public: true`).
    Open,
    /// Served to holders of a token only.
    Token,
}

impl DashboardConfig {
    /// Whether a worker listening on `listen` serves the dashboard.
    pub fn serving(&self, listen: Option<SocketAddr>) -> Serving {
        let Some(listen) = listen else {
            return Serving::Off("worker.listen is not set".into());
        };
        if !self.enabled {
            return Serving::Off("dashboard.enabled is false".into());
        }
        if !self.tokens.is_empty() {
            return Serving::Token;
        }
        if listen.ip().is_loopback() || self.public {
            return Serving::Open;
        }
        Serving::Off(format!(
            "worker.listen ({listen}) is not a loopback address and dashboard has no token: set \
             dashboard.token, or dashboard.public: true to let anyone who reaches the port read it"
        ))
    }
}

/// The `dashboard:` section; `listen` is `worker.listen`, for the warnings about a dashboard that will not
/// be served.
pub(super) fn dashboard(
    raw: Option<&RawDashboard>,
    listen: Option<SocketAddr>,
    report: &mut Report,
) -> DashboardConfig {
    let Some(raw) = raw else {
        return DashboardConfig::default();
    };
    let defaults = DashboardConfig::default();
    let enabled =
        flag(raw.enabled.as_ref(), "dashboard.enabled", report).unwrap_or(defaults.enabled);
    let controls = flag(raw.controls.as_ref(), "dashboard.controls", report).unwrap_or(false);
    let public = flag(raw.public.as_ref(), "dashboard.public", report).unwrap_or(false);
    let mut tokens = Vec::new();
    if let Some(token) = &raw.token {
        if raw.tokens.is_some() {
            let why = "give either `token` or `tokens`, not both";
            report.error(token.mark, "dashboard.token", why);
        }
        if let Some(secret) = secret(token, "dashboard.token", report) {
            tokens.push(DashboardToken {
                name: DEFAULT_TOKEN_NAME.into(),
                secret,
            });
        }
    }
    if let Some(list) = &raw.tokens {
        if list.value.len() > MAX_TOKENS {
            let why = format!("at most {MAX_TOKENS} tokens");
            report.error(list.mark, "dashboard.tokens", why);
        }
        for (i, item) in list.value.iter().enumerate() {
            let path = format!("dashboard.tokens[{i}]");
            let name = match &item.name {
                None => {
                    report.error(item.mark, &format!("{path}.name"), "missing field `name`");
                    continue;
                }
                Some(name) if !valid_name(&name.value) => {
                    let why = format!(
                        "invalid token name {:?}: 1 to 64 letters, digits and `_ . - @`",
                        name.value
                    );
                    report.error(name.mark, &format!("{path}.name"), why);
                    continue;
                }
                Some(name) => name,
            };
            if tokens.iter().any(|t: &DashboardToken| t.name == name.value) {
                let why = format!("duplicate token name {:?}", name.value);
                report.error(name.mark, &format!("{path}.name"), why);
            }
            let Some(token) = &item.token else {
                report.error(item.mark, &format!("{path}.token"), "missing field `token`");
                continue;
            };
            if tokens.iter().any(|t| t.secret == token.value) {
                let why = "two tokens are the same: each name needs its own secret";
                report.error(token.mark, &format!("{path}.token"), why);
            }
            if let Some(secret) = secret(token, &format!("{path}.token"), report) {
                tokens.push(DashboardToken {
                    name: name.value.clone(),
                    secret,
                });
            }
        }
    }
    if controls && raw.token.is_none() && raw.tokens.is_none() {
        let why = "controls (pause, resume, trigger) need a token: set dashboard.token (as ${VAR})";
        let mark = raw.controls.as_ref().map_or(raw.mark, |c| c.mark);
        report.error(mark, "dashboard.controls", why);
    }
    let allowed_hosts = raw
        .allowed_hosts
        .as_ref()
        .map(|list| allowed_hosts(list, report))
        .unwrap_or_default();
    let config = DashboardConfig {
        enabled,
        tokens,
        controls,
        public,
        allowed_hosts,
    };
    if let Serving::Off(why) = config.serving(listen) {
        if enabled {
            report.warn(
                raw.mark,
                "dashboard",
                format!("the dashboard is not served: {why}"),
            );
        }
    }
    config
}

/// The most names `allowed_hosts` may give.
const MAX_ALLOWED_HOSTS: usize = 64;

/// `allowed_hosts`: host names (letters, digits, `-` and `.`, at most 253 characters), lower-cased, a
/// trailing dot dropped.
fn allowed_hosts(list: &Spanned<Vec<Spanned<String>>>, report: &mut Report) -> Vec<String> {
    if list.value.len() > MAX_ALLOWED_HOSTS {
        let why = format!("at most {MAX_ALLOWED_HOSTS} names");
        report.error(list.mark, "dashboard.allowed_hosts", why);
    }
    let mut names = Vec::new();
    for (i, name) in list.value.iter().enumerate() {
        let host = name.value.trim().trim_end_matches('.').to_ascii_lowercase();
        let valid = (1..=253).contains(&host.len())
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'));
        if valid {
            names.push(host);
        } else {
            let why = format!(
                "invalid host name {:?}: letters, digits, `-` and `.`, without a port or a scheme \
                 (e.g. redcron.example.com)",
                name.value
            );
            report.error(name.mark, &format!("dashboard.allowed_hosts[{i}]"), why);
        }
    }
    names
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '@'))
}

/// A token's secret, if it is long enough and holds nothing a header cannot carry. The message never
/// shows it.
fn secret(value: &Spanned<String>, field: &str, report: &mut Report) -> Option<String> {
    let secret = value.value.trim();
    let why = if secret.chars().count() < MIN_TOKEN_LEN {
        format!(
            "a token must be at least {MIN_TOKEN_LEN} characters (this one has {}); generate one, e.g. \
             `openssl rand -hex 32`",
            secret.chars().count()
        )
    } else if secret.len() > MAX_TOKEN_LEN {
        format!("a token must be at most {MAX_TOKEN_LEN} bytes")
    } else if !secret.bytes().all(|b| b.is_ascii_graphic()) {
        "a token must be printable ASCII without spaces (it travels in an HTTP header)".to_string()
    } else {
        return Some(secret.to_string());
    };
    report.error(value.mark, field, why);
    None
}

/// `true` or `false`.
pub(super) fn flag(
    value: Option<&Spanned<String>>,
    field: &str,
    report: &mut Report,
) -> Option<bool> {
    let value = value?;
    match value.value.trim() {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        other => {
            let why = format!("invalid {other:?}: expected true or false");
            report.error(value.mark, field, why);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::parse_with_env;

    const JOBS: &str =
        "jobs:\n  - name: a\n    schedule: \"* * * * *\"\n    command: [\"/bin/true\"]\n";

    fn parse(head: &str) -> Result<crate::config::Config, String> {
        let env = |name: &str| (name == "TOKEN").then(|| "0123456789abcdef-secret".to_string());
        parse_with_env(&format!("{head}{JOBS}"), Path::new("jobs.yaml"), &env)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn allowed_hosts_are_names_lower_cased() {
        let config =
            parse("dashboard:\n  allowed_hosts: [Cron.Example.COM., cron-1]\n").expect("valid");
        assert_eq!(
            config.dashboard.allowed_hosts,
            ["cron.example.com", "cron-1"]
        );
    }

    #[test]
    fn defaults_serve_read_only_on_loopback_only() {
        let config = parse("worker:\n  listen: 127.0.0.1:9464\n").expect("valid");
        assert_eq!(config.dashboard, DashboardConfig::default());
        let loopback = "127.0.0.1:9464".parse().ok();
        assert_eq!(config.dashboard.serving(loopback), Serving::Open);
        let open = config.dashboard.serving("0.0.0.0:9464".parse().ok());
        assert!(
            matches!(open, Serving::Off(ref why) if why.contains("not a loopback")),
            "{open:?}"
        );
        assert!(matches!(config.dashboard.serving(None), Serving::Off(_)));
        let public =
            parse("worker:\n  listen: 0.0.0.0:9464\ndashboard:\n  public: true\n").expect("valid");
        assert_eq!(
            public.dashboard.serving("0.0.0.0:9464".parse().ok()),
            Serving::Open
        );
        let warned = parse("worker:\n  listen: 0.0.0.0:9464\ndashboard:\n  controls: false\n")
            .expect("valid");
        assert!(
            warned
                .warnings
                .iter()
                .any(|w| w.contains("dashboard is not served")),
            "{:?}",
            warned.warnings
        );
    }

    #[test]
    fn a_token_comes_from_the_environment_and_is_kept_from_jobs_and_debug() {
        let config = parse(
            "worker:\n  listen: 0.0.0.0:9464\ndashboard:\n  token: ${TOKEN}\n  controls: true\n",
        )
        .expect("valid");
        assert_eq!(config.dashboard.tokens.len(), 1);
        assert_eq!(config.dashboard.tokens[0].name, DEFAULT_TOKEN_NAME);
        assert_eq!(
            config.dashboard.serving("0.0.0.0:9464".parse().ok()),
            Serving::Token
        );
        assert!(config.secret_env_vars.contains("TOKEN"));
        assert!(!format!("{config:?}").contains("0123456789abcdef-secret"));
        let named = parse(
            "dashboard:\n  tokens:\n    - {name: alice, token: alice-0123456789abcdef}\n    - name: ci\n      token: ${TOKEN}\n",
        )
        .expect("valid");
        let names: Vec<&str> = named
            .dashboard
            .tokens
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(names, ["alice", "ci"]);
    }

    #[test]
    fn wrong_settings_name_the_line_and_the_field() {
        for (head, expected) in [
            ("dashboard:\n  controls: true\n", "2:13: dashboard.controls: controls (pause, resume, trigger) need a token"),
            ("dashboard:\n  token: short\n", "2:10: dashboard.token: a token must be at least 16 characters"),
            ("dashboard:\n  public: maybe\n", "2:11: dashboard.public: invalid \"maybe\""),
            ("dashboard:\n  tokne: x\n", "dashboard.tokne: unknown field `tokne`"),
            ("dashboard:\n  allowed_hosts: [\"http://a.example\"]\n", "dashboard.allowed_hosts[0]: invalid host name"),
            ("dashboard:\n  allowed_hosts: a.example\n", "dashboard.allowed_hosts"),
            (
                "dashboard:\n  tokens:\n    - {name: a, token: aaaaaaaaaaaaaaaaaaaa}\n    - {name: a, token: bbbbbbbbbbbbbbbbbbbb}\n",
                "dashboard.tokens[1].name: duplicate token name \"a\"",
            ),
            (
                "dashboard:\n  tokens:\n    - {name: 'a b', token: aaaaaaaaaaaaaaaaaaaa}\n",
                "dashboard.tokens[0].name: invalid token name",
            ),
            ("dashboard:\n  token: \"has a space in it here\"\n", "printable ASCII without spaces"),
        ] {
            let error = parse(head).expect_err(head);
            assert!(error.contains(expected), "{head:?}: {error}");
            assert!(!error.contains("bbbbbbbbbbbbbbbbbbbb"), "a secret in {error}");
        }
    }
}
