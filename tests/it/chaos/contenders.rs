//! What became of the ticks that dead contenders went after: the ghosts' ticks and the ticks whose
//! first racer was killed mid-claim. Each such tick must still run (a ghost only ever claims a minority,
//! and a live worker waits out a dead one's lease), unless the dead one was granted it; misses among
//! them are judged by the miss rules like any other, this only counts them for the report.

use super::checker::Input;
use super::claims::{worker_of, Confirms};
use super::facts::Facts;
use super::report::{show_time, Report};

/// Adds a note on ghosts and aimed kills, and a failure for a ghost's claim on a majority.
pub fn note_contenders(input: &Input<'_>, facts: &Facts, confirms: &Confirms, report: &mut Report) {
    let ran = |job: &str, tick: i64| {
        facts
            .runs
            .iter()
            .any(|r| r.job == job && r.tick == tick && r.run_id.is_some())
    };
    let in_window = |tick: i64| input.window.0 <= tick && tick <= input.window.1;
    let (mut majority, mut claimed, mut run, mut missed) = (0, 0, 0, Vec::new());
    for ghost in &facts.ghosts {
        majority += usize::from(ghost.leased.len() > super::plan::NODES / 2);
        claimed += usize::from(!ghost.confirmed.is_empty());
        if ran(&ghost.job, ghost.tick) {
            run += 1;
        } else if in_window(ghost.tick) {
            missed.push(format!("{} at {}", ghost.job, show_time(ghost.tick)));
        }
        for claimant in confirms.granted(&ghost.job, ghost.tick) {
            if worker_of(claimant).is_none() {
                report.failures.push(format!(
                    "GHOST GRANTED: {} at {} was confirmed on a majority for the ghost {claimant}",
                    ghost.job,
                    show_time(ghost.tick)
                ));
            }
        }
    }
    if !facts.ghosts.is_empty() {
        report.notes.push(format!(
            "ghost contenders: {} ({majority} with their lease on a majority, {claimed} with a partial claim); \
             their ticks ran {run} times, missed in the window: {}",
            facts.ghosts.len(),
            if missed.is_empty() { "none".to_string() } else { missed.join(", ") }
        ));
    }

    let (mut others, mut dead, mut own, mut lost) = (0, 0, 0, 0);
    for &(_, instance, tick) in &facts.aimed {
        let worker = facts.lives[instance].worker;
        for job in input.jobs {
            let runs: Vec<_> = facts
                .runs
                .iter()
                .filter(|r| r.job == job.name && r.tick == tick && r.run_id.is_some())
                .collect();
            let granted_dead = confirms
                .granted(&job.name, tick)
                .iter()
                .any(|c| worker_of(c) == Some(worker));
            match runs.first() {
                Some(r) if r.instance == instance => own += 1,
                Some(_) => others += 1,
                None if granted_dead => dead += 1,
                None => lost += 1,
            }
        }
    }
    if !facts.aimed.is_empty() {
        report.notes.push(format!(
            "kills aimed at a race: {}; of their ticks (one per job), {own} ran on the killed worker (it \
             started the job first), {others} on another worker, {dead} were granted to the killed one \
             (AOF) and never ran, {lost} did not run otherwise",
            facts.aimed.len()
        ));
    }
}
