//! Latency samples, their percentiles, and the Markdown tables the benchmark prints.
//!
//! Percentiles are nearest-rank on the sorted samples: with 1000 samples p99 is the 990th, with 50 it is
//! the largest. Every table is plain Markdown so that a run can be pasted into the README as it is.

use std::fmt::Write as _;
use std::time::Duration;

/// The latencies of one series, in the order they were taken.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    values: Vec<Duration>,
}

impl Samples {
    pub fn push(&mut self, value: Duration) {
        self.values.push(value);
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The nearest-rank percentile `p` (0–100); `None` without samples.
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        if self.values.is_empty() {
            return None;
        }
        let mut sorted = self.values.clone();
        sorted.sort_unstable();
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        Some(sorted[rank.clamp(1, sorted.len()) - 1])
    }

    pub fn p50(&self) -> Option<Duration> {
        self.percentile(50.0)
    }

    pub fn p99(&self) -> Option<Duration> {
        self.percentile(99.0)
    }

    pub fn mean(&self) -> Option<Duration> {
        let total: Duration = self.values.iter().sum();
        u32::try_from(self.values.len())
            .ok()
            .filter(|n| *n > 0)
            .map(|n| total / n)
    }

    /// Sequential cycles per second: one over the mean.
    pub fn per_second(&self) -> Option<f64> {
        self.mean().map(|mean| 1.0 / mean.as_secs_f64().max(1e-9))
    }
}

/// Milliseconds with three decimals, or `–` when there is no figure.
pub fn ms(value: Option<Duration>) -> String {
    match value {
        Some(value) if value.as_secs_f64() >= 1.0 => format!("{:.0}", value.as_secs_f64() * 1e3),
        Some(value) => format!("{:.3}", value.as_secs_f64() * 1e3),
        None => "–".to_string(),
    }
}

/// `a / b` as `1.23×`, or `–`.
pub fn ratio(a: Option<Duration>, b: Option<Duration>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if !b.is_zero() => format!("{:.2}×", a.as_secs_f64() / b.as_secs_f64()),
        _ => "–".to_string(),
    }
}

/// `a / b` as a number, for target checks.
pub fn quotient(a: Option<Duration>, b: Option<Duration>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if !b.is_zero() => Some(a.as_secs_f64() / b.as_secs_f64()),
        _ => None,
    }
}

/// A Markdown table: a header row, then rows of the same width.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.header.len());
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                let cells = self.rows.iter().map(|r| r[c].chars().count());
                cells
                    .chain([self.header[c].chars().count()])
                    .max()
                    .unwrap_or(1)
            })
            .collect();
        let line = |cells: &[String]| {
            let mut out = String::from("|");
            for (cell, width) in cells.iter().zip(&widths) {
                let pad = width - cell.chars().count();
                // Numbers align right, names left.
                if cell.starts_with(|c: char| c.is_ascii_digit() || c == '–' || c == '>') {
                    let _ = write!(out, " {}{} |", " ".repeat(pad), cell);
                } else {
                    let _ = write!(out, " {}{} |", cell, " ".repeat(pad));
                }
            }
            out.push('\n');
            out
        };
        let mut out = line(&self.header);
        out.push('|');
        for width in &widths {
            let _ = write!(out, "{}|", "-".repeat(width + 2));
        }
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// One target of the issue and whether this run met it.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub target: String,
    pub measured: String,
    /// `None` when the run could not measure it.
    pub met: Option<bool>,
}

impl Verdict {
    pub fn new(
        target: impl Into<String>,
        measured: impl Into<String>,
        met: Option<bool>,
    ) -> Verdict {
        Verdict {
            target: target.into(),
            measured: measured.into(),
            met,
        }
    }
}

/// The verdicts as a table.
pub fn verdicts(verdicts: &[Verdict]) -> String {
    let mut table = Table::new(&["target", "measured", "met"]);
    for v in verdicts {
        let met = match v.met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "not measured",
        };
        table.row(vec![v.target.clone(), v.measured.clone(), met.to_string()]);
    }
    table.render()
}
