//! The workers' jobs file, and their clocks.

use std::path::Path;

use super::{Breakage, GRACE_S, LONG_JOB, LONG_MS, RENEW_MS, SHUTDOWN_GRACE_S, TTL_MS};

/// `+1.500` / `-2.250`: a libfaketime offset in seconds.
pub(super) fn faketime_spec(offset_ms: i64) -> String {
    let sign = if offset_ms < 0 { '-' } else { '+' };
    format!(
        "{sign}{}.{:03}",
        offset_ms.abs() / 1000,
        offset_ms.abs() % 1000
    )
}

/// The jobs file of worker `w`.
pub(super) fn config(
    worker: usize,
    nodes: &[String],
    ledger: &Path,
    breakage: Option<Breakage>,
) -> String {
    let nodes = nodes
        .iter()
        .map(|url| format!("\"{url}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let ledger = ledger.display();
    let trap = if breakage == Some(Breakage::IgnoreSigterm) {
        "trap '' TERM; "
    } else {
        ""
    };
    format!(
        r#"redis:
  nodes: [{nodes}]
lock:
  ttl: {TTL_MS}ms
  renew_every: {RENEW_MS}ms
  node_timeout: 200ms
  retry_delay: 100ms
worker:
  id: w{worker}
  shutdown_grace: {SHUTDOWN_GRACE_S}s
  clock_check_every: 1s
jobs:
  - name: quick
    schedule: "* * * * * *"
    command: ['{ledger}', start, job]
    misfire_grace: {GRACE_S}s
    env: {{LD_PRELOAD: ""}}
  - name: parallel
    schedule: "* * * * * *"
    overlap: allow
    command: ['{ledger}', start, tick]
    misfire_grace: {GRACE_S}s
    env: {{LD_PRELOAD: ""}}
  - name: {LONG_JOB}
    schedule: "* * * * * *"
    command: "{trap}{ledger} start job && sleep {long_s} && {ledger} end job"
    timeout: 30s
    misfire_grace: {GRACE_S}s
    env: {{LD_PRELOAD: ""}}
"#,
        long_s = LONG_MS as f64 / 1000.0,
    )
}
