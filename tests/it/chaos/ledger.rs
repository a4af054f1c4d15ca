//! The fenced resource: a ledger in a Redis of its own that accepts a write only with a current token.
//!
//! This is the storage of Kleppmann's fencing argument ("How to do distributed locking", 2016): it
//! remembers, per resource, the highest token it accepted, and refuses a write that carries a lower one —
//! the write of a holder whose lease was taken over while it was paused. Every attempt, accepted or not,
//! is appended to a list with the ledger server's own time, so the checker can see who wrote what, when,
//! and what was turned away.
//!
//! A job writes through `ledger.sh <phase> <scope>` (written into the test directory), which runs
//! `redis-cli EVALSHA` with the job's `REDCRON_*` environment:
//! - `phase` is `start` (the job's first write) or `end` (a later write of the same run). A start must
//!   carry a token *greater* than the last accepted one: a new run always has a new, higher token. An end
//!   may carry the *same* token: it is the current holder writing again.
//! - `scope` is `job` (one resource per job: runs of an `overlap: skip` job follow each other) or `tick`
//!   (one resource per (job, tick): runs of an `overlap: allow` job may legitimately overlap, so each tick's
//!   output is fenced on its own).
//!
//! The script exits 0 when the write was accepted and 1 when it was rejected, so a job that lost its
//! fence stops before doing its work, as a real one should.

use std::path::{Path, PathBuf};

use crate::support::RedisCluster;

/// The fencing check and the attempt log, atomic on the ledger's server.
///
/// KEYS: the hash of last accepted tokens, the attempt list.
/// ARGV: resource, job, tick, token, worker, run id, phase.
/// Tokens stay below 2^53, where Lua's numbers are exact; they are stored and logged as the decimal
/// strings the worker gave, never re-formatted by Lua.
const SCRIPT: &str = r#"
local resource, token, phase = ARGV[1], ARGV[4], ARGV[7]
local last = redis.call('HGET', KEYS[1], resource)
local ok
if not last then
  ok = true
elseif phase == 'start' then
  ok = tonumber(token) > tonumber(last)
else
  ok = tonumber(token) >= tonumber(last)
end
if ok then
  redis.call('HSET', KEYS[1], resource, token)
end
local now = redis.call('TIME')
local ms = string.format('%d%03d', tonumber(now[1]), math.floor(tonumber(now[2]) / 1000))
local verdict = ok and 'accepted' or 'rejected'
redis.call('RPUSH', KEYS[2], table.concat({resource, ARGV[2], ARGV[3], token, ARGV[5], ARGV[6], phase,
  verdict, last or '-', ms}, ' '))
return verdict
"#;

const LAST: &str = "ledger:last";
const ATTEMPTS: &str = "ledger:attempts";

/// A job's write: the first of its run, or a later one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Start,
    End,
}

/// One attempted write, as the ledger recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// `<job>` or `<job>@<tick>`.
    pub resource: String,
    pub job: String,
    /// As the job received it (`REDCRON_TICK`), RFC 3339.
    pub tick: String,
    pub token: u64,
    pub worker: String,
    pub run_id: String,
    pub phase: Phase,
    pub accepted: bool,
    /// The last accepted token for the resource when this attempt came, if any.
    pub previous: Option<u64>,
    /// The ledger server's clock (real time), Unix ms.
    pub at_ms: i64,
}

impl Attempt {
    /// The entry as the ledger wrote it: [`Attempt::parse`] reads it back.
    pub fn line(&self) -> String {
        let phase = match self.phase {
            Phase::Start => "start",
            Phase::End => "end",
        };
        let verdict = if self.accepted {
            "accepted"
        } else {
            "rejected"
        };
        let previous = self.previous.map_or("-".to_string(), |p| p.to_string());
        format!(
            "{} {} {} {} {} {} {phase} {verdict} {previous} {}",
            self.resource, self.job, self.tick, self.token, self.worker, self.run_id, self.at_ms
        )
    }

    /// Parses one entry of the attempt list.
    pub fn parse(line: &str) -> Result<Attempt, String> {
        let fields: Vec<&str> = line.split(' ').collect();
        let [resource, job, tick, token, worker, run_id, phase, verdict, previous, at] = fields[..]
        else {
            return Err(format!(
                "ledger entry with {} fields: {line:?}",
                fields.len()
            ));
        };
        let number = |text: &str| {
            text.parse::<u64>()
                .map_err(|_| format!("bad number {text:?} in ledger entry {line:?}"))
        };
        Ok(Attempt {
            resource: resource.to_string(),
            job: job.to_string(),
            tick: tick.to_string(),
            token: number(token)?,
            worker: worker.to_string(),
            run_id: run_id.to_string(),
            phase: match phase {
                "start" => Phase::Start,
                "end" => Phase::End,
                _ => return Err(format!("bad phase in ledger entry {line:?}")),
            },
            accepted: verdict == "accepted",
            previous: if previous == "-" {
                None
            } else {
                Some(number(previous)?)
            },
            at_ms: number(at)? as i64,
        })
    }
}

