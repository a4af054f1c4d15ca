//! A cron schedule in words, for people: `every 10 seconds`, `at 02:30 in Europe/Berlin`,
//! `at 09:00 on Monday to Friday`.
//!
//! Only the shapes operators write most are worded; anything else is shown as the expression itself
//! (`cron "…"`), because a schedule worded wrongly is worse than one not worded at all. A step is worded
//! as "every N" only where it divides its field's range evenly (`*/7` minutes fires at :56 and then :00,
//! which is not every 7 minutes). The expression was validated when the config was read; this only reads
//! it, and its output is bounded whatever it is given.

/// The most values of a list worded (`at 09:00 and 17:00`); longer lists fall back to the expression.
const MAX_LIST: usize = 6;

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// `expression` (5 or 6 fields, or a macro) in `timezone`, in words; ` in <zone>` unless UTC.
pub(crate) fn describe(expression: &str, timezone: &str) -> String {
    let zone = match timezone {
        "UTC" | "Etc/UTC" | "" => String::new(),
        zone => format!(" in {zone}"),
    };
    match worded(expression.trim()) {
        Some(words) => format!("{words}{zone}"),
        None => {
            let shown: String = expression.trim().chars().take(120).collect();
            format!("cron \"{shown}\"{zone}")
        }
    }
}

/// The words of `expression`, if it has a shape worded here.
fn worded(expression: &str) -> Option<String> {
    let expanded = match expression.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *".to_string(),
        "@monthly" => "0 0 1 * *".to_string(),
        "@weekly" => "0 0 * * 0".to_string(),
        "@daily" | "@midnight" => "0 0 * * *".to_string(),
        "@hourly" => "0 * * * *".to_string(),
        _ if expression.starts_with('@') => return None,
        _ => expression.to_string(),
    };
    let fields: Vec<&str> = expanded.split_whitespace().collect();
    let (second, rest) = match fields.len() {
        5 => ("0", &fields[..]),
        6 => (fields[0], &fields[1..]),
        _ => return None,
    };
    let [minute, hour, day, month, weekday] = rest else {
        return None;
    };
    let days = days(day, month, weekday)?;
    let time = time_of_day(second, minute, hour)?;
    Some(format!("{time}{days}"))
}

/// The time-of-day part: `every 10 seconds`, `every hour at minute 15`, `at 02:30`, …
fn time_of_day(second: &str, minute: &str, hour: &str) -> Option<String> {
    let second_values = values(second, 0, 59)?;
    let minute_values = values(minute, 0, 59)?;
    let hour_values = values(hour, 0, 23)?;
    match (second_values, minute_values, hour_values) {
        (Field::Any, Field::Any, Field::Any) => Some(every(1, "second")),
        (Field::Every(n), Field::Any, Field::Any) => Some(every(n, "second")),
        (Field::At(s), Field::Any, Field::Any) if s == [0] => Some(every(1, "minute")),
        (Field::At(s), Field::At(m), Field::Any) if s == [0] && m == [0] => Some(every(1, "hour")),
        (Field::At(s), Field::Every(n), Field::Any) if s == [0] => Some(every(n, "minute")),
        (Field::At(s), Field::At(m), Field::Every(n)) if s == [0] && m == [0] => {
            Some(every(n, "hour"))
        }
        (Field::At(s), Field::At(m), Field::Any) if s == [0] && m.len() == 1 => {
            Some(format!("every hour at minute {}", m[0]))
        }
        (Field::At(s), Field::At(m), Field::At(h)) if s == [0] && m.len() * h.len() <= MAX_LIST => {
            let mut times: Vec<String> = Vec::new();
            for hour in &h {
                for minute in &m {
                    times.push(format!("{hour:02}:{minute:02}"));
                }
            }
            Some(format!("at {}", list(&times)))
        }
        (Field::At(s), Field::At(m), Field::At(h))
            if s.len() == 1 && m.len() == 1 && h.len() == 1 =>
        {
            Some(format!("at {:02}:{:02}:{:02}", h[0], m[0], s[0]))
        }
        _ => None,
    }
}

/// The days part: empty for every day, ` on Monday to Friday`, ` on day 1 of the month`, ` on 1 January`.
fn days(day: &str, month: &str, weekday: &str) -> Option<String> {
    let day_values = values(day, 1, 31)?;
    let month_values = values(&names(month, &MONTHS), 1, 12)?;
    let weekday_values = values(&names(weekday, &WEEKDAYS).replace('7', "0"), 0, 6)?;
    match (day_values, month_values, weekday_values) {
        (Field::Any, Field::Any, Field::Any) => Some(String::new()),
        (Field::Any, Field::Any, Field::At(w)) if w.len() <= MAX_LIST => {
            let names: Vec<String> = w
                .iter()
                .map(|d| WEEKDAYS[*d as usize].to_string())
                .collect();
            if is_range(&w) && w.len() > 2 {
                Some(format!(" on {} to {}", names[0], names[names.len() - 1]))
            } else {
                Some(format!(" on {}", list(&names)))
            }
        }
        (Field::At(d), Field::Any, Field::Any) if d.len() <= MAX_LIST => {
            let days: Vec<String> = d.iter().map(u32::to_string).collect();
            let noun = if d.len() == 1 { "day" } else { "days" };
            Some(format!(" on {noun} {} of the month", list(&days)))
        }
        (Field::At(d), Field::At(m), Field::Any) if d.len() == 1 && m.len() == 1 => {
            Some(format!(" on {} {}", d[0], MONTHS[m[0] as usize - 1]))
        }
        _ => None,
    }
}

