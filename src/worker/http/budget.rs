//! The listener's connection budget: which connections are served, and whether by every route or by
//! the probes' routes only.
//!
//! The route a connection asks for is known only once its headers have arrived, and a connection holds
//! a descriptor from its accept on. So the listener's connections ([`super::Limits::connections`]) are
//! split in two at the accept: the *general* share, which serves every route, of which one client
//! address holds at most half; and a *reserve* ([`reserve_of`]) taken only when the general share is
//! full (or the client holds its half), of which one client address holds at most half too, whose
//! connections answer `/healthz`, `/readyz` and `/metrics` and nothing else (anything else is 503 at
//! once, without reading a body). A reserve connection must
//! send its headers within [`RESERVE_HEADER_TIMEOUT`] and be answered within [`RESERVE_REQUEST_TIMEOUT`],
//! so a flood that spills into the reserve frees it again within seconds. Whatever the dashboard's
//! clients do — slow bodies, slow reads, a flood of wrong tokens — a probe finds a connection.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a reserve connection may take to send its headers: a prober sends them in one packet.
pub(super) const RESERVE_HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a reserve connection may take in all: `/readyz` waits for the store up to
/// [`super::READY_TIMEOUT`].
pub(super) const RESERVE_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The reserve of `connections`: a quarter of them, at least 1 and at most 16 (a prober and a scraper
/// need a few; the general share keeps at least three quarters).
pub(super) fn reserve_of(connections: usize) -> usize {
    (connections / 4)
        .clamp(1, 16)
        .min(connections.saturating_sub(1))
}

/// The connections of the listener, general and reserve, and how many of the general ones each client
/// address holds.
pub(super) struct Budget {
    general: Arc<Semaphore>,
    reserve: Arc<Semaphore>,
    /// The most general connections one client address holds.
    per_client: usize,
    /// The most reserve connections one client address holds.
    per_client_reserve: usize,
    /// General and reserve connections open per client address; an address is removed when its last
    /// one closes, so the map holds at most as many entries as there are connections.
    clients: Arc<Mutex<HashMap<IpAddr, Open>>>,
}

/// The connections one client address holds.
#[derive(Debug, Default, Clone, Copy)]
struct Open {
    general: usize,
    reserve: usize,
}

/// A connection let in: which routes it is served, and what it holds until it closes.
pub(super) enum Admitted {
    /// Every route.
    General(Held),
    /// `/healthz`, `/readyz` and `/metrics` only.
    Reserve(Held),
}

/// What a served connection holds: its permit, and its count in its client's.
pub(super) struct Held {
    _permit: OwnedSemaphorePermit,
    client: IpAddr,
    reserve: bool,
    clients: Arc<Mutex<HashMap<IpAddr, Open>>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(open) = clients.get_mut(&self.client) {
            let count = if self.reserve {
                &mut open.reserve
            } else {
                &mut open.general
            };
            *count = count.saturating_sub(1);
            if open.general == 0 && open.reserve == 0 {
                clients.remove(&self.client);
            }
        }
    }
}

impl Budget {
    /// The budget of `connections` served at once (at least 2: one general, one reserve).
    pub(super) fn new(connections: usize) -> Budget {
        let connections = connections.max(2);
        let reserve = reserve_of(connections);
        let general = connections - reserve;
        Budget {
            general: Arc::new(Semaphore::new(general)),
            reserve: Arc::new(Semaphore::new(reserve)),
            per_client: general.div_ceil(2),
            per_client_reserve: reserve.div_ceil(2),
            clients: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Lets a connection from `client` in: a general connection while the share has one and the client
    /// holds fewer than its half, else a reserve one while the client holds fewer than half of those,
    /// else none (it is closed unanswered).
    pub(super) fn admit(&self, client: IpAddr) -> Option<Admitted> {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let open = clients.get(&client).copied().unwrap_or_default();
        let held = |permit, reserve| Held {
            _permit: permit,
            client,
            reserve,
            clients: Arc::clone(&self.clients),
        };
        if open.general < self.per_client {
            if let Ok(permit) = Arc::clone(&self.general).try_acquire_owned() {
                clients.entry(client).or_default().general += 1;
                return Some(Admitted::General(held(permit, false)));
            }
        }
        if open.reserve < self.per_client_reserve {
            if let Ok(permit) = Arc::clone(&self.reserve).try_acquire_owned() {
                clients.entry(client).or_default().reserve += 1;
                return Some(Admitted::Reserve(held(permit, true)));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_holds_half_of_each_share_and_the_reserve_is_last() {
        assert_eq!(reserve_of(25), 6);
        assert_eq!(reserve_of(256), 16);
        assert_eq!(reserve_of(4), 1);
        let budget = Budget::new(25);
        let one: IpAddr = [10, 0, 0, 1].into();
        let two: IpAddr = [10, 0, 0, 2].into();
        let mut held = Vec::new();
        for _ in 0..10 {
            match budget.admit(one) {
                Some(Admitted::General(h)) => held.push(h),
                _ => panic!("a general connection"),
            }
        }
        // The eleventh of one client goes to the reserve; another client still gets general ones.
        assert!(matches!(budget.admit(one), Some(Admitted::Reserve(_))));
        for _ in 0..9 {
            match budget.admit(two) {
                Some(Admitted::General(h)) => held.push(h),
                _ => panic!("a general connection for another client"),
            }
        }
        // Half the reserve for one client, the other half for another.
        let reserve: Vec<_> = (0..3).map(|_| budget.admit(two)).collect();
        assert!(reserve
            .iter()
            .all(|a| matches!(a, Some(Admitted::Reserve(_)))));
        assert!(budget.admit(two).is_none(), "two holds half the reserve");
        let three: IpAddr = [10, 0, 0, 3].into();
        let others: Vec<_> = (0..3).map(|_| budget.admit(three)).collect();
        assert!(others
            .iter()
            .all(|a| matches!(a, Some(Admitted::Reserve(_)))));
        assert!(budget.admit([10, 0, 0, 4].into()).is_none(), "all 25 held");
        drop((reserve, others));
        held.truncate(0);
        assert!(matches!(budget.admit(one), Some(Admitted::General(_))));
        assert!(budget.clients.lock().expect("not poisoned").len() <= 1);
    }
}
