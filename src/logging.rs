//! Log events as one JSON object per line (or one human-readable line), with every field at the top level.
//!
//! Operators and the integration tests read a worker's stdout line by line and look events up by their
//! stable `event` name, so each line is a flat object: `timestamp`, `level`, `worker`, `event`,
//! `message`, then the fields of every enclosing span (outermost first), then the event's own fields. A
//! run's events therefore carry `job`, `tick`, `run_id` and `token` from the `run` span without
//! repeating them at each call site. tracing-subscriber's own JSON format nests span fields, so this
//! module has a small [`FormatEvent`] of its own; the text format renders the same flat fields.

pub(crate) mod events;
mod sink;

pub use sink::{dropped_lines, Flush};

use std::fmt::Write as _;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line, all fields at the top level: for machines and the tests.
    Json,
    /// One human-readable line per event, the same fields as `key=value`.
    Text,
}

/// What [`init`] installs.
#[derive(Debug, Clone)]
pub struct LogOptions {
    pub format: LogFormat,
    /// An `EnvFilter` directive string such as `info` or `info,redcron::lock=debug`.
    pub filter: String,
    /// Written as `worker` on every line, so the lines of many workers can be merged and told apart.
    pub worker_id: String,
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("invalid log filter {filter:?}: {source} (expected e.g. \"info\" or \"info,redcron=debug\")")]
    Filter {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("a global logger is already installed: {0}")]
    AlreadyInstalled(#[from] tracing_subscriber::util::TryInitError),
}

/// Installs the global subscriber writing to stdout, through a bounded queue that never waits
/// ([`sink`]); the returned [`Flush`] writes out what is queued when dropped (at exit).
///
/// Fails, without installing anything, if the filter does not parse or a subscriber is already set.
pub fn init(options: &LogOptions) -> Result<Flush, LoggingError> {
    let filter = EnvFilter::try_new(&options.filter).map_err(|source| LoggingError::Filter {
        filter: options.filter.clone(),
        source,
    })?;
    let format = FlatFormat {
        format: options.format,
        worker: options.worker_id.clone(),
    };
    let sink = sink::Sink::stdout(Box::new(move |lines| format.dropped(lines)));
    tracing_subscriber::registry()
        .with(layer(options.format, &options.worker_id, sink).with_filter(filter))
        .try_init()?;
    Ok(sink::Flush::new())
}

/// A layer writing events in `format` to `writer`, one line per event and one `write` per line.
///
/// Separate from [`init`] so tests (and embedders) can capture lines in a buffer.
pub fn layer<S, W>(format: LogFormat, worker_id: &str, writer: W) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer()
        .fmt_fields(JsonFields::new())
        .event_format(FlatFormat {
            format,
            worker: worker_id.to_owned(),
        })
        .with_writer(writer)
}

/// Names the formatter writes itself; a span or event field with one of them is written as `field.<name>`.
const RESERVED: [&str; 3] = ["timestamp", "level", "worker"];

/// The event formatter of both formats. Span fields are stored by [`JsonFields`] as JSON objects.
struct FlatFormat {
    format: LogFormat,
    worker: String,
}

impl<S> FormatEvent<S, JsonFields> for FlatFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut fields = Fields::default();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                let Some(stored) = extensions.get::<FormattedFields<JsonFields>>() else {
                    continue;
                };
                // An empty string means the span has no fields yet.
                if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&stored.fields) {
                    map.into_iter()
                        .for_each(|(name, value)| fields.set(name, value));
                }
            }
        }
        event.record(&mut FieldVisitor(&mut fields));

        let metadata = event.metadata();
        let name = match fields.take("event") {
            Some(Value::String(name)) => name,
            Some(other) => other.to_string(),
            None => metadata.target().to_owned(),
        };
        let message = match fields.take("message") {
            Some(Value::String(message)) => message,
            Some(other) => other.to_string(),
            None => name.clone(),
        };
        let level = metadata.level().as_str();
        let rest = fields.0.into_iter().map(|(name, value)| {
            if RESERVED.contains(&name.as_str()) {
                (format!("field.{name}"), value)
            } else {
                (name, value)
            }
        });
        writer.write_str(&self.line(level, &name, &message, rest))
    }
}

impl FlatFormat {
    /// One line of the log, stamped now: `event` at `level`, its `message`, then the other fields.
    fn line(
        &self,
        level: &str,
        name: &str,
        message: &str,
        rest: impl IntoIterator<Item = (String, Value)>,
    ) -> String {
        let timestamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let mut line = String::new();
        match self.format {
            LogFormat::Json => {
                let head = [
                    ("timestamp", timestamp.as_str()),
                    ("level", level),
                    ("worker", self.worker.as_str()),
                    ("event", name),
                    ("message", message),
                ];
                let mut separator = '{';
                for (key, value) in head {
                    let _ = write!(line, "{separator}{}:{}", json(key), json(value));
                    separator = ',';
                }
                for (key, value) in rest {
                    let _ = write!(line, ",{}:{}", json(&key), json(&value));
                }
                line.push_str("}\n");
            }
            LogFormat::Text => {
                let _ = write!(
                    line,
                    "{timestamp} {level:>5} {} {name}: {}",
                    visible(&self.worker),
                    visible(message)
                );
                for (key, value) in rest {
                    let _ = write!(line, " {key}={}", text(&value));
                }
                line.push('\n');
            }
        }
        line
    }

