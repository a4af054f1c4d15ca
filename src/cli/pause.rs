//! `redcron pause JOB… [--for DURATION] [--reason TEXT]` and `redcron resume JOB…` (or `--all`): stop and
//! restart jobs' ticks through the lock.
//!
//! `pause` writes the job's pause to every node and succeeds once a majority took it; from then on both
//! rounds of every claim refuse, so no tick of the job is granted anywhere — also on a worker that has not
//! heard of the pause — and the workers record its ticks as skipped (`paused`), never as missed. Runs under
//! way go on. `--for` gives the pause a TTL on each node, so it ends by itself. `resume` deletes it on every
//! node. Both then read the pause back, so the report says on how many nodes it stands.
//!
//! A pause never shortens a pause in force: a shorter `--for` leaves a longer pause (or one without end)
//! as it is, and says so, unless `--replace`; a pause that had ended when it reached the store (`--for
//! 1ms`) is not written, and is an error ([`crate::lock::Pause::decide`], atomic in every store).
//!
//! A pause written and a resume that lifted one are recorded in the job's history as a `control` entry
//! (action, by, reason, until, stamped with cluster time: docs/history.md), so `redcron history` answers
//! who paused or resumed a job and why. A pause kept out by a longer one, or a resume of a job that was
//! not paused, changed nothing and records nothing. A failed history write does not undo the control or
//! change the exit code: the command warns on stderr and the JSON says `recorded_in_history: false`.
//!
//! A worker of an earlier release ignores pauses (its claim scripts never read the key), so `pause` first
//! reads the live workers and refuses, naming them, while one of them does not honour it
//! ([`super::honoured`]); `--even-if-ignored` pauses anyway and the report names them.
//!
//! Several jobs (or `--all`, for a maintenance window) are changed one after the other, each as one job
//! is, with one read of the live workers before the first, one `until` for all, one read-back and one
//! history write after the last. A store failure on the first job is the command's error, as for one
//! job; on a later one it stops there: the jobs changed before it stand, are reported and recorded, the
//! report lists the jobs not changed, and the command exits with the failure's code. There is no
//! transaction across jobs: the store has none across keys on every backend. What the command says, and
//! its exit code, is [`report`]'s.

mod report;

use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};

use self::report::{names_text, report_bulk, report_one};
use super::honoured::{self, Ignoring};
use super::read::{ReadError, Reader};
use super::{find_job, load, operator, render, say, say_error, ConfigArg, Exit};
use crate::config::Config;
use crate::history::{Control, Entry};
use crate::lock::{InForce, Pause, PauseOutcome, PauseRead};
use crate::membership::Capability;

/// The writer (`worker`) of the `control` entries the command line records.
const CONTROL_WRITER: &str = "cli";

/// Arguments of `pause`.
#[derive(Debug, clap::Args)]
pub struct PauseArgs {
    #[command(flatten)]
    pub jobs: JobsArg,
    /// End the pause by itself after this long (90s, 30m, 2h, 1day; at most a year). Default: until
    /// `redcron resume`. A pause in force that lasts longer stays as it is (unless --replace); a pause
    /// that has ended by the time it reaches the store is not written (exit 2).
    #[arg(long = "for", value_name = "DURATION", value_parser = Pause::parse_for)]
    pub duration: Option<Duration>,
    /// Replace a pause in force even if it lasts longer than this one (by default a shorter pause
    /// leaves it as it is, and says so).
    #[arg(long)]
    pub replace: bool,
    /// Why, for `status` and the workers' `tick.skipped` events.
    #[arg(long, value_name = "TEXT", default_value = "")]
    pub reason: String,
    /// Pause even if a live worker ignores pauses (one of an earlier release, which announces no
    /// `honours`): it goes on running the job's ticks. Without it, such a worker makes `pause` refuse
    /// (exit 5), naming it.
    #[arg(long)]
    pub even_if_ignored: bool,
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `resume`.
#[derive(Debug, clap::Args)]
pub struct ResumeArgs {
    #[command(flatten)]
    pub jobs: JobsArg,
    /// Why, for the history's record of the resume.
    #[arg(long, value_name = "TEXT", default_value = "")]
    pub reason: String,
    #[command(flatten)]
    pub config: ConfigArg,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Which jobs `pause` or `resume` changes: those named, or every job of the config file.
#[derive(Debug, clap::Args)]
pub struct JobsArg {
    /// The job's name; several names change each of them, one after the other.
    #[arg(value_name = "JOB", required_unless_present = "all")]
    pub names: Vec<String>,
    /// Every job of the config file, enabled or not (a maintenance window: `pause --all --for 2h`, then
    /// `resume --all`).
    #[arg(long, conflicts_with = "names")]
    pub all: bool,
}

impl JobsArg {
    /// One job named: the report is that job's alone, as before several could be.
    fn one(&self) -> bool {
        !self.all && self.names.len() == 1
    }

