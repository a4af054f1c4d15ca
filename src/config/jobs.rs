//! Stage two for `jobs:`: each job's name, schedule, time zone, command and limits.
//!
//! Split from [`super::validate`], which holds the settings shared by all jobs. A job with a problem is
//! reported and left out; the other jobs are still checked, so one run shows every problem.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use super::raw::{OneOrList, RawAlerts, RawJob, Spanned};
use super::validate::{duration, positive_duration, stop_grace, whole_number, TOP};
use super::yaml::{is_variable_name, Mark};
use super::{Alerts, Command, InheritEnv, JobConfig, Report};
use crate::lock::{LockSettings, Overlap};
use crate::schedule::Schedule;

/// What every job is checked against: the lease's settings and the store's variables.
struct Shared<'a> {
    lock: &'a LockSettings,
    /// The `alerts:` defaults.
    alerts: &'a Alerts,
    secret_env_vars: &'a BTreeSet<String>,
    /// The longest job name the store takes (a SQL store keeps names in indexed key columns).
    max_name: Option<usize>,
    now: DateTime<Utc>,
    /// The text as written of a scalar in which a `${VAR}` was replaced.
    written: &'a dyn Fn(Mark) -> Option<String>,
}

/// The longest job name a SQL store takes: a job's keys are indexed columns of bounded width
/// (`src/store/sql/schema.rs`), and no one reads a longer name in a table anyway.
pub(crate) const MAX_SQL_JOB_NAME: usize = 200;

#[allow(clippy::too_many_arguments)] // each is one of the config's sections, or the clock
pub(super) fn jobs(
    raw: Option<Spanned<Vec<RawJob>>>,
    lock: &LockSettings,
    alerts: &Alerts,
    secret_env_vars: &BTreeSet<String>,
    store: &super::StoreConfig,
    report: &mut Report,
    now: DateTime<Utc>,
    written: &dyn Fn(Mark) -> Option<String>,
) -> Vec<JobConfig> {
    let max_name = matches!(store, super::StoreConfig::Sql(_)).then_some(MAX_SQL_JOB_NAME);
    let shared = Shared {
        lock,
        alerts,
        secret_env_vars,
        max_name,
        now,
        written,
    };
    let Some(list) = raw else {
        report.warn(
            TOP,
            "jobs",
            "no `jobs:` list: the worker will run but never do anything",
        );
        return Vec::new();
    };
    if list.value.is_empty() {
        report.warn(
            list.mark,
            "jobs",
            "no jobs: the worker will run but never do anything",
        );
    }
    let mut names: HashMap<String, (usize, Mark)> = HashMap::new();
    let mut jobs = Vec::new();
    for (i, raw) in list.value.iter().enumerate() {
        let path = format!("jobs[{i}]");
        if let Some(name) = &raw.name {
            match names.get(&name.value) {
                Some((first, mark)) => {
                    let why = format!("duplicate job name {:?}: jobs[{first}] (line {}) has it too; names must be unique", name.value, mark.line);
                    report.error(name.mark, &format!("{path}.name"), why);
                }
                None => {
                    names.insert(name.value.clone(), (i, name.mark));
                }
            }
        }
        jobs.extend(job(raw, &path, report, &shared));
    }
    jobs
}

/// `jobs[i].name`: letters, digits and `_ . -`, within what the store can key (a SQL store's columns);
/// `None` after reporting what is wrong.
fn job_name(raw: &RawJob, path: &str, report: &mut Report, shared: &Shared<'_>) -> Option<String> {
    let field = format!("{path}.name");
    let name = required(&raw.name, &field, raw.mark, report)?;
    let valid = !name.value.is_empty()
        && name
            .value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if !valid {
        report.error(
            name.mark,
            &field,
            format!(
                "invalid job name {:?}: use letters, digits and `_ . -`",
                name.value
            ),
        );
    }
    let too_long = shared.max_name.filter(|most| name.value.len() > *most);
    if let Some(most) = too_long {
        let why = format!(
            "a job name of {} characters: a SQL store takes at most {most} (its keys are indexed columns)",
            name.value.len()
        );
        report.error(name.mark, &field, why);
    }
    (valid && too_long.is_none()).then(|| name.value.clone())
}

