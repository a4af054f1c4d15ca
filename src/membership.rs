//! Membership: every worker announces itself to the store with a heartbeat that expires when it dies.
//!
//! A [`Member`] says who the worker is (id, host, pid, version), what it runs (its config's fingerprint and
//! the runs under way), which commands acting through the store it obeys ([`Capability`]) and how its clock
//! stands. The store stamps each announcement with its own clock and
//! keeps it for [`KEEP_DEAD`] after it expired, so that `redcron status` can show a worker that died and
//! when it was last seen.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// How often a worker announces itself, unless `worker.heartbeat_every` says otherwise.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
/// How many heartbeats a worker may miss before it counts as dead.
pub const HEARTBEATS_MISSED: u32 = 3;
/// How long the store keeps a dead worker's last announcement.
pub const KEEP_DEAD: Duration = Duration::from_secs(24 * 3600);

/// A command that acts through the store, and that a worker obeys only if its release knows it: a worker
/// of an earlier release goes on running a paused job's ticks (its claim scripts never read the pause) and
/// never claims a trigger request. Workers list the ones they obey in their announcement (`honours`), so
/// that `redcron pause` and `redcron trigger` can tell when a live worker would ignore them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// `redcron pause`: no tick of a paused job is claimed.
    Pause,
    /// `redcron trigger`: trigger requests are read and claimed.
    Trigger,
}

impl Capability {
    /// Every capability of this release, as its workers announce them.
    pub const ALL: [Capability; 2] = [Capability::Pause, Capability::Trigger];

    /// The name in `honours` (stable: workers of other releases read it).
    pub fn name(self) -> &'static str {
        match self {
            Capability::Pause => "pause",
            Capability::Trigger => "trigger",
        }
    }
}

/// One run under way on a member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    pub job: String,
    /// Milliseconds since the Unix epoch.
    pub tick: i64,
    pub token: u64,
}

/// A worker's announcement. Field names are stable (`docs/history.md`); unknown fields are ignored and
/// missing ones take their defaults, so workers of other versions never break `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Member {
    pub id: String,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub pid: u32,
    #[serde(default)]
    pub version: String,
    /// The fingerprint of the worker's whole schedule: equal on workers that run the same `jobs.yaml`.
    #[serde(default)]
    pub config_fingerprint: String,
    /// Cluster time minus this worker's wall clock, in milliseconds, when measured (as the `clock.offset`
    /// event reports it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_ms: Option<i64>,
    pub started_at: DateTime<Utc>,
    #[serde(default)]
    pub running: Vec<Running>,
    /// How often this worker announces itself, in milliseconds; it is dead after
    /// [`HEARTBEATS_MISSED`] of them.
    #[serde(default)]
    pub heartbeat_ms: u64,
    /// The commands it obeys ([`Capability::name`]); absent in the announcements of releases before the
    /// list existed, which obey none of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub honours: Option<Vec<String>>,
    /// `running`, or `stopped` in the last announcement of a worker that shut down.
    #[serde(default = "running_state")]
    pub state: String,
    /// When the store last heard from it (the store's clock, set by the store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_at: Option<DateTime<Utc>>,
    /// Whether its heartbeat had not expired when read (set by the store on reading).
    #[serde(default)]
    pub alive: bool,
    /// Other live processes this worker found announcing themselves under its id (a file every host
    /// shares that sets `worker.id`): the store keeps one record per id, so this is how `status` shows
    /// them all. At most [`MOST_SHARERS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_with: Vec<Sharer>,
}

/// Another process under a worker's id, as that worker last read it from the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sharer {
    pub host: String,
    pub pid: u32,
    /// When the store last heard from it (its record's `seen_at` when read).
    pub seen_at: DateTime<Utc>,
}

/// The most other processes one announcement lists in `shared_with`.
pub const MOST_SHARERS: usize = 8;

impl Member {
    /// How long the store keeps this announcement alive: [`HEARTBEATS_MISSED`] heartbeats, none for a
    /// worker that stopped.
    pub fn ttl(&self) -> Duration {
        if self.state == "stopped" {
            return Duration::ZERO;
        }
        let every = match self.heartbeat_ms {
            0 => HEARTBEAT_EVERY,
            ms => Duration::from_millis(ms),
        };
        every * HEARTBEATS_MISSED
    }

    /// Whether this worker obeys `capability`: it lists it in `honours` (a worker that lists nothing is of
    /// an earlier release, and obeys none).
    pub fn honours(&self, capability: Capability) -> bool {
        self.honours
            .as_ref()
            .is_some_and(|names| names.iter().any(|name| name == capability.name()))
    }
}

/// The members that take ticks now (alive and `running`: a draining worker takes no new ones) and would
/// ignore `capability`.
pub fn ignoring(members: &[Member], capability: Capability) -> Vec<&Member> {
    members
        .iter()
        .filter(|member| member.alive && member.state == "running" && !member.honours(capability))
        .collect()
}

/// The longest worker id, and the longest of each other text field of an announcement, in bytes.
const MAX_TEXT: usize = 256;

