//! Who may see the dashboard and act through it: tokens, session cookies, and the CSRF rules.
//!
//! - A request proves a token with `Authorization: Bearer <token>`, or with the session cookie that
//!   `POST /login` (form field `token`) sets. A token is never read from a URL.
//! - Tokens are compared in constant time: the candidate's HMAC under a key drawn at start is checked
//!   against each token's ([`ring::hmac::verify`]), so the time taken says nothing of how much matched.
//! - The cookie holds no secret and no server state: `v1.<name in hex>.<issued, unix seconds>.<mac>`, the
//!   mac an HMAC-SHA256 of the rest under the token itself. Any worker with the same config accepts it
//!   (behind a load balancer), changing or removing the token ends its sessions, and a cookie lives
//!   [`SESSION_LIFETIME`]. It is `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page
//!   sends it) and `Path=/`.
//! - A state-changing request is refused (403) before anything else when a browser says it comes from
//!   another site (`Sec-Fetch-Site` other than `same-origin` or `none`) or an `Origin` header names
//!   another origin than the request's `Host`, or a name that is not the dashboard's ([`super::hosts`]). With the cookie it must also carry the session's CSRF
//!   token (form field `csrf` or header `X-CSRF-Token`): an HMAC of the cookie under the token. Bearer
//!   requests need no CSRF token: a browser never adds that header by itself.

use std::time::Duration;

use axum::http::{header, HeaderMap};
use ring::hmac;

use crate::config::DashboardToken;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "redcron_session";
/// How long a session cookie is accepted after its login.
pub(crate) const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// How long a failed attempt holds its answer back. A client address gets one try per
/// [`super::attempts::COOLDOWN`]; its tries in between are not checked.
pub(crate) const FAILED_ATTEMPT_DELAY: Duration = Duration::from_secs(1);
/// The longest cookie value read; anything longer is not ours.
const MAX_COOKIE: usize = 512;

/// Who made a request, as the history and the logs name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Operator {
    /// The token's name.
    pub name: String,
    /// How it proved the token.
    pub via: Proof,
    /// For a session: its cookie value (the CSRF token is derived from it).
    pub session: Option<String>,
}

/// How a request proved its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proof {
    Bearer,
    Cookie,
}

/// The tokens of the config in force, keyed for constant-time checks.
pub(crate) struct Keys {
    /// Drawn at start: the candidate's tag under it is compared with each token's.
    compare: hmac::Key,
    tokens: Vec<KeyedToken>,
}

struct KeyedToken {
    name: String,
    /// The token's tag under [`Keys::compare`].
    tag: hmac::Tag,
    /// The token as an HMAC key, for its sessions' cookies and CSRF tokens.
    key: hmac::Key,
}

impl Keys {
    /// Keys for `tokens`.
    pub(crate) fn new(tokens: &[DashboardToken]) -> Keys {
        let mut seed = [0u8; 32];
        rand::fill(&mut seed);
        let compare = hmac::Key::new(hmac::HMAC_SHA256, &seed);
        let tokens = tokens
            .iter()
            .map(|token| KeyedToken {
                name: token.name.clone(),
                tag: hmac::sign(&compare, token.secret.as_bytes()),
                key: hmac::Key::new(hmac::HMAC_SHA256, token.secret.as_bytes()),
            })
            .collect();
        Keys { compare, tokens }
    }