    /// The line that says `lines` log lines were dropped (`log.dropped`), written by the sink itself.
    fn dropped(&self, lines: u64) -> Vec<u8> {
        let fields = [("lines".to_string(), Value::from(lines))];
        self.line(
            "WARN",
            events::log::DROPPED,
            "Log lines dropped: stdout did not take them in time (a stalled reader of the worker's output); the tick loop did not wait",
            fields,
        )
        .into_bytes()
    }
}

/// `text` cut to at most `max` bytes (at a character boundary), with `…` where it was cut: for text from
/// outside (the store, the network) quoted in a log line or a report, which a planted megabyte must not
/// fill.
pub(crate) fn shorten(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `text` with every control character — C0, DEL and C1, newlines and tabs too — shown as a visible
/// escape (`\n`, `\t`, `\r`, `\x1b`, `\u{9b}`): for text from a job or a client (output, reasons,
/// names) on its way to a terminal, where `ESC ]0;…BEL` would retitle it, `ESC [2J` clear it, and a
/// newline or carriage return forge a line. Borrowed when there is nothing to escape. Backslashes are left
/// as they are: the result is for reading, not for parsing back (the JSON forms are for that).
pub(crate) fn visible(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        push_visible(&mut out, c);
    }
    std::borrow::Cow::Owned(out)
}

/// [`visible`] line by line: the newlines stay (a layout's own), every other control is escaped.
pub(crate) fn visible_lines(text: &str) -> String {
    let lines: Vec<std::borrow::Cow<'_, str>> = text.split('\n').map(visible).collect();
    lines.join("\n")
}

/// Pushes `c`, or its visible escape when it is a control character (see [`visible`]).
fn push_visible(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        c if c.is_control() && (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
        c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        c => out.push(c),
    }
}

/// Serializes a string or JSON value; neither can fail (string keys, no non-string map keys).
fn json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

/// A value for `key=value`: bare when unambiguous; quoted when it is empty or holds a space, `=`, a
/// quote, a backslash or a control character, with `"` and `\` escaped and controls shown as
/// [`visible`] does — so a value (a job's output line) can neither end its field early and forge
/// another nor reach the terminal raw.
fn text(value: &Value) -> String {
    let needs_quotes =
        |c: char| c.is_whitespace() || c.is_control() || matches!(c, '"' | '=' | '\\');
    match value {
        Value::String(s) if s.is_empty() || s.contains(needs_quotes) => {
            let mut out = String::with_capacity(s.len() + 2);
            out.push('"');
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    c => push_visible(&mut out, c),
                }
            }
            out.push('"');
            out
        }
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Fields in first-seen order; a later value of the same name (inner span, then event) replaces it.
#[derive(Default)]
struct Fields(Vec<(String, Value)>);

impl Fields {
    fn set(&mut self, name: String, value: Value) {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.0.push((name, value)),
        }
    }

    fn take(&mut self, name: &str) -> Option<Value> {
        let index = self.0.iter().position(|(n, _)| n == name)?;
        Some(self.0.remove(index).1)
    }
}

/// Records an event's fields as JSON values: integers stay numbers, `%`/`?` values become strings.
struct FieldVisitor<'a>(&'a mut Fields);

impl FieldVisitor<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        self.0.set(field.name().to_owned(), value);
    }
}

