//! The tables and target checks of items 1–2 (the lease cycle, and one slow or hung node).

use std::time::Duration;

use super::cycle::{Kind, Plan, Series};
use super::stats::{ms, quotient, ratio, Table, Verdict};
use super::SLOW_DELAY;

pub fn find(series: &[Series], kind: Kind) -> Option<&Series> {
    series.iter().find(|s| s.kind == kind)
}

pub fn notes(s: &Series) -> String {
    let mut notes = Vec::new();
    if s.timeouts > 0 {
        notes.push(format!("{} timeout", s.timeouts));
    }
    if s.refusals > 0 {
        notes.push(format!(
            "{} failed: {}",
            s.refusals,
            s.first_refusal.as_deref().unwrap_or("")
        ));
    }
    if let Some(stopped) = &s.stopped {
        notes.push(format!("stopped: {stopped}"));
    }
    notes.join("; ")
}

pub fn lease_table(series: &[Series], plan: Plan) -> String {
    let floor = find(series, Kind::Floor).map(|s| (s.samples.p50(), s.samples.p99()));
    let (floor50, floor99) = floor.unwrap_or((None, None));
    let fan_out50 = find(series, Kind::FanOut).and_then(|s| s.samples.p50());
    let mut table = Table::new(&[
        "contender",
        "cycles",
        "p50 ms",
        "p99 ms",
        "cycles/s",
        "p50 × floor",
        "p99 × floor",
        "p50 × fan-out",
        "notes",
    ]);
    for s in series {
        table.row(vec![
            s.kind.name().to_string(),
            s.samples.len().to_string(),
            ms(s.samples.p50()),
            ms(s.samples.p99()),
            s.samples
                .per_second()
                .map_or("–".to_string(), |r| format!("{r:.0}")),
            ratio(s.samples.p50(), floor50),
            ratio(s.samples.p99(), floor99),
            ratio(s.samples.p50(), fan_out50),
            notes(s),
        ]);
    }
    format!(
        "\n## 1. Lease cycle: acquire + release of a fresh key, one contender, 5 nodes\n\n\
         {} cycles per contender, interleaved; each call bounded by {} s. The fan-out row is not a lock: \
         it is the same SET NX PX + DEL sent to all 5 nodes at once, the least any Redlock on this client \
         pays for its two round trips to five nodes.\n\n{}",
        plan.cycles,
        plan.call_timeout.as_secs_f64(),
        table.render()
    )
}

/// A series' p99 for comparisons: a timed-out series counts as at least the call timeout.
pub fn effective_p99(s: &Series, timeout: Duration) -> (Option<Duration>, bool) {
    if s.timeouts > 0 {
        (Some(timeout), true)
    } else {
        (s.samples.p99(), false)
    }
}

pub fn faulty_table(scenarios: &[(String, Vec<Series>)], timeout: Duration) -> String {
    let healthy = &scenarios[0].1;
    let mut table = Table::new(&[
        "node 5",
        "contender",
        "cycles",
        "p50 ms",
        "p99 ms",
        "p99 × healthy",
        "p99 ÷ redcron lease p99",
        "notes",
    ]);
    for (scenario, series) in scenarios {
        let lease = find(series, Kind::Lease).and_then(|s| s.samples.p99());
        for s in series {
            let (p99, bound) = effective_p99(s, timeout);
            let p99_text = if bound {
                format!("> {}", ms(p99))
            } else {
                ms(p99)
            };
            let versus = quotient(p99, lease).map_or("–".to_string(), |q| {
                format!("{}{q:.1}", if bound { "> " } else { "" })
            });
            let label = match scenario.as_str() {
                "healthy" => "healthy".to_string(),
                "slow" => format!("+{} ms", SLOW_DELAY.as_millis()),
                _ => "hung (SIGSTOP)".to_string(),
            };
            table.row(vec![
                label,
                s.kind.name().to_string(),
                s.samples.len().to_string(),
                ms(s.samples.p50()),
                p99_text,
                ratio(
                    s.samples.p99(),
                    find(healthy, s.kind).and_then(|h| h.samples.p99()),
                ),
                versus,
                notes(s),
            ]);
        }
    }
    format!(
        "\n## 2. One slow node: node 5 of 5 behind a proxy adding {} ms, or hung by SIGSTOP\n\n\
         Cycles as in item 1; a contender stops at its first call that does not return within {} s, or when \
         it has spent its time budget.\n\n{}",
        SLOW_DELAY.as_millis(),
        timeout.as_secs_f64(),
        table.render()
    )
}

pub fn lease_verdicts(scenarios: &[(String, Vec<Series>)], timeout: Duration) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    let Some((_, healthy)) = scenarios.first() else {
        return verdicts;
    };
    let p50 = |kind| find(healthy, kind).and_then(|s| s.samples.p50());
    let floor = p50(Kind::Floor);
    let fan_out = p50(Kind::FanOut);
    for (kind, limit) in [(Kind::Lease, 1.3), (Kind::Claim, 2.5)] {
        let q = quotient(p50(kind), floor);
        verdicts.push(Verdict::new(
            format!("{} p50 ≤ {limit}× floor", kind.name()),
            q.map_or("–".to_string(), |q| format!("{q:.2}×")),
            q.map(|q| q <= limit),
        ));
        let q = quotient(p50(kind), fan_out);
        verdicts.push(Verdict::new(
            format!(
                "(same, against the 5-node fan-out) {} p50 ≤ {limit}× fan-out",
                kind.name()
            ),
            q.map_or("–".to_string(), |q| format!("{q:.2}×")),
            q.map(|q| q <= limit),
        ));
        for peer in [Kind::Rslock, Kind::Redlock] {
            let q = quotient(p50(kind), p50(peer));
            verdicts.push(Verdict::new(
                format!("{} p50 ≤ {} p50", kind.name(), peer.name()),
                q.map_or("–".to_string(), |q| format!("{q:.2}×")),
                q.map(|q| q <= 1.0),
            ));
        }
    }
    for (scenario, series) in &scenarios[1..] {
        for kind in [Kind::Lease, Kind::Claim] {
            let ours = find(series, kind).and_then(|s| s.samples.p99());
            let before = find(healthy, kind).and_then(|s| s.samples.p99());
            let q = quotient(ours, before);
            // The floor's own change says how much of it is the machine (noise, the proxy's work).
            let floor_change = quotient(
                find(series, Kind::Floor).and_then(|s| s.samples.p99()),
                find(healthy, Kind::Floor).and_then(|s| s.samples.p99()),
            );
            verdicts.push(Verdict::new(
                format!(
                    "{scenario} node: {} p99 within 1.5× of healthy",
                    kind.name()
                ),
                q.map_or("–".to_string(), |q| {
                    let floor = floor_change.map_or("–".to_string(), |f| format!("{f:.2}×"));
                    format!("{q:.2}× ({} ms; the floor's p99 moved {floor})", ms(ours))
                }),
                q.map(|q| q <= 1.5),
            ));
            for peer in [Kind::Rslock, Kind::Redlock] {
                let Some(theirs) = find(series, peer) else {
                    continue;
                };
                let (p99, bound) = effective_p99(theirs, timeout);
                let q = quotient(p99, ours);
                verdicts.push(Verdict::new(
                    format!(
                        "{scenario} node: {} p99 ≥ 10× better than {}",
                        kind.name(),
                        peer.name()
                    ),
                    q.map_or("–".to_string(), |q| {
                        format!("{}{q:.1}×", if bound { "> " } else { "" })
                    }),
                    q.map(|q| q >= 10.0),
                ));
            }
        }
    }
    verdicts
}