/// A field's values: any, every N (a step that divides the range evenly, from its start), or a short list.
#[derive(Debug, PartialEq)]
enum Field {
    Any,
    Every(u32),
    At(Vec<u32>),
}

/// The values `field` names in `min..=max`, if it is `*`, `*/N` with N dividing the range, numbers,
/// ranges `a-b` or lists of them (no steps on ranges, no `L`, `W`, `#`, `?`).
fn values(field: &str, min: u32, max: u32) -> Option<Field> {
    if field == "*" || field == "?" {
        return Some(Field::Any);
    }
    if let Some(step) = field.strip_prefix("*/") {
        let step: u32 = step.parse().ok()?;
        let span = max - min + 1;
        return match step {
            0 => None,
            1 => Some(Field::Any),
            n if span.is_multiple_of(n) => Some(Field::Every(n)),
            _ => None,
        };
    }
    let mut found: Vec<u32> = Vec::new();
    for part in field.split(',') {
        let (from, to) = match part.split_once('-') {
            Some((from, to)) => (from.parse().ok()?, to.parse().ok()?),
            None => {
                let value: u32 = part.parse().ok()?;
                (value, value)
            }
        };
        if from < min || to > max || from > to || found.len() + (to - from) as usize > 64 {
            return None;
        }
        found.extend(from..=to);
    }
    found.sort_unstable();
    found.dedup();
    Some(Field::At(found))
}

/// `field` with the names in `names` (three-letter abbreviations, any case) replaced by their numbers:
/// months from 1, weekdays from 0.
fn names(field: &str, names: &[&str]) -> String {
    let base = if names.len() == 12 { 1 } else { 0 };
    let mut text = field.to_ascii_lowercase();
    for (i, name) in names.iter().enumerate() {
        let short = name[..3].to_ascii_lowercase();
        text = text.replace(&short, &(i + base).to_string());
    }
    text
}

fn every(n: u32, unit: &str) -> String {
    match n {
        1 => format!("every {unit}"),
        n => format!("every {n} {unit}s"),
    }
}

fn is_range(values: &[u32]) -> bool {
    values.windows(2).all(|pair| pair[1] == pair[0] + 1)
}

/// `a`, `a and b`, `a, b and c`.
fn list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_common_shapes_read_as_people_say_them() {
        for (expression, zone, words) in [
            ("*/10 * * * * *", "UTC", "every 10 seconds"),
            ("* * * * * *", "UTC", "every second"),
            ("* * * * *", "UTC", "every minute"),
            ("*/5 * * * *", "UTC", "every 5 minutes"),
            ("0 * * * *", "UTC", "every hour"),
            ("@hourly", "UTC", "every hour"),
            ("15 * * * *", "UTC", "every hour at minute 15"),
            ("30 2 * * *", "Europe/Berlin", "at 02:30 in Europe/Berlin"),
            ("0 0 * * *", "UTC", "at 00:00"),
            ("@daily", "UTC", "at 00:00"),
            ("0 9 * * 1-5", "UTC", "at 09:00 on Monday to Friday"),
            ("0 9 * * MON-FRI", "UTC", "at 09:00 on Monday to Friday"),
            ("0 9 * * 1", "UTC", "at 09:00 on Monday"),
            ("0 9 * * 0,6", "UTC", "at 09:00 on Sunday and Saturday"),
            ("0 9 * * 7", "UTC", "at 09:00 on Sunday"),
            ("0 0 1 * *", "UTC", "at 00:00 on day 1 of the month"),
            ("0 0 1 1 *", "UTC", "at 00:00 on 1 January"),
            ("@yearly", "UTC", "at 00:00 on 1 January"),
            ("0 0 1 jan *", "UTC", "at 00:00 on 1 January"),
            ("0 9,17 * * *", "UTC", "at 09:00 and 17:00"),
            ("0 */2 * * *", "UTC", "every 2 hours"),
            ("30 15 10 * * *", "UTC", "at 10:15:30"),
            ("0 */15 * * * *", "UTC", "every 15 minutes"),
        ] {
            assert_eq!(describe(expression, zone), words, "{expression}");
        }
    }

    #[test]
    fn anything_else_is_shown_as_written_never_worded_wrongly() {
        for expression in [
            "*/7 * * * *",
            "0 */5 * * *",
            "0 0 L * *",
            "0 0 * * 5#2",
            "0 0 15W * *",
            "0 0-23/2 * * *",
            "0 0 1,15 * 1",
            "0 1,2,3,4,5,6,7 * * *",
            "@reboot",
            "1 2 3",
        ] {
            let words = describe(expression, "UTC");
            assert_eq!(words, format!("cron \"{expression}\""), "{expression}");
        }
        assert_eq!(
            describe("*/7 * * * *", "Asia/Tokyo"),
            "cron \"*/7 * * * *\" in Asia/Tokyo"
        );
    }

    #[test]
    fn the_words_are_bounded() {
        let long = format!("0 {} * * *", vec!["1"; 5000].join(","));
        assert!(describe(&long, "UTC").len() < 200);
    }
}