/// `jobs[i].schedule` in the job's zone (UTC while the zone is invalid), which must fire after `now`;
/// a burst the expression asks for is a warning.
fn schedule(
    raw: &RawJob,
    timezone: Option<Tz>,
    path: &str,
    report: &mut Report,
    now: DateTime<Utc>,
) -> Option<Schedule> {
    let field = format!("{path}.schedule");
    let expr = required(&raw.schedule, &field, raw.mark, report)?;
    match Schedule::parse(&expr.value, timezone.unwrap_or(Tz::UTC)) {
        Err(e) => report.error(expr.mark, &field, e.to_string()),
        Ok(schedule) if schedule.next_after(now).is_none() => {
            report.error(
                expr.mark,
                &field,
                format!("cron expression {:?} never fires", expr.value),
            );
        }
        Ok(schedule) => {
            if let Some(why) = schedule.burst_warning() {
                report.warn(expr.mark, &field, why);
            }
            return Some(schedule);
        }
    }
    None
}

/// `jobs[i].env`: names non-empty without `=`, and no NUL in names or values.
fn env(raw: &RawJob, path: &str, report: &mut Report) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for (key, value) in &raw.env {
        if key.value.is_empty() || key.value.contains(['=', '\0']) || value.value.contains('\0') {
            report.error(key.mark, &format!("{path}.env.{}", key.value), "invalid environment variable: the name must be non-empty without `=`, and neither may contain NUL");
        }
        env.insert(key.value.clone(), value.value.clone());
    }
    env
}

/// `jobs[i].overlap`: `skip` (the default) or `allow`.
fn overlap(raw: &RawJob, path: &str, report: &mut Report) -> Overlap {
    match raw.overlap.as_ref().map(|o| (o.value.trim(), o.mark)) {
        None | Some(("skip", _)) => Overlap::Skip,
        Some(("allow", _)) => Overlap::Allow,
        Some((other, mark)) => {
            report.error(
                mark,
                &format!("{path}.overlap"),
                format!("invalid overlap {other:?}: expected `skip` (the default) or `allow`"),
            );
            Overlap::Skip
        }
    }
}

fn job(raw: &RawJob, path: &str, report: &mut Report, shared: &Shared<'_>) -> Option<JobConfig> {
    let now = shared.now;
    let field = |name: &str| format!("{path}.{name}");
    let name = job_name(raw, path, report, shared);
    let timezone = match &raw.timezone {
        None => Some(Tz::UTC),
        Some(tz) => tz.value.trim().parse::<Tz>().map_err(|_| {
            let why = format!("unknown time zone {:?}: expected an IANA name such as Europe/Berlin, America/New_York or UTC", tz.value);
            report.error(tz.mark, &field("timezone"), why);
        }).ok(),
    };
    let schedule = schedule(raw, timezone, path, report, now);
    let command = required(&raw.command, &field("command"), raw.mark, report)
        .and_then(|command| self::command(command, &field("command"), report));
    let command_as_written = raw
        .command
        .as_ref()
        .and_then(|command| as_written(command, shared.written));
    let env = env(raw, path, report);
    let inherit_env = raw.inherit_env.as_ref().map_or(InheritEnv::All, |inherit| {
        inherit_env(
            inherit,
            &field("inherit_env"),
            shared.secret_env_vars,
            report,
        )
    });
    let workdir = raw.workdir.as_ref().map(|dir| PathBuf::from(&dir.value));
    let timeout = positive_duration(raw.timeout.as_ref(), &field("timeout"), report);
    let stop_grace = stop_grace(
        raw.stop_grace.as_ref(),
        &field("stop_grace"),
        shared.lock,
        report,
    );
    let overlap = overlap(raw, path, report);
    let misfire_grace = duration(raw.misfire_grace.as_ref(), &field("misfire_grace"), report)
        .unwrap_or(Duration::from_secs(30));
    let jitter = duration(raw.jitter.as_ref(), &field("jitter"), report).unwrap_or_default();
    if let Some(value) = raw
        .jitter
        .as_ref()
        .filter(|_| jitter >= misfire_grace && !jitter.is_zero())
    {
        let why = format!(
            "jitter ({}) must be below misfire_grace ({}): a tick is raced from tick + jitter until the grace ends",
            super::show_duration(jitter),
            super::show_duration(misfire_grace)
        );
        report.error(value.mark, &field("jitter"), why);
    }
    let enabled = match raw.enabled.as_ref().map(|e| (e.value.trim(), e.mark)) {
        None => true,
        Some(("true" | "True" | "TRUE", _)) => true,
        Some(("false" | "False" | "FALSE", _)) => false,
        Some((other, mark)) => {
            report.error(
                mark,
                &field("enabled"),
                format!("invalid enabled {other:?}: expected true or false"),
            );
            true
        }
    };
    let own = self::alerts(&raw.alerts, path, report);
    let alerts = Alerts {
        on_failure: own.on_failure.or_else(|| shared.alerts.on_failure.clone()),
        on_recovery: own
            .on_recovery
            .or_else(|| shared.alerts.on_recovery.clone()),
    };
    let retry = super::retry::policy(raw, path, report);
    let output_tail = output_tail(raw.output_tail.as_ref(), &field("output_tail"), report);
    Some(JobConfig {
        alerts,
        retry,
        name: name?,
        schedule: schedule?,
        command: command?,
        command_as_written,
        env,
        inherit_env,
        workdir,
        timeout,
        stop_grace,
        overlap,
        misfire_grace,
        jitter,
        enabled,
        output_tail,
    })
}

