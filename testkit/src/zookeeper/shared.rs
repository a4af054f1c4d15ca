//! [`SharedZk`]: one ZooKeeper ensemble per process, shared by the tests that do not disturb its members,
//! each under a chroot of its own.
//!
//! Starting an ensemble is three JVMs and an election: about 2 s and several seconds of CPU on a loaded
//! 2-core machine, which each ZooKeeper conformance test paid for itself. A ZooKeeper store keeps all its
//! data under its `/<key_prefix>` chroot (its sessions are chrooted there), so stores with distinct
//! prefixes see nothing of each other's claims, leases, pauses, records or members: a test on a
//! [`SharedZk`] gets a prefix no other test of the process has, and sees the ensemble as its own. A test
//! that kills or hangs members, or waits for the ensemble to notice a silent one, starts its own
//! ([`ZkEnsemble::start`]); [`crate::Cluster`] refuses to stop a member of a shared one.
//!
//! The ensemble starts with the first test that asks for it (later ones wait for that start) and is
//! dropped when the process exits (`atexit`): its members killed and reaped, its directory removed. A
//! process that is killed takes the members with it ([`crate::children`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::ZkEnsemble;

/// The process's shared ensemble, once started; taken (and so dropped) at exit.
static SHARED: Mutex<Option<Arc<ZkEnsemble>>> = Mutex::new(None);

/// The number in the next [`SharedZk`]'s prefix.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The process's shared 3-member ensemble and a key prefix (chroot) that no other [`SharedZk`] of the
/// process has.
pub struct SharedZk {
    ensemble: Arc<ZkEnsemble>,
    prefix: String,
}

impl SharedZk {
    /// The shared ensemble, started (and waited for, as [`ZkEnsemble::start`]) if this is the process's
    /// first; with a new prefix, `redcron-shared-<n>`.
    pub fn get() -> SharedZk {
        // A start that panicked left `None` behind: the next test tries again.
        let mut shared = SHARED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let ensemble = match shared.as_ref() {
            Some(ensemble) => Arc::clone(ensemble),
            None => {
                let ensemble = Arc::new(ZkEnsemble::start(3));
                *shared = Some(Arc::clone(&ensemble));
                // SAFETY: `drop_at_exit` is an `extern "C" fn()` with no arguments, as `atexit` wants;
                // registered once, with the ensemble it drops.
                unsafe {
                    libc::atexit(drop_at_exit);
                }
                ensemble
            }
        };
        let prefix = format!("redcron-shared-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        SharedZk { ensemble, prefix }
    }

    /// The ensemble: its addresses, ports and sessions. Its members are not to be stopped or killed.
    pub fn ensemble(&self) -> &ZkEnsemble {
        &self.ensemble
    }

    /// This test's key prefix: its store's chroot is `/<prefix>`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Deletes every node under this test's chroot (the chroot itself too); panics if that fails.
    pub fn delete_all(&self) {
        self.ensemble
            .session()
            .delete_tree(&format!("/{}", self.prefix))
            .unwrap_or_else(|e| panic!("cannot empty /{}: {e}", self.prefix));
    }
}

/// Drops the shared ensemble at exit if no test holds it any more (every test has ended when the test
/// harness exits): kills its members and removes its directory. Never panics: a poisoned lock is
/// taken as it is.
extern "C" fn drop_at_exit() {
    let taken = SHARED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .take();
    drop(taken);
}