impl Visit for FieldVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        let value =
            i64::try_from(value).map_or_else(|_| Value::from(value.to_string()), Value::from);
        self.put(field, value);
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        let value =
            u64::try_from(value).map_or_else(|_| Value::from(value.to_string()), Value::from);
        self.put(field, value);
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        // The whole chain, as anyhow's `{:#}` prints it: "outer: cause: root".
        let mut text = value.to_string();
        let mut source = value.source();
        while let Some(cause) = source {
            let _ = write!(text, ": {cause}");
            source = cause.source();
        }
        self.put(field, Value::from(text));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::from(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::{Arc, Mutex};
    use tracing::{info, info_span, warn};

    /// A `MakeWriter` collecting everything written into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .expect("no test thread panics holding it")
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'w self) -> Buffer {
            self.clone()
        }
    }

    #[test]
    fn long_text_is_shortened_at_a_character_boundary() {
        assert_eq!(shorten("short", 10), "short");
        assert_eq!(shorten("abcdef", 3), "abc…");
        assert_eq!(shorten("aé", 2), "a…");
    }

    fn capture(format: LogFormat, body: impl FnOnce()) -> String {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::registry().with(layer(format, "w-1", buffer.clone()));
        tracing::subscriber::with_default(subscriber, body);
        let bytes = buffer
            .0
            .lock()
            .expect("no test thread panics holding it")
            .clone();
        String::from_utf8(bytes).expect("the formatter writes UTF-8")
    }

    fn emit_run_events() {
        let run = info_span!(
            "run",
            job = "backup",
            tick = "2024-05-01T12:00:00Z",
            run_id = "r1",
            token = 42u64
        );
        let _entered = run.enter();
        info!(event = events::run::STARTED, pid = 1234, "Started the job");
        let inner = info_span!("renew", node = 2);
        inner.in_scope(|| {
            warn!(
                event = events::lease::RENEW_FAILED,
                ok = false,
                token = 43u64,
                "Renewal failed"
            )
        });
    }

    /// Span and event fields are top-level keys with their JSON types; the formatter adds its own.
    #[test]
    fn json_lines_are_flat() {
        let out = capture(LogFormat::Json, emit_run_events);
        let lines: Vec<Value> = out
            .lines()
            .map(|line| serde_json::from_str(line).expect("each line is one JSON object"))
            .collect();
        assert_eq!(lines.len(), 2, "{out}");

        let started = &lines[0];
        assert_eq!(started["event"], "run.started");
        assert_eq!(started["message"], "Started the job");
        assert_eq!(started["level"], "INFO");
        assert_eq!(started["worker"], "w-1");
        assert_eq!(started["job"], "backup");
        assert_eq!(started["tick"], "2024-05-01T12:00:00Z");
        assert_eq!(started["run_id"], "r1");
        assert_eq!(started["token"], 42);
        assert_eq!(started["pid"], 1234);
        let timestamp = started["timestamp"]
            .as_str()
            .expect("timestamp is a string");
        assert!(
            chrono::DateTime::parse_from_rfc3339(timestamp).is_ok(),
            "{timestamp}"
        );
        assert!(timestamp.ends_with('Z'), "{timestamp}");
        assert!(started.get("fields").is_none() && started.get("span").is_none());

        let failed = &lines[1];
        assert_eq!(failed["level"], "WARN");
        assert_eq!(failed["node"], 2, "inner span fields are merged too");
        assert_eq!(failed["job"], "backup");
        assert_eq!(failed["ok"], false);
        assert_eq!(
            failed["token"], 43,
            "the event's own field wins over the span's"
        );
    }

    /// An event without `event` is named by its target; one without a message repeats the name;
    /// a field named like a formatter key is kept under `field.<name>`.
    #[test]
    fn json_fills_missing_event_and_message() {
        let out = capture(LogFormat::Json, || {
            info!(job = "a", "No name");
            info!(event = events::tick::WON, worker = "someone-else");
        });
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON"))
            .collect();
        assert_eq!(lines[0]["event"], "redcron::logging::tests");
        assert_eq!(lines[1]["message"], "tick.won");
        assert_eq!(lines[1]["worker"], "w-1");
        assert_eq!(lines[1]["field.worker"], "someone-else");
    }

    /// The text format is one line per event with the worker id, the name and the fields.
    #[test]
    fn text_lines_carry_worker_and_fields() {
        let out = capture(LogFormat::Text, emit_run_events);
        let first = out.lines().next().expect("one line per event");
        assert!(
            first.contains(" INFO w-1 run.started: Started the job"),
            "{first}"
        );
        assert!(
            first.contains(" job=backup")
                && first.contains(" token=42")
                && first.contains(" pid=1234")
        );
        assert_eq!(out.lines().count(), 2);
    }

    /// A job's output line in the text format cannot forge a field nor reach the terminal raw: a value
    /// with spaces, `=`, quotes or controls is one quoted field, its quotes and backslashes escaped and its
    /// controls shown as `\x1b`; the message is escaped too.
    #[test]
    fn text_values_cannot_forge_fields_or_hold_controls() {
        let out = capture(LogFormat::Text, || {
            let line = "ok\" level=ERROR job=other \u{1b}[2J\u{9b}\\ x=1\r";
            tracing::info!(
                event = "run.output",
                stream = "stdout",
                line,
                "Output \u{1b}]0;t\u{7}"
            );
            tracing::info!(
                event = "run.output",
                stream = "stdout",
                line = "a=b",
                "Output"
            );
        });
        assert!(
            !out.contains(|c: char| c.is_control() && c != '\n'),
            "{out:?}"
        );
        let first = out.lines().next().expect("a line");
        assert!(
            first.ends_with(r#" line="ok\" level=ERROR job=other \x1b[2J\u{9b}\\ x=1\r""#),
            "{first}"
        );
        assert!(first.contains(r"Output \x1b]0;t\x07 "), "{first}");
        assert!(
            out.lines()
                .nth(1)
                .is_some_and(|l| l.ends_with(r#" line="a=b""#)),
            "{out}"
        );
        assert_eq!(visible("tab\there"), r"tab\there");
        assert_eq!(visible_lines("a\u{1b}\nb\u{7f}"), "a\\x1b\nb\\x7f");
    }

    /// A filter that does not parse is reported with the filter text.
    #[test]
    fn bad_filter_is_a_clear_error() {
        let options = LogOptions {
            format: LogFormat::Json,
            filter: "info,redcron=loud".to_owned(),
            worker_id: "w".to_owned(),
        };
        let error = init(&options).expect_err("`loud` is not a level");
        assert!(
            error
                .to_string()
                .contains("invalid log filter \"info,redcron=loud\""),
            "{error}"
        );
    }
}