/// `output_tail` when not given: enough for the last lines of an error message.
pub(crate) const DEFAULT_OUTPUT_TAIL: usize = 2048;

/// The largest `output_tail`: the tail lives in every failed run's history entry, on every node.
pub(crate) const MAX_OUTPUT_TAIL: usize = 64 * 1024;

/// `output_tail`: a whole number of bytes from 0 (off) to [`MAX_OUTPUT_TAIL`]; the default when absent
/// or invalid (reported).
fn output_tail(value: Option<&Spanned<String>>, field: &str, report: &mut Report) -> usize {
    let expected = format!("a whole number of bytes from 0 (keep none) to {MAX_OUTPUT_TAIL}");
    whole_number(value, field, MAX_OUTPUT_TAIL, &expected, report).unwrap_or(DEFAULT_OUTPUT_TAIL)
}

/// `all`, `none`, or a list of variable names; a listed store variable is warned about, since it is
/// never inherited (only the job's `env` can pass it).
fn inherit_env(
    raw: &Spanned<OneOrList>,
    field: &str,
    secret_env_vars: &BTreeSet<String>,
    report: &mut Report,
) -> InheritEnv {
    match &raw.value {
        OneOrList::One(word) => match word.trim() {
            "all" => InheritEnv::All,
            "none" => InheritEnv::Nothing,
            other => {
                let why = format!("invalid inherit_env {other:?}: expected `all` (the default), `none`, or a list of variable names such as [PATH, HOME]");
                report.error(raw.mark, field, why);
                InheritEnv::All
            }
        },
        OneOrList::List(names) => {
            let mut only = BTreeSet::new();
            for (i, name) in names.iter().enumerate() {
                let item = format!("{field}[{i}]");
                if !is_variable_name(&name.value) {
                    let why = format!("invalid variable name {:?}: use letters, digits and `_`, not starting with a digit", name.value);
                    report.error(name.mark, &item, why);
                } else if secret_env_vars.contains(&name.value) {
                    let why = format!("{} is used by the store's settings and is never inherited; name it in the job's `env` to pass it", name.value);
                    report.warn(name.mark, &item, why);
                }
                only.insert(name.value.clone());
            }
            InheritEnv::Only(only)
        }
        OneOrList::Invalid => InheritEnv::All,
    }
}

/// The hooks of `raw`, a section at `path` (`alerts` or `jobs[i]`).
pub(super) fn alerts(raw: &RawAlerts, path: &str, report: &mut Report) -> Alerts {
    let hook = |value: &Option<Spanned<OneOrList>>, name: &str, report: &mut Report| {
        let field = format!("{path}.{name}");
        value
            .as_ref()
            .and_then(|value| command(value, &field, report))
    };
    Alerts {
        on_failure: hook(&raw.on_failure, "on_failure", report),
        on_recovery: hook(&raw.on_recovery, "on_recovery", report),
    }
}

