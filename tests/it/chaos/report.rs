//! The checker's verdict and the table it prints.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

/// One row of the table.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub job: String,
    pub overlap: &'static str,
    pub ticks: usize,
    pub run: usize,
    pub duplicates: usize,
    pub explained: usize,
    pub unexplained: usize,
    pub stale_rejected: usize,
    pub stale_unexplained: usize,
    pub token_violations: usize,
}

/// The checker's verdict.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub rows: Vec<Row>,
    /// Explained misses by reason.
    pub reasons: BTreeMap<String, usize>,
    /// Lines about the deterministic cases and other notable facts.
    pub notes: Vec<String>,
    /// What broke a rule; empty when the run passed.
    pub failures: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// `HH:MM:SS.mmm` (UTC) of a Unix-ms instant: enough to find it in the logs.
pub fn show_time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map_or(ms.to_string(), |t| t.format("%H:%M:%S%.3f").to_string())
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut table = String::new();
        let _ = writeln!(
            table,
            "{:<12} {:<7} {:>6} {:>6} {:>5} {:>17} {:>19} {:>14} {:>12}",
            "job",
            "overlap",
            "ticks",
            "run",
            "dups",
            "missed, explained",
            "missed, unexplained",
            "stale rejected",
            "token order"
        );
        let mut total = Row {
            job: "total".into(),
            overlap: "",
            ..Row::default()
        };
        for row in &self.rows {
            write_row(&mut table, row);
            total.ticks += row.ticks;
            total.run += row.run;
            total.duplicates += row.duplicates;
            total.explained += row.explained;
            total.unexplained += row.unexplained;
            total.stale_rejected += row.stale_rejected;
            total.stale_unexplained += row.stale_unexplained;
            total.token_violations += row.token_violations;
        }
        write_row(&mut table, &total);
        f.write_str(&table)?;
        if !self.reasons.is_empty() {
            writeln!(f, "explained misses:")?;
            for (reason, count) in &self.reasons {
                writeln!(f, "  {count:>4}  {reason}")?;
            }
        }
        for note in &self.notes {
            writeln!(f, "- {note}")?;
        }
        if self.failures.is_empty() {
            writeln!(f, "verdict: PASS")
        } else {
            writeln!(f, "verdict: FAIL ({} problems)", self.failures.len())?;
            for failure in &self.failures {
                writeln!(f, "  * {failure}")?;
            }
            Ok(())
        }
    }
}

fn write_row(table: &mut String, row: &Row) {
    let stale = if row.stale_unexplained > 0 {
        format!("{} ({} live!)", row.stale_rejected, row.stale_unexplained)
    } else {
        row.stale_rejected.to_string()
    };
    let _ = writeln!(
        table,
        "{:<12} {:<7} {:>6} {:>6} {:>5} {:>17} {:>19} {:>14} {:>12}",
        row.job,
        row.overlap,
        row.ticks,
        row.run,
        row.duplicates,
        row.explained,
        row.unexplained,
        stale,
        row.token_violations
    );
}
