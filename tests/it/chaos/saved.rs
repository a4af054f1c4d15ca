//! The checker's material on disk: written into the test directory (which is kept when the test fails)
//! and read back by `chaos::replay_a_saved_run`, so that a failed run's verdict can be examined — and
//! the checker changed and run again — without the cluster.
//!
//! Files: `run.json` (store, window, planned cases, timeline), `ledger.txt` (the ledger's entries as it wrote
//! them), `claims.txt` (the nodes' claim writes, see [`super::claims`]), `w<worker>-<process>.log`
//! (`<arrival ms> <event JSON>` per line), `w<worker>-<process>.bad` (lines that were not JSON, if any),
//! and `report.txt`.

use std::path::Path;

use serde_json::{json, Value};

use super::checker::{self, Input};
use super::claims::ClaimWrite;
use super::facts::InstanceLog;
use super::faults::Case;
use super::ledger::Attempt;
use super::report::Report;
use super::store::StoreKind;
use super::timeline::{Happening, Timeline};

/// Everything [`checker::check`] reads, but the fixed job list (the TTL is the store's).
pub struct Saved {
    pub store: StoreKind,
    pub window: (i64, i64),
    pub planned_cases: Vec<Case>,
    pub timeline: Timeline,
    pub logs: Vec<InstanceLog>,
    pub ledger: Vec<Attempt>,
    pub claims: Vec<ClaimWrite>,
}

impl Saved {
    pub fn check(&self) -> Report {
        checker::check(&Input {
            store: self.store,
            jobs: &super::jobs(),
            ttl_ms: self.store.ttl_ms() as i64,
            window: self.window,
            timeline: &self.timeline,
            logs: &self.logs,
            ledger: &self.ledger,
            claims: &self.claims,
            planned_cases: &self.planned_cases,
        })
    }

    pub fn write(&self, dir: &Path, report: &str) -> std::io::Result<()> {
        let run = json!({
            "store": self.store,
            "window": [self.window.0, self.window.1],
            "planned_cases": self.planned_cases,
            "timeline": self.timeline.entries,
        });
        std::fs::write(dir.join("run.json"), format!("{run:#}\n"))?;
        let ledger: String = self.ledger.iter().map(|a| a.line() + "\n").collect();
        std::fs::write(dir.join("ledger.txt"), ledger)?;
        let claims: String = self.claims.iter().map(|c| c.line() + "\n").collect();
        std::fs::write(dir.join("claims.txt"), claims)?;
        for log in &self.logs {
            let name = format!("w{}-{}", log.worker, log.instance);
            let events: String = log
                .events
                .iter()
                .map(|(at, e)| format!("{at} {e}\n"))
                .collect();
            std::fs::write(dir.join(format!("{name}.log")), events)?;
            if !log.bad_lines.is_empty() {
                std::fs::write(dir.join(format!("{name}.bad")), log.bad_lines.join("\n"))?;
            }
        }
        std::fs::write(dir.join("report.txt"), report)
    }

    pub fn read(dir: &Path) -> Result<Saved, String> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name)).map_err(|e| format!("{name}: {e}"))
        };
        let run: Value =
            serde_json::from_str(&read("run.json")?).map_err(|e| format!("run.json: {e}"))?;
        // Runs saved before etcd was a store were on Redis.
        let store = serde_json::from_value(run["store"].clone()).unwrap_or(StoreKind::Redis);
        let window = serde_json::from_value::<(i64, i64)>(run["window"].clone())
            .map_err(|e| format!("run.json window: {e}"))?;
        let planned_cases = serde_json::from_value(run["planned_cases"].clone())
            .map_err(|e| format!("run.json planned_cases: {e}"))?;
        let entries: Vec<(i64, Happening)> = serde_json::from_value(run["timeline"].clone())
            .map_err(|e| format!("run.json timeline: {e}"))?;
        let ledger = read("ledger.txt")?
            .lines()
            .map(Attempt::parse)
            .collect::<Result<_, _>>()?;
        // Runs saved before the claims were read have none.
        let claims = std::fs::read_to_string(dir.join("claims.txt"))
            .unwrap_or_default()
            .lines()
            .map(ClaimWrite::parse)
            .collect::<Result<_, _>>()?;
        let mut logs = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
            let path = entry.map_err(|e| e.to_string())?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(stem) = name.strip_suffix(".log").and_then(|n| n.strip_prefix('w')) else {
                continue;
            };
            let Some((worker, instance)) = stem.split_once('-') else {
                continue;
            };
            let (Ok(worker), Ok(instance)) = (worker.parse(), instance.parse()) else {
                continue;
            };
            let mut events = Vec::new();
            for line in read(name)?.lines() {
                let (at, event) = line
                    .split_once(' ')
                    .ok_or_else(|| format!("{name}: {line:?}"))?;
                let at = at.parse().map_err(|_| format!("{name}: {line:?}"))?;
                events.push((
                    at,
                    serde_json::from_str(event).map_err(|e| format!("{name}: {e}"))?,
                ));
            }
            let bad = std::fs::read_to_string(dir.join(format!("w{stem}.bad"))).unwrap_or_default();
            let bad_lines = bad.lines().map(str::to_owned).collect();
            logs.push(InstanceLog {
                instance,
                worker,
                events,
                bad_lines,
            });
        }
        logs.sort_by_key(|log| log.instance);
        Ok(Saved {
            store,
            window,
            planned_cases,
            timeline: Timeline { entries },
            logs,
            ledger,
            claims,
        })
    }
}