    /// How the command line named the jobs, to repeat it in advice.
    fn as_given(&self) -> String {
        match self.all {
            true => "--all".to_string(),
            false => self.names.join(" "),
        }
    }

    /// The jobs' names in the config's order for `--all`, else as given without repeats; or every
    /// unknown name said on stderr and the exit code for it.
    fn resolve(&self, config: &Config) -> Result<Vec<String>, ExitCode> {
        if self.all {
            return Ok(config.jobs.iter().map(|job| job.name.clone()).collect());
        }
        let mut names: Vec<String> = Vec::with_capacity(self.names.len());
        let mut unknown = false;
        for name in &self.names {
            match find_job(config, name) {
                Ok(_) if names.contains(name) => {}
                Ok(_) => names.push(name.clone()),
                Err(_) => unknown = true,
            }
        }
        match unknown {
            true => Err(ExitCode::from(Exit::Usage)),
            false => Ok(names),
        }
    }
}

/// What the change did to one job.
enum Changed {
    /// The pause written, kept out by a longer one, or over.
    Paused(PauseOutcome),
    /// Resumed: whether a node held a pause.
    Resumed { was_paused: bool },
}

/// Whether the command goes on, once the live workers were read: with the workers that will ignore the
/// change (only with `--even-if-ignored`), or refused because of them.
enum Go {
    Ahead(Vec<Ignoring>),
    Refused(Vec<Ignoring>),
}

/// Carries out `pause`.
pub(super) fn pause(args: &PauseArgs) -> anyhow::Result<ExitCode> {
    // One instant for every job: a maintenance window ends at once for all of them.
    let pause = Pause {
        until: args.duration.map(|duration| until(Utc::now(), duration)),
        by: operator(),
        reason: args.reason.clone(),
    };
    let in_force = match args.replace {
        true => InForce::Replace,
        false => InForce::KeepLonger,
    };
    let control = Control::paused(&pause);
    change(
        &args.config,
        &args.jobs,
        args.json,
        control,
        |reader| {
            let ignored_by = honoured::ignoring(reader, Capability::Pause)?;
            Ok(match ignored_by.is_empty() || args.even_if_ignored {
                true => Go::Ahead(ignored_by),
                false => Go::Refused(ignored_by),
            })
        },
        |reader, job| Ok(Changed::Paused(reader.pause(job, &pause, in_force)?)),
    )
}

/// Carries out `resume`.
pub(super) fn resume(args: &ResumeArgs) -> anyhow::Result<ExitCode> {
    // Never refused for a worker that ignores pauses: it ignored the pause too, so it ran the job all
    // along and goes on doing so; the resume lets every other worker run it again, which is all it says.
    let control = Control::resumed(operator(), args.reason.clone());
    change(
        &args.config,
        &args.jobs,
        args.json,
        control,
        |_| Ok(Go::Ahead(Vec::new())),
        |reader, job| {
            let was_paused = reader.resume(job)?;
            Ok(Changed::Resumed { was_paused })
        },
    )
}

/// What [`change`] did, before it is reported.
struct Done {
    /// The jobs changed, in order, with what the change did.
    changed: Vec<(String, Changed)>,
    /// The store's failure that stopped the command, and the jobs it left unchanged.
    stopped: Option<(ReadError, Vec<String>)>,
    /// Each changed job's pause, read back, in the order of `changed`; `None` when the store, having
    /// stopped the command, did not answer the read-back either.
    paused: Option<Vec<Option<PauseRead>>>,
    /// Whether the `control` entries reached the history, if any was to be recorded.
    recorded: Option<bool>,
    ignored_by: Vec<Ignoring>,
}

/// Loads the config, finds the jobs, asks `check` whether to go on, makes the change of each job in turn
/// (`write`; a store failure stops at that job), reads their pauses back, records `control` in the
/// history for each change that took effect, and reports; or says why nothing was written.
fn change(
    config: &ConfigArg,
    jobs: &JobsArg,
    json: bool,
    control: Control,
    check: impl FnOnce(&mut Reader) -> Result<Go, ReadError>,
    write: impl Fn(&mut Reader, &str) -> Result<Changed, ReadError>,
) -> anyhow::Result<ExitCode> {
    let config = match load(&config.config) {
        Ok(config) => config,
        Err(code) => return Ok(code),
    };
    let names = match jobs.resolve(&config) {
        Ok(names) => names,
        Err(code) => return Ok(code),
    };
    let configured_nodes = config.store.nodes();
    let mut reader = match Reader::open(&config) {
        Ok(reader) => reader,
        Err(error) => return Ok(super::read_failed(&error)),
    };
    let ignored_by = match check(&mut reader) {
        Ok(Go::Ahead(ignored_by)) => ignored_by,
        Ok(Go::Refused(ignoring)) => {
            render::warn_notes(&reader.notes());
            let effect = match names.as_slice() {
                [job] => format!("it would go on running {job}'s ticks while paused"),
                several => format!(
                    "it would go on running the ticks of {} while paused",
                    names_text(several)
                ),
            };
            let given = jobs.as_given();
            say_error(&honoured::refusal("pause", &given, &ignoring, &effect));
            return Ok(ExitCode::from(Exit::Ignored));
        }
        Err(error) => return Ok(super::read_failed(&error)),
    };
    let done = match apply(&mut reader, &names, &control, ignored_by, write) {
        Ok(done) => done,
        Err(error) => return Ok(super::read_failed(&error)),
    };
    let notes = reader.notes();
    if jobs.one() {
        return report_one(done, configured_nodes, notes, json);
    }
    report_bulk(done, configured_nodes, notes, json)
}

/// Changes each of `names` in turn, reads the pauses back and records the controls that took effect. A
/// store failure on the first job is the command's error; on a later one it stops there, and the jobs
/// changed before it are still read back and recorded.
fn apply(
    reader: &mut Reader,
    names: &[String],
    control: &Control,
    ignored_by: Vec<Ignoring>,
    write: impl Fn(&mut Reader, &str) -> Result<Changed, ReadError>,
) -> Result<Done, ReadError> {
    // A control is stamped with the instant before its write, so that every tick the change can have
    // affected — claimed once the write landed — comes after its `control` entry in the history
    // (`explain`'s "latest pause or resume before it"); stamped after the write and the read-back, a
    // loaded machine put the first ticks a pause skipped before their pause.
    let clock = reader.cluster_clock();
    let mut changed = Vec::with_capacity(names.len());
    let mut stamps = Vec::with_capacity(names.len());
    let mut stopped = None;
    for (index, job) in names.iter().enumerate() {
        // Each change has the command's whole time: a thousand of them are not one read.
        reader.renew_deadline();
        let stamp = clock.now();
        match write(reader, job) {
            Ok(change) => {
                changed.push((job.clone(), change));
                stamps.push(stamp);
            }
            Err(error) if index == 0 => return Err(error),
            Err(error) => {
                stopped = Some((error, names[index..].to_vec()));
                break;
            }
        }
    }
    reader.renew_deadline();
    let changed_names: Vec<String> = changed.iter().map(|(job, _)| job.clone()).collect();
    let paused = match reader.pauses(&changed_names) {
        Ok(paused) => Some(paused),
        // The jobs changed before the failure are still reported, as changed and not read back.
        Err(_) if stopped.is_some() => None,
        Err(error) => return Err(error),
    };
    // After the read-back, with a deadline of its own: however the history write fares, the report of
    // the change is what it would have been without it.
    let mut recorded = None;
    if changed.iter().any(|(_, change)| took_effect(change)) {
        reader.renew_deadline();
        let entries: Vec<Entry> = changed
            .iter()
            .zip(&stamps)
            .filter(|((_, change), _)| took_effect(change))
            .map(|((job, _), stamp)| Entry::control(job, control, CONTROL_WRITER, *stamp))
            .collect();
        recorded = Some(record(reader, &entries, control));
    }
    Ok(Done {
        changed,
        stopped,
        paused,
        recorded,
        ignored_by,
    })
}

/// Whether the change is one the history records: a pause written, or a resume that lifted a pause.
fn took_effect(changed: &Changed) -> bool {
    matches!(
        changed,
        Changed::Paused(PauseOutcome::Paused) | Changed::Resumed { was_paused: true }
    )
}

/// Records the `control` entries of the jobs changed, stamped with cluster time; whether a majority
/// took them. A failure is a warning, not an error: the controls themselves are done and stay done.
fn record(reader: &mut Reader, entries: &[Entry], control: &Control) -> bool {
    match reader.record(entries) {
        Ok(()) => true,
        Err(error) => {
            let jobs: Vec<String> = entries.iter().map(|entry| entry.job.clone()).collect();
            say(&format!(
                "warning: {} {} {} as reported below, but the history does not record it: {error}",
                names_text(&jobs),
                if jobs.len() == 1 { "was" } else { "were" },
                control.action
            ));
            false
        }
    }
}

/// When a pause of `duration` from `now` ends.
fn until(now: DateTime<Utc>, duration: Duration) -> DateTime<Utc> {
    now + chrono::Duration::from_std(duration).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Query;

    #[test]
    fn for_takes_a_positive_duration_of_at_most_a_year() {
        assert_eq!(Pause::parse_for("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(Pause::parse_for(" 2h "), Ok(Duration::from_secs(7200)));
        assert!(Pause::parse_for("0s")
            .expect_err("zero")
            .contains("more than zero"));
        assert!(Pause::parse_for("2years").is_err());
        assert!(Pause::parse_for("soon")
            .expect_err("not a duration")
            .contains("is not a duration"));
    }

    /// A control is stamped with the instant before its change is written, not when it is recorded
    /// (after the write and the read-back): every tick the change can have affected comes after it.
    #[test]
    fn a_control_is_stamped_before_its_change_is_written() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let text = "embedded:\n  path: cron.db\njobs:\n  - name: alpha\n    schedule: \"* * * * *\"\n    command: [\"true\"]\n";
        let config = crate::config::parse(text, &dir.path().join("jobs.yaml")).expect("a config");
        // The command reads an existing store only: an empty file is an empty SQLite database.
        std::fs::write(dir.path().join("cron.db"), b"").expect("the database file");
        let mut reader = Reader::open(&config).expect("the embedded store");
        let pause = Pause {
            until: None,
            by: "tester".into(),
            reason: "stamp".into(),
        };
        let names = ["alpha".to_string()];
        // The write starts late (a slow store), and says when it reached the store.
        let reached = std::cell::Cell::new(None);
        let done = apply(
            &mut reader,
            &names,
            &Control::paused(&pause),
            Vec::new(),
            |reader, job| {
                std::thread::sleep(Duration::from_millis(400));
                reached.set(Some(Utc::now()));
                Ok(Changed::Paused(reader.pause(
                    job,
                    &pause,
                    InForce::Replace,
                )?))
            },
        )
        .expect("the pause");
        assert_eq!(done.recorded, Some(true));
        let reached = reached.get().expect("written").timestamp_millis();
        let query = Query {
            job: "alpha".into(),
            since: None,
            until: None,
            limit: 10,
        };
        let entries = reader.histories(&[query]).expect("the history");
        let controls: Vec<&Entry> = entries[0].iter().filter(|e| e.is_control()).collect();
        assert_eq!(controls.len(), 1, "{entries:?}");
        // 200 ms of the 400 spare for a loaded machine; stamped on record, it would come after `reached`.
        assert!(
            controls[0].tick <= reached - 200,
            "stamped {} for a write that reached the store at {reached}",
            controls[0].tick
        );
    }
}