    /// Whether any token is configured.
    pub(crate) fn any(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// The name of the token `candidate` is, if it is one. Every token is checked, whichever matches.
    pub(crate) fn check(&self, candidate: &str) -> Option<String> {
        let mut found = None;
        for token in &self.tokens {
            let tag = token.tag.as_ref();
            if hmac::verify(&self.compare, candidate.as_bytes(), tag).is_ok() && found.is_none() {
                found = Some(token.name.clone());
            }
        }
        found
    }

    /// A session cookie's value for the token `name`, issued at `now` (unix seconds).
    pub(crate) fn session(&self, name: &str, now: i64) -> Option<String> {
        let token = self.tokens.iter().find(|t| t.name == name)?;
        let body = format!("v1.{}.{now}", hex(name.as_bytes()));
        let mac = hmac::sign(&token.key, body.as_bytes());
        Some(format!("{body}.{}", hex(mac.as_ref())))
    }

    /// The token name a session cookie `value` proves at `now` (unix seconds), if it is valid: made by
    /// [`Keys::session`] with a token still configured, and neither expired nor issued in the future
    /// (beyond a minute of clock difference between workers).
    pub(crate) fn verify_session(&self, value: &str, now: i64) -> Option<String> {
        if value.len() > MAX_COOKIE {
            return None;
        }
        let mut parts = value.split('.');
        let (Some("v1"), Some(name), Some(issued), Some(mac), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let name = String::from_utf8(unhex(name)?).ok()?;
        let issued: i64 = issued.parse().ok()?;
        let age = now.checked_sub(issued)?;
        if age < -60 || age > SESSION_LIFETIME.as_secs() as i64 {
            return None;
        }
        let token = self.tokens.iter().find(|t| t.name == name)?;
        let body = &value[..value.len() - mac.len() - 1];
        hmac::verify(&token.key, body.as_bytes(), &unhex(mac)?).ok()?;
        Some(name)
    }

    /// The CSRF token of a session (its cookie `value`, proven by [`Keys::verify_session`] to be
    /// `name`'s).
    pub(crate) fn csrf(&self, name: &str, session: &str) -> Option<String> {
        let token = self.tokens.iter().find(|t| t.name == name)?;
        let mac = hmac::sign(&token.key, format!("csrf.{session}").as_bytes());
        Some(hex(mac.as_ref()))
    }

    /// Whether `candidate` is the CSRF token of `name`'s session `session`, compared in constant time.
    pub(crate) fn check_csrf(&self, name: &str, session: &str, candidate: &str) -> bool {
        let Some(token) = self.tokens.iter().find(|t| t.name == name) else {
            return false;
        };
        let Some(candidate) = unhex(candidate) else {
            return false;
        };
        let message = format!("csrf.{session}");
        hmac::verify(&token.key, message.as_bytes(), &candidate).is_ok()
    }

    /// Who `headers` say made the request at `now` (unix seconds): a bearer token, else a session cookie.
    /// A bearer header that names no token is a failure even if a cookie would do (`Err`); no proof at
    /// all is `Ok(None)`.
    pub(crate) fn operator(&self, headers: &HeaderMap, now: i64) -> Result<Option<Operator>, ()> {
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let value = value.to_str().map_err(|_| ())?;
            let candidate = value
                .strip_prefix("Bearer ")
                .or_else(|| value.strip_prefix("bearer "))
                .ok_or(())?;
            let name = self.check(candidate.trim()).ok_or(())?;
            return Ok(Some(Operator {
                name,
                via: Proof::Bearer,
                session: None,
            }));
        }
        let Some(cookie) = cookie(headers, COOKIE) else {
            return Ok(None);
        };
        match self.verify_session(&cookie, now) {
            Some(name) => Ok(Some(Operator {
                name,
                via: Proof::Cookie,
                session: Some(cookie),
            })),
            // An expired or foreign cookie is no proof: the page asks for a login again.
            None => Ok(None),
        }
    }
}

/// The `Set-Cookie` value of a session.
pub(crate) fn set_cookie(value: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        SESSION_LIFETIME.as_secs()
    )
}

/// The `Set-Cookie` value that ends a session.
pub(crate) fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_string())
}

/// Why a state-changing request is refused as cross-site, if it is: a browser's `Sec-Fetch-Site` other
/// than `same-origin` or `none` (typed or bookmarked), or an `Origin` that is not one of the dashboard's
/// names (`allows`, [`super::hosts`]) or not this request's `Host` (another port is another site).
pub(crate) fn cross_site(headers: &HeaderMap, allows: &dyn Fn(&str) -> bool) -> Option<String> {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("?");
        if site != "same-origin" && site != "none" {
            return Some(format!(
                "Sec-Fetch-Site is {site:?}: the request came from another site"
            ));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("?");
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        let same = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|authority| {
                allows(authority) && !host.is_empty() && authority.eq_ignore_ascii_case(host)
            });
        if !same {
            return Some(format!(
                "Origin {origin:?} is not this dashboard's ({host:?}): the request came from another site"
            ));
        }
    }
    None
}

/// Lower-case hex.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(DIGITS[usize::from(byte >> 4)] as char);
        text.push(DIGITS[usize::from(byte & 15)] as char);
    }
    text
}

