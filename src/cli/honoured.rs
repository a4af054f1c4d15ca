//! Whether the live workers obey a command before it acts: `pause` and `trigger` read the membership and,
//! when a live worker does not list the command in its announcement (`honours`, see
//! [`crate::membership::Capability`]), name it and refuse with [`super::Exit::Ignored`] — unless told
//! `--even-if-ignored`, and then the report says which workers ignore it.
//!
//! Why refuse: a worker of a release before pauses existed claims through scripts that never read the
//! pause, so it goes on running a paused job's ticks while `pause` would report that no tick starts
//! anywhere; one before triggers never claims a request, which then may not run. A worker that joins after
//! the check is not seen: the check is as of the command.

use serde::Serialize;

use super::read::{ReadError, Reader};
use crate::membership::{self, Capability};

/// A live worker that would ignore the command, as the reports name it. Field names are stable
/// (docs/history.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(super) struct Ignoring {
    pub id: String,
    pub host: String,
    /// The version it announces (empty if none).
    pub version: String,
}

impl Ignoring {
    /// `id (host h, version v)`.
    fn describe(&self) -> String {
        let version = match self.version.as_str() {
            "" => "no version announced".to_string(),
            version => format!("version {version}"),
        };
        format!("{} (host {}, {version})", self.id, self.host)
    }
}

/// The live workers that would ignore `capability`, read from the store's membership.
pub(super) fn ignoring(
    reader: &mut Reader,
    capability: Capability,
) -> Result<Vec<Ignoring>, ReadError> {
    let members = reader.members()?;
    Ok(membership::ignoring(&members, capability)
        .into_iter()
        .map(|member| Ignoring {
            id: member.id.clone(),
            host: member.host.clone(),
            version: member.version.clone(),
        })
        .collect())
}

/// `a (host …, version …) and b (…)`.
pub(super) fn names(workers: &[Ignoring]) -> String {
    let named: Vec<String> = workers.iter().map(Ignoring::describe).collect();
    match named.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// Why `command` refused: who ignores it, what that would do, and how to go on anyway.
pub(super) fn refusal(command: &str, job: &str, workers: &[Ignoring], effect: &str) -> String {
    let (whom, verb) = match workers.len() {
        1 => ("worker", "does"),
        _ => ("workers", "do"),
    };
    format!(
        "not done: live {whom} {} {verb} not honour `redcron {command}` (an earlier release, which \
         announces no `honours`): {effect}; upgrade {}, or run `redcron {command} {job} \
         --even-if-ignored` to go on anyway",
        names(workers),
        if workers.len() == 1 { "it" } else { "them" },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(id: &str, version: &str) -> Ignoring {
        Ignoring {
            id: id.into(),
            host: "h".into(),
            version: version.into(),
        }
    }

    #[test]
    fn a_refusal_names_every_worker_and_the_way_on() {
        let text = refusal("pause", "j", &[worker("a", "0.0.9")], "it runs j's ticks");
        assert!(
            text.contains("live worker a (host h, version 0.0.9) does not honour `redcron pause`")
        );
        assert!(text.contains("redcron pause j --even-if-ignored"));
        let two = [worker("a", "0.0.9"), worker("b", "")];
        assert_eq!(
            names(&two),
            "a (host h, version 0.0.9) and b (host h, no version announced)"
        );
        assert!(refusal("trigger", "j", &two, "x").contains("workers a (host h"));
    }
}
