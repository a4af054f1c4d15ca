//! What the ZooKeeper ensemble granted: every write of every job's claim record, read back from each
//! member's transaction log — the ZooKeeper run's counterpart of the Redis nodes' append-only files
//! ([`super::claims`]) and of etcd's history ([`super::etcd_claims`]).
//!
//! A member logs (and fsyncs) each proposal of the leader before acknowledging it, and the leader commits
//! it once a quorum acknowledged: a write in the logs of a majority of members was committed — the
//! ensemble granted that tick to that claimant, whether or not its worker lived to log `tick.won`. The
//! logs are read at the end of the run, with the member processes still up (ZooKeeper writes a log file
//! before its members answer, and never rewrites a logged entry; a minority's proposal that no quorum
//! acknowledged is truncated away when its member rejoins, or stays in its log only). So each member is a
//! node of [`ClaimWrite`], and the checker's majority rule applies unchanged.
//!
//! The store writes a claim record as the node `/<prefix>/jobs/<job>/c<series suffix>` holding
//! `<tick ms> <lease value>`, created or set inside the claim's multi-op; it is read back as the Redis
//! key `<prefix>:{<job>}:claim<series suffix>`. Lease nodes are ephemeral and expire with their session,
//! which no log entry dates, so none are read (as on etcd).
//!
//! The log format (ZooKeeper's `FileTxnLog`): a 16-byte header (`ZKLG`, version 2, dbid), then per entry
//! a CRC (8 bytes), the entry's length (4) and bytes, and an end-of-record byte; a zero length is the
//! preallocated end. An entry is a `TxnHeader` (client id, cxid, zxid, time, type) and the transaction;
//! a multi-op holds its sub-transactions as (type, bytes) pairs, all of them errors if it failed.

use std::collections::BTreeSet;
use std::path::Path;

use testkit::ZkEnsemble;

use super::claims::{self, ClaimWrite};

/// The workers' key prefix (the default `key_prefix`): the chroot `/redcron`.
const PREFIX: &str = "redcron";
/// The longest entry read (ZooKeeper's own `jute.maxbuffer` and its header): a longer length is garbage.
const MAX_ENTRY: usize = (1 << 20) + 4096;

const CREATE: i32 = 1;
const SET_DATA: i32 = 5;
const MULTI: i32 = 14;
const CREATE2: i32 = 15;

/// Every claim record write in each member's transaction logs, as written on that member; panics if a
/// member's logs cannot be read (the run's evidence would be missing).
pub fn read_logs(members: &ZkEnsemble) -> Vec<ClaimWrite> {
    (0..members.len())
        .flat_map(|member| {
            let dir = members.data_dir(member).join("version-2");
            let mut logs: Vec<_> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|path| {
                    path.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("log."))
                })
                .collect();
            logs.sort_by_key(|path| log_start(path));
            // A rejoining member may log an entry again in a newer file: each zxid once.
            let mut seen = BTreeSet::new();
            let mut writes = Vec::new();
            for log in logs {
                let bytes = std::fs::read(&log)
                    .unwrap_or_else(|e| panic!("cannot read {}: {e}", log.display()));
                for (zxid, path, data) in record_writes(&bytes) {
                    if seen.insert((zxid, path.clone())) {
                        writes.extend(claim_write(member, &path, &data));
                    }
                }
            }
            writes
        })
        .collect()
}

/// The first zxid of a log file, from its name (`log.<hex zxid>`).
fn log_start(path: &Path) -> u64 {
    path.extension()
        .and_then(|e| e.to_str())
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .unwrap_or(0)
}

/// `/<prefix>/jobs/<job>/c<suffix>` with `<tick ms> <lease value>` as a claim record write on `member`.
fn claim_write(member: usize, path: &str, data: &[u8]) -> Option<ClaimWrite> {
    let rest = path.strip_prefix(&format!("/{PREFIX}/jobs/"))?;
    let (job, node) = rest.split_once('/')?;
    let suffix = node.strip_prefix('c')?;
    if suffix.contains('/') {
        return None;
    }
    let value = std::str::from_utf8(data).ok()?;
    claims::parse_set(member, &format!("{PREFIX}:{{{job}}}:claim{suffix}"), value)
}