/// The bytes of lower- or upper-case hex, if it is hex.
fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > MAX_COOKIE {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn keys() -> Keys {
        Keys::new(&[
            DashboardToken {
                name: "alice".into(),
                secret: "alice-secret-0123456789".into(),
            },
            DashboardToken {
                name: "ops".into(),
                secret: "ops-secret-0123456789ab".into(),
            },
        ])
    }

    #[test]
    fn a_token_names_its_holder_and_nothing_else_passes() {
        let keys = keys();
        assert_eq!(
            keys.check("alice-secret-0123456789").as_deref(),
            Some("alice")
        );
        assert_eq!(
            keys.check("ops-secret-0123456789ab").as_deref(),
            Some("ops")
        );
        for wrong in [
            "",
            "alice-secret-012345678",
            "alice-secret-01234567890",
            "ALICE-SECRET-0123456789",
        ] {
            assert_eq!(keys.check(wrong), None, "{wrong:?}");
        }
        assert!(!Keys::new(&[]).any());
    }

    #[test]
    fn a_session_cookie_is_accepted_until_it_expires_and_only_as_made() {
        let keys = keys();
        let now = 1_800_000_000;
        let cookie = keys.session("alice", now).expect("a token");
        assert_eq!(keys.verify_session(&cookie, now).as_deref(), Some("alice"));
        let lifetime = SESSION_LIFETIME.as_secs() as i64;
        assert_eq!(
            keys.verify_session(&cookie, now + lifetime).as_deref(),
            Some("alice")
        );
        assert_eq!(
            keys.verify_session(&cookie, now + lifetime + 1),
            None,
            "expired"
        );
        assert_eq!(
            keys.verify_session(&cookie, now - 3600),
            None,
            "issued in the future"
        );
        // Another name, time or mac: refused.
        let forged = cookie.replace(&hex(b"alice"), &hex(b"ops"));
        assert_eq!(keys.verify_session(&forged, now), None);
        let later = cookie.replace(&now.to_string(), &(now + 100).to_string());
        assert_eq!(keys.verify_session(&later, now + 100), None);
        // Made by another worker with the same tokens: accepted (no server state).
        assert_eq!(
            self::keys().verify_session(&cookie, now).as_deref(),
            Some("alice")
        );
        // A removed token ends its sessions.
        let without_alice = Keys::new(&[DashboardToken {
            name: "ops".into(),
            secret: "ops-secret-0123456789ab".into(),
        }]);
        assert_eq!(without_alice.verify_session(&cookie, now), None);
        for junk in [
            "",
            "v1",
            "v1...",
            "v2.61.1.00",
            &"a".repeat(10_000),
            "v1.zz.1.00",
        ] {
            assert_eq!(keys.verify_session(junk, now), None, "{junk:?}");
        }
    }

    #[test]
    fn the_csrf_token_belongs_to_its_session() {
        let keys = keys();
        let one = keys.session("alice", 1).expect("a token");
        let two = keys.session("alice", 2).expect("a token");
        let csrf = keys.csrf("alice", &one).expect("a token");
        assert!(keys.check_csrf("alice", &one, &csrf));
        assert!(!keys.check_csrf("alice", &two, &csrf), "another session's");
        assert!(!keys.check_csrf("ops", &one, &csrf), "another token's");
        assert!(!keys.check_csrf("alice", &one, ""));
        assert!(!keys.check_csrf("alice", &one, "not hex"));
    }

    #[test]
    fn bearer_beats_cookie_and_a_wrong_bearer_fails() {
        let keys = keys();
        let mut headers = HeaderMap::new();
        assert_eq!(keys.operator(&headers, 10), Ok(None));
        let cookie = keys.session("ops", 10).expect("a token");
        let value = format!("theme=dark; {COOKIE}={cookie}");
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&value).expect("ascii"),
        );
        let by_cookie = keys
            .operator(&headers, 10)
            .expect("valid")
            .expect("an operator");
        assert_eq!(
            (by_cookie.name.as_str(), by_cookie.via),
            ("ops", Proof::Cookie)
        );
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer alice-secret-0123456789"),
        );
        let by_bearer = keys
            .operator(&headers, 10)
            .expect("valid")
            .expect("an operator");
        assert_eq!(
            (by_bearer.name.as_str(), by_bearer.via),
            ("alice", Proof::Bearer)
        );
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer nope"),
        );
        assert_eq!(keys.operator(&headers, 10), Err(()));
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic YWxpY2U6eA=="),
        );
        assert_eq!(keys.operator(&headers, 10), Err(()));
    }

    #[test]
    fn cross_site_requests_are_told_apart() {
        let with = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(*name, HeaderValue::from_static(value));
            }
            // The dashboard's names: addresses and localhost ([`super::super::hosts`]).
            let allows = |authority: &str| {
                authority.starts_with("127.0.0.1") || authority.starts_with("localhost")
            };
            cross_site(&headers, &allows)
        };
        assert_eq!(with(&[]), None, "curl sends neither");
        assert_eq!(with(&[("sec-fetch-site", "same-origin")]), None);
        assert_eq!(with(&[("sec-fetch-site", "none")]), None);
        assert!(with(&[("sec-fetch-site", "cross-site")]).is_some());
        assert!(
            with(&[("sec-fetch-site", "same-site")]).is_some(),
            "another port"
        );
        let host = ("host", "127.0.0.1:9464");
        assert_eq!(with(&[host, ("origin", "http://127.0.0.1:9464")]), None);
        assert!(with(&[host, ("origin", "http://127.0.0.1:9465")]).is_some());
        assert!(with(&[host, ("origin", "null")]).is_some());
        let rebound = ("host", "evil.example:9464");
        assert!(
            with(&[rebound, ("origin", "http://evil.example:9464")]).is_some(),
            "a name that is not the dashboard's, even as the Host"
        );
        assert!(
            with(&[("origin", "http://evil.example")]).is_some(),
            "no host"
        );
    }
}
