//! The sessions ended by `POST /logout` on this worker: a session cookie holds no server state, so
//! without this list a cookie copied before its logout would open the dashboard until it expires.
//!
//! Each ended session is kept by its cookie's mac until the cookie would have expired anyway
//! ([`super::auth::SESSION_LIFETIME`] after the logout at the latest), at most [`MAX_REVOKED`] of them:
//! past that the one that expires soonest is forgotten first (only a token's holder can log out, so
//! only they can fill the list). The list is this worker's own: another worker behind the same load
//! balancer accepts the cookie until it expires.

use std::collections::HashMap;
use std::sync::Mutex;

use super::auth::SESSION_LIFETIME;

/// The most ended sessions remembered.
const MAX_REVOKED: usize = 10_000;

/// Ended sessions: each cookie's mac and when (unix seconds) it would expire anyway.
pub(super) struct Revoked(Mutex<HashMap<String, i64>>);

impl Revoked {
    pub(super) fn new() -> Revoked {
        Revoked(Mutex::new(HashMap::new()))
    }

    /// Ends the session of cookie `value` at `now` (unix seconds).
    pub(super) fn revoke(&self, value: &str, now: i64) {
        let mut ended = self.0.lock().unwrap_or_else(|p| p.into_inner());
        ended.retain(|_, expires| *expires >= now);
        if ended.len() >= MAX_REVOKED {
            let soonest = ended
                .iter()
                .min_by_key(|(_, expires)| **expires)
                .map(|(mac, _)| mac.clone());
            if let Some(soonest) = soonest {
                ended.remove(&soonest);
            }
        }
        // A minute beyond the lifetime: the cookie may be issued up to a minute ahead (another worker's
        // clock).
        let expires = now + SESSION_LIFETIME.as_secs() as i64 + 60;
        ended.insert(mac_of(value).to_string(), expires);
    }

    /// Whether the session of cookie `value` was ended.
    pub(super) fn is_revoked(&self, value: &str) -> bool {
        let ended = self.0.lock().unwrap_or_else(|p| p.into_inner());
        ended.contains_key(mac_of(value))
    }
}

/// The mac of a cookie (its last part): what tells one session from another.
fn mac_of(value: &str) -> &str {
    value.rsplit('.').next().unwrap_or(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ended_session_stays_ended_and_the_list_is_bounded() {
        let revoked = Revoked::new();
        revoked.revoke("v1.61.100.aa", 100);
        assert!(revoked.is_revoked("v1.61.100.aa"));
        assert!(!revoked.is_revoked("v1.61.100.bb"));
        for i in 0..MAX_REVOKED + 5 {
            revoked.revoke(&format!("v1.61.100.{i:x}"), 200 + i as i64);
        }
        assert!(revoked.0.lock().expect("not poisoned").len() <= MAX_REVOKED);
        assert!(revoked.is_revoked(&format!("v1.61.100.{:x}", MAX_REVOKED + 4)));
    }
}
