//! How often a client may offer a token (a bearer header or the login form): one failure per client
//! address per [`COOLDOWN`]. A candidate from an address whose last failure is more recent is not even
//! checked: it is answered 429 at once, so a guesser learns nothing from it and holds no connection
//! while it waits. The failure itself is answered after [`super::auth::FAILED_ATTEMPT_DELAY`], holding
//! that one connection; a flood of wrong tokens from one address therefore holds at most one connection
//! at a time, and a session cookie (no guess) is never held back.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The least time between two failed attempts of one client address.
pub(crate) const COOLDOWN: Duration = Duration::from_secs(1);
/// The most addresses remembered: past it, addresses not yet seen wait for the oldest to cool down
/// (a guesser with more addresses than this gets this many tries per [`COOLDOWN`] in all).
const MAX_CLIENTS: usize = 4096;

/// What became of one offered token.
pub(super) enum Attempt<T> {
    /// It proved a token (or offered none).
    Passed(T),
    /// It was checked and wrong: the client's cooldown starts now.
    Failed,
    /// Not checked: the client failed less than [`COOLDOWN`] ago.
    Cooling,
}

/// The last failure of each client address, within [`COOLDOWN`].
pub(super) struct Attempts(Mutex<HashMap<IpAddr, Instant>>);

impl Attempts {
    pub(super) fn new() -> Attempts {
        Attempts(Mutex::new(HashMap::new()))
    }

    /// Runs `check` of a token offered by `from` unless `from` is cooling down; a failure (`Err`) starts
    /// its cooldown. The check runs under the lock (it is a few HMACs), so concurrent attempts of one
    /// address are counted one by one.
    pub(super) fn attempt<T>(
        &self,
        from: IpAddr,
        check: impl FnOnce() -> Result<T, ()>,
    ) -> Attempt<T> {
        let now = Instant::now();
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if last
            .get(&from)
            .is_some_and(|at| now.duration_since(*at) < COOLDOWN)
        {
            return Attempt::Cooling;
        }
        if !last.contains_key(&from) && last.len() >= MAX_CLIENTS {
            last.retain(|_, at| now.duration_since(*at) < COOLDOWN);
            if last.len() >= MAX_CLIENTS {
                return Attempt::Cooling;
            }
        }
        match check() {
            Ok(value) => Attempt::Passed(value),
            Err(()) => {
                last.insert(from, now);
                Attempt::Failed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_failure_per_address_per_cooldown_and_no_check_while_cooling() {
        let attempts = Attempts::new();
        let one: IpAddr = [10, 0, 0, 1].into();
        let two: IpAddr = [10, 0, 0, 2].into();
        assert!(matches!(
            attempts.attempt(one, || Ok(())),
            Attempt::Passed(())
        ));
        assert!(matches!(
            attempts.attempt(one, || Err::<(), _>(())),
            Attempt::Failed
        ));
        let mut checked = false;
        let cooling = attempts.attempt(one, || {
            checked = true;
            Ok(())
        });
        assert!(
            matches!(cooling, Attempt::Cooling) && !checked,
            "not checked"
        );
        assert!(matches!(
            attempts.attempt(two, || Ok(())),
            Attempt::Passed(())
        ));
    }
}
