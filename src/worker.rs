//! The worker daemon.

use crate::config::Config;
use crate::shutdown::Shutdown;

/// Failures that stop the worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("lock store: {0}")]
    Store(#[from] crate::lock::StoreError),
}

/// Runs the worker until `shutdown` is requested and every running job has ended.
pub async fn run(_config: Config, _shutdown: Shutdown) -> Result<(), WorkerError> {
    Ok(())
}
