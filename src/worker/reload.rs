//! A reload of the config file while the worker runs: check the new file, keep the old one if it has
//! problems, and say what changed.

use std::collections::BTreeMap;
use std::sync::Arc;

use tracing::{error, info, warn};

use super::Context;
use crate::config::Config;
use crate::logging::events;

/// Reads the config file again for a reload asked for by `why`. A file with problems changes nothing:
/// each problem is logged (file:line:column) and `None` returned. A valid one is returned, and what
/// changed is logged; it is the context's config from then on, shared, not copied. Store settings
/// (nodes, lock, history) cannot change without a restart, and say so.
pub(super) fn reload(
    context: &Context,
    running: &Config,
    why: &'static str,
) -> Option<Arc<Config>> {
    let mut new = match crate::config::load(&running.path) {
        Ok(new) => new,
        Err(e) => {
            context.metrics.config_reloaded(false);
            for problem in e.problems() {
                error!(event = events::config::RELOAD_FAILED, why, problem = %problem,
                       "Config not reloaded: the file has a problem; the worker keeps the config it runs");
            }
            if e.problems().is_empty() {
                error!(event = events::config::RELOAD_FAILED, why, problem = %e,
                       "Config not reloaded: the file could not be read; the worker keeps the config it runs");
            }
            return None;
        }
    };
    for warning in &new.warnings {
        warn!(event = events::config::WARNING, "{warning}");
    }
    // A worker keeps its id for its life: a file that names none keeps the one made up at start.
    if new.worker.id_is_default && running.worker.id_is_default {
        new.worker.id.clone_from(&running.worker.id);
    }
    let sections = [
        ("store", new.store != running.store),
        ("lock", new.lock != running.lock),
        ("history", new.history != running.history),
        ("worker", new.worker != running.worker),
    ];
    let changed: Vec<&str> = sections
        .iter()
        .filter(|(_, differs)| *differs)
        .map(|(name, _)| *name)
        .collect();
    if !changed.is_empty() {
        let sections = changed.join(",");
        warn!(event = events::config::RESTART_NEEDED, why, sections = %sections,
              "The {sections} settings changed: they apply after a restart; jobs are reloaded now");
    }
    let names = |config: &Config| -> BTreeMap<String, String> {
        config
            .jobs
            .iter()
            .filter(|job| job.enabled)
            .map(|job| (job.name.clone(), job.fingerprint()))
            .collect()
    };
    let (before, after) = (names(running), names(&new));
    let list = |names: Vec<&String>| {
        names
            .into_iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(",")
    };
    let added = list(after.keys().filter(|n| !before.contains_key(*n)).collect());
    let removed = list(before.keys().filter(|n| !after.contains_key(*n)).collect());
    let changed = list(
        after
            .iter()
            .filter(|(n, f)| before.get(*n).is_some_and(|old| old != *f))
            .map(|(n, _)| n)
            .collect(),
    );
    context.metrics.config_reloaded(true);
    after.keys().for_each(|job| context.metrics.add_job(job));
    *context
        .config_fingerprint
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = new.fingerprint();
    // Before the event: whoever sees `config.reloaded` finds the dashboard on the new config (its tokens).
    let new = Arc::new(new);
    context.set_config(Arc::clone(&new));
    info!(event = events::config::RELOADED, why, added = %added, changed = %changed, removed = %removed,
          jobs = after.len() as u64, fingerprint = %new.fingerprint(),
          "Config reloaded: new and changed jobs take effect from their next tick; removed jobs are no longer raced; running jobs go on");
    Some(new)
}
