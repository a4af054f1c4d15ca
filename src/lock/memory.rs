//! The embedded store in process memory.

use super::{ClaimOutcome, ClaimRequest, Lease, LockSettings, RenewError};

/// Leases, claims and tokens in process memory.
pub struct MemoryStore {
    settings: LockSettings,
}

impl MemoryStore {
    pub fn claim_many(&self, _worker_id: &str, _requests: &[ClaimRequest]) -> Vec<ClaimOutcome> {
        Vec::new()
    }
    pub fn renew(&self, _lease: &mut Lease) -> Result<(), RenewError> {
        Err(RenewError::AlreadyLost)
    }
    pub fn release(&self, _lease: &Lease) {}
    pub fn settings(&self) -> &LockSettings {
        &self.settings
    }
}