/// `(zxid, path, data)` of every create and setData in a transaction log, multi-ops' included; an entry
/// that does not parse ends the file (a torn write at a crash, or the preallocated end).
fn record_writes(bytes: &[u8]) -> Vec<(i64, String, Vec<u8>)> {
    let mut found = Vec::new();
    let mut file = Reader(bytes);
    if file.take(16).is_none_or(|header| &header[..4] != b"ZKLG") {
        return found;
    }
    // Each entry: its CRC (unchecked: a torn entry fails to parse instead), length, bytes, `B`.
    while let Some(_crc) = file.i64() {
        let Some(length) = file.i32() else { break };
        let Ok(length) = usize::try_from(length) else {
            break;
        };
        if length == 0 || length > MAX_ENTRY {
            break;
        }
        let Some(entry) = file.take(length) else {
            break;
        };
        if file.take(1) != Some(b"B".as_slice()) {
            break;
        }
        let mut entry = Reader(entry);
        let header = (
            entry.i64(),
            entry.i32(),
            entry.i64(),
            entry.i64(),
            entry.i32(),
        );
        let (Some(_client), Some(_cxid), Some(zxid), Some(_time), Some(kind)) = header else {
            continue;
        };
        write_of(kind, &mut entry, zxid, &mut found);
    }
    found
}

/// The create or setData of type `kind` at `body`, or every one inside a multi-op, added to `found`.
fn write_of(kind: i32, body: &mut Reader<'_>, zxid: i64, found: &mut Vec<(i64, String, Vec<u8>)>) {
    match kind {
        CREATE | CREATE2 | SET_DATA => {
            if let (Some(path), Some(data)) = (body.string(), body.buffer()) {
                found.push((zxid, path, data.to_vec()));
            }
        }
        MULTI => {
            let Some(count) = body.i32() else { return };
            for _ in 0..count.clamp(0, 1_000) {
                let (Some(kind), Some(inner)) = (body.i32(), body.buffer()) else {
                    return;
                };
                write_of(kind, &mut Reader(inner), zxid, found);
            }
        }
        _ => {}
    }
}

/// Big-endian fields off a byte slice; `None` past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    fn i64(&mut self) -> Option<i64> {
        Some(i64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }

    /// A length-prefixed buffer (-1: none).
    fn buffer(&mut self) -> Option<&'a [u8]> {
        let length = self.i32()?;
        if length < 0 {
            return Some(&[]);
        }
        self.take(usize::try_from(length).ok()?)
    }

    fn string(&mut self) -> Option<String> {
        Some(String::from_utf8_lossy(self.buffer()?).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim record created through the harness's own client is found in every member's log (a
    /// committed write is logged by all three once they are in sync), read back as a claim write.
    #[test]
    fn claim_records_are_read_from_every_members_log() {
        let ensemble = ZkEnsemble::start(3);
        let mut session = ensemble.session();
        session
            .create_all("/redcron/jobs/quick", b"")
            .expect("created");
        session
            .create(
                "/redcron/jobs/quick/c",
                b"1700000000000 w1/abc|1|1700000000000|f",
            )
            .expect("created");
        session
            .set_data(
                "/redcron/jobs/quick/c",
                b"1700000001000 w2/def|1|1700000001000|f",
            )
            .expect("set");
        session
            .create("/redcron/jobs/quick/other", b"1700000000000 w3/x")
            .expect("created");
        drop(session);
        // Followers log a proposal before they acknowledge it; a write answered is on a quorum, and the
        // third member's log catches up at once on an idle machine.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let writes = loop {
            let writes = read_logs(&ensemble);
            if writes.len() >= 6 || std::time::Instant::now() > deadline {
                break writes;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let mut lines: Vec<String> = writes.iter().map(ClaimWrite::line).collect();
        lines.sort();
        let expected: Vec<String> = (0..3)
            .flat_map(|m| {
                [
                    format!("{m} quick 1700000000000 - w1/abc|1|1700000000000|f"),
                    format!("{m} quick 1700000001000 - w2/def|1|1700000001000|f"),
                ]
            })
            .collect();
        let mut expected = expected;
        expected.sort();
        assert_eq!(lines, expected);
    }
}
