//! A job's timeline as SVG drawn on the server: one bar per tick, oldest left, its height the run's
//! duration, a mark below the baseline for its start delay, coloured by outcome and titled with the tick's
//! story line.
//!
//! The page's Content-Security-Policy allows no inline style, so colours are classes (`t-ran`, …) that the
//! style sheet fills; geometry is presentation attributes. Every text is escaped here, since the caller
//! embeds the SVG as is. Durations use a square-root scale so that a 50 ms run and a 10 min run both show.

use std::fmt::Write as _;

use super::view::{Cell, Outcome};

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 220.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 10.0;
const TOP: f64 = 14.0;
/// The baseline: bars grow up from it, start-delay marks hang below it.
const BASE: f64 = 170.0;
/// The deepest a start-delay mark hangs.
const DELAY_DEPTH: f64 = 22.0;
/// The most bars drawn (the newest).
const MAX_BARS: usize = 500;

/// The SVG of `cells` (any order; the newest [`MAX_BARS`] are drawn).
pub(crate) fn timeline(cells: &[Cell]) -> String {
    let mut cells: Vec<&Cell> = cells.iter().collect();
    cells.sort_by_key(|c| c.tick_ms);
    let cells = &cells[cells.len().saturating_sub(MAX_BARS)..];
    let mut svg = String::with_capacity(256 + cells.len() * 200);
    let _ = write!(
        svg,
        "<svg id=\"timeline\" class=\"timeline\" role=\"img\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" \
         xmlns=\"http://www.w3.org/2000/svg\" aria-labelledby=\"timeline-title timeline-desc\">\
         <title id=\"timeline-title\">Timeline of the last {} ticks</title>",
        cells.len()
    );
    let _ = write!(
        svg,
        "<desc id=\"timeline-desc\">{}</desc>",
        escape(&summary(cells))
    );
    if cells.is_empty() {
        let _ = write!(
            svg,
            "<text x=\"{}\" y=\"{}\">no ticks yet</text></svg>",
            WIDTH / 2.0 - 40.0,
            HEIGHT / 2.0
        );
        return svg;
    }
    let longest = cells
        .iter()
        .filter_map(|c| c.duration_ms)
        .max()
        .unwrap_or(0)
        .max(1);
    let latest_delay = cells
        .iter()
        .filter_map(|c| c.start_delay_ms)
        .max()
        .unwrap_or(0)
        .max(1);
    let slot = (WIDTH - LEFT - RIGHT) / cells.len() as f64;
    let bar = (slot * 0.8).clamp(1.0, 40.0);
    let _ = write!(
        svg,
        "<line class=\"axis\" x1=\"{LEFT}\" y1=\"{BASE}\" x2=\"{}\" y2=\"{BASE}\"/>\
         <text x=\"4\" y=\"{}\">{}</text><text x=\"4\" y=\"{BASE}\">0</text>\
         <text x=\"4\" y=\"{}\">delay</text>",
        WIDTH - RIGHT,
        TOP + 4.0,
        escape(&crate::inspect::time::duration_ms(longest)),
        BASE + DELAY_DEPTH
    );
    for (i, cell) in cells.iter().enumerate() {
        let x = LEFT + i as f64 * slot + (slot - bar) / 2.0;
        // A tick that did not run still shows: a short bar of its colour.
        let height = match (cell.outcome, cell.duration_ms) {
            (Outcome::Missed | Outcome::Skipped, _) => 6.0,
            (_, Some(ms)) => ((ms as f64 / longest as f64).sqrt() * (BASE - TOP)).max(3.0),
            (Outcome::Running, None) => BASE - TOP,
            (_, None) => 3.0,
        };
        let _ = write!(
            svg,
            "<g class=\"tick t-{}\"><title>{}</title><rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{bar:.1}\" height=\"{height:.1}\"/>",
            cell.outcome.name(),
            escape(&cell.title),
            BASE - height,
        );
        if let Some(delay) = cell.start_delay_ms {
            let depth = ((delay as f64 / latest_delay as f64).sqrt() * DELAY_DEPTH).max(1.0);
            let _ = write!(
                svg,
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{bar:.1}\" height=\"{depth:.1}\" opacity=\"0.45\"/>",
                BASE + 1.0
            );
        }
        svg.push_str("</g>");
    }
    let first = crate::inspect::time::instant_ms(cells[0].tick_ms);
    let last = crate::inspect::time::instant_ms(cells[cells.len() - 1].tick_ms);
    let _ = write!(
        svg,
        "<text x=\"{LEFT}\" y=\"{}\">{}</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text></svg>",
        HEIGHT - 4.0,
        escape(&first),
        WIDTH - RIGHT,
        HEIGHT - 4.0,
        escape(&last)
    );
    svg
}

/// `N ticks: 18 ran, 2 failed`.
fn summary(cells: &[&Cell]) -> String {
    let outcomes = [
        Outcome::Ran,
        Outcome::Failed,
        Outcome::TimedOut,
        Outcome::Missed,
        Outcome::Skipped,
        Outcome::Running,
    ];
    let counts: Vec<String> = outcomes
        .iter()
        .map(|o| (o, cells.iter().filter(|c| c.outcome == *o).count()))
        .filter(|(_, n)| *n > 0)
        .map(|(o, n)| format!("{n} {}", o.label()))
        .collect();
    format!("{} ticks: {}", cells.len(), counts.join(", "))
}

/// `text` escaped for XML text and attribute values.
fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(tick_ms: i64, outcome: Outcome, duration_ms: Option<u64>, title: &str) -> Cell {
        Cell {
            tick_ms,
            outcome,
            title: title.to_string(),
            brief: title.to_string(),
            start_delay_ms: Some(40),
            duration_ms,
        }
    }

    #[test]
    fn each_tick_is_a_bar_of_its_outcome_with_its_title() {
        let cells = vec![
            cell(2_000, Outcome::Failed, Some(50), "second"),
            cell(1_000, Outcome::Ran, Some(600_000), "first"),
            cell(3_000, Outcome::Missed, None, "third"),
        ];
        let svg = timeline(&cells);
        assert!(svg.starts_with("<svg id=\"timeline\""), "{svg}");
        assert!(svg.ends_with("</svg>"));
        let first = svg.find("<title>first</title>").expect("first");
        let second = svg.find("<title>second</title>").expect("second");
        assert!(first < second, "oldest left");
        assert!(svg.contains("<g class=\"tick t-failed\">"));
        assert!(svg.contains("3 ticks: 1 ran, 1 failed, 1 missed"));
        assert!(
            !svg.contains("style"),
            "no inline style: the CSP forbids it"
        );
    }

    #[test]
    fn hostile_text_is_escaped_and_output_bounded() {
        let hostile = cell(
            1,
            Outcome::Ran,
            Some(1),
            "<script>alert('x')</script> & \"q\"",
        );
        let svg = timeline(&[hostile]);
        assert!(!svg.contains("<script>"));
        assert!(svg.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"));
        let many: Vec<Cell> = (0..5_000)
            .map(|i| cell(i, Outcome::Ran, Some(10), "t"))
            .collect();
        let svg = timeline(&many);
        assert_eq!(svg.matches("<g class=").count(), MAX_BARS);
        assert!(svg.contains("Timeline of the last 500 ticks"));
    }

    #[test]
    fn no_ticks_says_so() {
        let svg = timeline(&[]);
        assert!(svg.contains("no ticks yet"), "{svg}");
    }
}