/// The ledger's Redis server and the script that jobs call.
pub struct Ledger {
    server: RedisCluster,
    script: PathBuf,
}

impl Ledger {
    /// Starts the ledger's server, loads the script, and writes `ledger.sh` into `dir`.
    pub fn start(dir: &Path) -> Ledger {
        let server = RedisCluster::builder().nodes(1).start();
        let sha: String = server.query(0, redis::cmd("SCRIPT").arg("LOAD").arg(SCRIPT));
        let script = dir.join("ledger.sh");
        let text = format!(
            r#"#!/bin/sh
# Writes to the chaos test's fenced ledger: ledger.sh start|end job|tick
resource="$REDCRON_JOB"
if [ "$2" = tick ]; then resource="$REDCRON_JOB@$REDCRON_TICK"; fi
reply=$(redis-cli -p {port} EVALSHA {sha} 2 {LAST} {ATTEMPTS} "$resource" "$REDCRON_JOB" \
  "$REDCRON_TICK" "$REDCRON_FENCING_TOKEN" "$REDCRON_WORKER_ID" "$REDCRON_RUN_ID" "$1")
echo "ledger $1: $reply"
[ "$reply" = accepted ]
"#,
            port = server.port(0),
        );
        std::fs::write(&script, text).expect("cannot write ledger.sh");
        set_executable(&script);
        Ledger { server, script }
    }

    /// The path of `ledger.sh`.
    pub fn script(&self) -> &Path {
        &self.script
    }

    /// Every attempt so far, in the order the ledger received them.
    pub fn attempts(&self) -> Result<Vec<Attempt>, String> {
        let lines: Vec<String> = self
            .server
            .query(0, redis::cmd("LRANGE").arg(ATTEMPTS).arg(0).arg(-1));
        lines.iter().map(|line| Attempt::parse(line)).collect()
    }
}

fn set_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let mut permissions = std::fs::metadata(path)
        .expect("ledger.sh was just written")
        .permissions();
    permissions.set_mode(0o755);
    std::fs::set_permissions(path, permissions).expect("cannot make ledger.sh executable");
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;
    use crate::support::TestDir;

    fn write(ledger: &Ledger, phase: &str, scope: &str, tick: &str, token: u64, run: &str) -> bool {
        Command::new(ledger.script())
            .args([phase, scope])
            .env("REDCRON_JOB", "j")
            .env("REDCRON_TICK", tick)
            .env("REDCRON_FENCING_TOKEN", token.to_string())
            .env("REDCRON_WORKER_ID", "w0")
            .env("REDCRON_RUN_ID", run)
            .status()
            .expect("ledger.sh runs")
            .success()
    }

    /// The fencing rule: a start needs a higher token, an end the same or higher; a lower one is
    /// rejected and recorded; tick-scoped resources are fenced separately.
    #[test]
    fn ledger_accepts_only_current_tokens_and_records_every_attempt() {
        crate::support::require_program("redis-cli", "redis-tools");
        let dir = TestDir::new();
        let ledger = Ledger::start(dir.path());
        let t1 = "2026-01-01T00:00:01.000Z";
        let t2 = "2026-01-01T00:00:02.000Z";
        assert!(write(
            &ledger,
            "start",
            "job",
            t1,
            1_767_225_601_000_000,
            "r1"
        ));
        assert!(write(
            &ledger,
            "end",
            "job",
            t1,
            1_767_225_601_000_000,
            "r1"
        ));
        assert!(write(
            &ledger,
            "start",
            "job",
            t2,
            1_767_225_602_000_000,
            "r2"
        ));
        assert!(
            !write(&ledger, "end", "job", t1, 1_767_225_601_000_000, "r1"),
            "stale end"
        );
        assert!(
            !write(&ledger, "start", "job", t2, 1_767_225_602_000_000, "r3"),
            "same token"
        );
        assert!(write(
            &ledger,
            "start",
            "tick",
            t1,
            1_767_225_601_000_001,
            "r4"
        ));
        let attempts = ledger.attempts().expect("parsable ledger");
        let verdicts: Vec<(Phase, bool)> = attempts.iter().map(|a| (a.phase, a.accepted)).collect();
        assert_eq!(
            verdicts,
            [
                (Phase::Start, true),
                (Phase::End, true),
                (Phase::Start, true),
                (Phase::End, false),
                (Phase::Start, false),
                (Phase::Start, true),
            ]
        );
        assert_eq!(attempts[3].previous, Some(1_767_225_602_000_000));
        assert_eq!(attempts[3].token, 1_767_225_601_000_000);
        assert_eq!(attempts[5].resource, format!("j@{t1}"));
        let now = chrono::Utc::now().timestamp_millis();
        assert!(
            (now - attempts[0].at_ms).abs() < 10_000,
            "ledger time is real time"
        );
    }
}