fn command(raw: &Spanned<OneOrList>, field: &str, report: &mut Report) -> Option<Command> {
    match &raw.value {
        OneOrList::One(line) if line.trim().is_empty() => {
            report.error(raw.mark, field, "empty command")
        }
        OneOrList::One(line) => return Some(Command::Shell(line.clone())),
        OneOrList::List(argv) => match argv.first() {
            None => report.error(
                raw.mark,
                field,
                "empty command: give at least the program, e.g. [\"echo\", \"hello\"]",
            ),
            Some(program) if program.value.is_empty() => {
                report.error(program.mark, field, "empty program name")
            }
            Some(_) => {
                return Some(Command::Argv(
                    argv.iter().map(|arg| arg.value.clone()).collect(),
                ))
            }
        },
        OneOrList::Invalid => {}
    }
    None
}

/// `raw` as the file writes it, if a `${VAR}` was replaced in it (a list's arguments joined by spaces).
fn as_written(
    raw: &Spanned<OneOrList>,
    written: &dyn Fn(Mark) -> Option<String>,
) -> Option<String> {
    match &raw.value {
        OneOrList::One(_) => written(raw.mark),
        OneOrList::List(argv) => {
            let args: Vec<(Option<String>, &str)> = argv
                .iter()
                .map(|arg| (written(arg.mark), arg.value.as_str()))
                .collect();
            args.iter()
                .any(|(as_written, _)| as_written.is_some())
                .then(|| {
                    let args: Vec<&str> = args
                        .iter()
                        .map(|(as_written, value)| as_written.as_deref().unwrap_or(value))
                        .collect();
                    args.join(" ")
                })
        }
        OneOrList::Invalid => None,
    }
}

fn required<'a, T>(
    value: &'a Option<Spanned<T>>,
    field: &str,
    mark: Mark,
    report: &mut Report,
) -> Option<&'a Spanned<T>> {
    if value.is_none() {
        let name = field.rsplit('.').next().unwrap_or(field);
        report.error(mark, field, format!("missing field `{name}`"));
    }
    value.as_ref()
}

#[cfg(test)]
mod tests {
    use super::super::retry::tests::parse;
    use super::{DEFAULT_OUTPUT_TAIL, MAX_OUTPUT_TAIL};

    /// `output_tail`: 2048 by default, 0 turns it off, up to 64 KiB; a number too big or of the wrong
    /// type is an error naming the file, the line and the field.
    #[test]
    fn output_tail_is_read_and_checked_with_its_place() {
        assert_eq!(
            parse("").expect("valid").jobs[0].output_tail,
            DEFAULT_OUTPUT_TAIL
        );
        assert_eq!(DEFAULT_OUTPUT_TAIL, 2048);
        assert_eq!(
            parse("    output_tail: 0\n").expect("valid").jobs[0].output_tail,
            0
        );
        let max = format!("    output_tail: {MAX_OUTPUT_TAIL}\n");
        assert_eq!(parse(&max).expect("valid").jobs[0].output_tail, 65_536);
        let big = parse("    output_tail: 65537\n").expect_err("too big");
        assert_eq!(big.len(), 1, "{big:?}");
        assert!(
            big[0].starts_with("jobs.yaml:5:18: jobs[0].output_tail: invalid output_tail \"65537\": expected a whole number of bytes from 0 (keep none) to 65536"),
            "{big:?}"
        );
        for wrong in ["-1", "2k", "lots"] {
            let problems = parse(&format!("    output_tail: {wrong}\n")).expect_err("not a number");
            assert!(
                problems[0].starts_with("jobs.yaml:5:18: jobs[0].output_tail: invalid output_tail"),
                "{problems:?}"
            );
        }
        let list = parse("    output_tail: [1, 2]\n").expect_err("a list");
        assert!(
            list[0].starts_with("jobs.yaml:5:18: jobs[0].output_tail: "),
            "{list:?}"
        );
    }
}