impl Member {
    /// Reads the announcement stored under `key` (its worker id in the store), for the store's readers:
    /// it is data from the store, which anyone who can write to the store may have planted. Refused when it
    /// is not JSON of a member, when its id is empty, longer than 256 bytes or not `key`, or when another
    /// text field is longer than 256 bytes; the error says which, shortly.
    pub fn read(key: &str, json: &str) -> Result<Member, String> {
        let member: Member = serde_json::from_str(json)
            .map_err(|e| crate::logging::shorten(&format!("not a member: {e}"), 200))?;
        if member.id.is_empty() || member.id.len() > MAX_TEXT {
            return Err(format!("an id of {} bytes", member.id.len()));
        }
        if member.id != key {
            return Err(format!(
                "its id {} is not its key",
                crate::logging::shorten(&format!("{:?}", member.id), 100)
            ));
        }
        let texts = [
            ("host", &member.host),
            ("version", &member.version),
            ("config_fingerprint", &member.config_fingerprint),
            ("state", &member.state),
        ];
        if let Some((field, text)) = texts.iter().find(|(_, text)| text.len() > MAX_TEXT) {
            return Err(format!(
                "`{field}` is {} bytes long, more than {MAX_TEXT}",
                text.len()
            ));
        }
        if member.shared_with.len() > MOST_SHARERS {
            return Err(format!(
                "`shared_with` lists {} processes, more than {MOST_SHARERS}",
                member.shared_with.len()
            ));
        }
        if let Some(sharer) = member.shared_with.iter().find(|s| s.host.len() > MAX_TEXT) {
            return Err(format!(
                "a `shared_with` host is {} bytes long, more than {MAX_TEXT}",
                sharer.host.len()
            ));
        }
        Ok(member)
    }
}

fn running_state() -> String {
    "running".to_string()
}

/// Merges the members read from several nodes: the latest announcement of each worker, alive if any node
/// that has the latest says so; sorted by id.
pub fn merge(replicas: impl IntoIterator<Item = Vec<Member>>) -> Vec<Member> {
    let mut merged: Vec<Member> = Vec::new();
    for member in replicas.into_iter().flatten() {
        match merged.iter_mut().find(|m| m.id == member.id) {
            None => merged.push(member),
            Some(kept) if member.seen_at > kept.seen_at => *kept = member,
            Some(kept) => kept.alive |= member.alive && member.seen_at == kept.seen_at,
        }
    }
    merged.sort_by(|a, b| a.id.cmp(&b.id));
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, seen: i64, alive: bool) -> Member {
        Member {
            id: id.into(),
            host: "h".into(),
            pid: 1,
            version: "0".into(),
            config_fingerprint: "f".into(),
            clock_offset_ms: None,
            started_at: DateTime::from_timestamp(0, 0).unwrap_or_default(),
            running: vec![],
            heartbeat_ms: 1000,
            honours: Some(vec!["pause".into()]),
            state: running_state(),
            seen_at: DateTime::from_timestamp(seen, 0),
            alive,
            shared_with: vec![],
        }
    }

    #[test]
    fn the_latest_announcement_wins() {
        let merged = merge(vec![
            vec![member("a", 10, false), member("b", 5, true)],
            vec![member("a", 20, true)],
        ]);
        assert_eq!(merged, vec![member("a", 20, true), member("b", 5, true)]);
    }

    #[test]
    fn members_that_no_worker_can_have_announced_are_refused() {
        let good = serde_json::to_string(&member("w1", 10, true)).unwrap_or_default();
        assert!(Member::read("w1", &good).is_ok());
        assert!(Member::read("w2", &good).is_err());
        assert!(Member::read("w1", "not json").is_err());
        let huge = good.replace("\"h\"", &format!("\"{}\"", "h".repeat(1 << 20)));
        let why = Member::read("w1", &huge).expect_err("a huge host");
        assert!(why.contains("host"), "{why}");
        let empty = good.replace("\"w1\"", "\"\"");
        assert!(Member::read("", &empty).is_err());
        let typed = good.replace("\"h\"", &"1".repeat(1 << 20));
        assert!(Member::read("w1", &typed).expect_err("a number").len() < 300);
        let sharer = Sharer {
            host: "h2".into(),
            pid: 7,
            seen_at: DateTime::from_timestamp(10, 0).unwrap_or_default(),
        };
        let sharing = |count: usize| Member {
            shared_with: vec![sharer.clone(); count],
            ..member("w1", 10, true)
        };
        let json = |m: &Member| serde_json::to_string(m).unwrap_or_default();
        let read = Member::read("w1", &json(&sharing(MOST_SHARERS))).expect("within the bound");
        assert_eq!(read.shared_with.len(), MOST_SHARERS);
        let why = Member::read("w1", &json(&sharing(MOST_SHARERS + 1))).expect_err("too many");
        assert!(why.contains("shared_with"), "{why}");
    }

    #[test]
    fn members_of_older_versions_are_read() {
        let old = r#"{"id":"w1","started_at":"2026-11-23T10:00:00Z","future_field":[1,2]}"#;
        let m: Member =
            serde_json::from_str(old).expect("missing and unknown fields are tolerated");
        assert_eq!(m.state, "running");
        assert!(m.running.is_empty());
        assert_eq!(m.honours, None);
        assert!(!m.honours(Capability::Pause) && !m.honours(Capability::Trigger));
    }

    #[test]
    fn the_live_workers_that_ignore_a_capability_are_those_that_do_not_list_it() {
        let old = Member {
            honours: None,
            ..member("old", 1, true)
        };
        let dead_old = Member {
            honours: None,
            ..member("dead", 1, false)
        };
        let draining_old = Member {
            honours: None,
            state: "stopping".into(),
            ..member("draining", 1, true)
        };
        let members = [member("new", 1, true), old, dead_old, draining_old];
        let ids = |capability| -> Vec<&str> {
            ignoring(&members, capability)
                .iter()
                .map(|m| m.id.as_str())
                .collect()
        };
        assert_eq!(ids(Capability::Pause), ["old"]);
        assert_eq!(ids(Capability::Trigger), ["new", "old"]);
        // The field travels under its stable name, and only when known.
        let json = serde_json::to_value(&members[0]).expect("json");
        assert_eq!(json["honours"], serde_json::json!(["pause"]));
        let json = serde_json::to_value(&members[1]).expect("json");
        assert!(json.get("honours").is_none(), "{json}");
    }
}
