//! What the lock nodes confirmed: every claim write, read back from each node's append-only file.
//!
//! The nodes run with `appendonly yes`, so their AOF holds every write they made, in order — the effects
//! of the lock's scripts included (Redis 7 propagates a script as the writes it did). A claim write
//! (`SET <prefix>:{<job>}:claim "<tick ms> <lease value>"`) is a node confirming a tick for one claimant
//! (`<worker id>/<uuid>`, the lease value's first field); a claimant confirmed on a majority of nodes was
//! granted the tick, whether or not it lived to say so. That is the evidence behind two of the checker's
//! rules: no tick is confirmed on a majority for two claimants, and a tick nobody ran may be explained by
//! a grant to a claimant that was killed or paused before it logged `tick.won`.
//!
//! Lease writes (`SET <prefix>:{<job>}:lease[:<tick>] <value> PXAT <expiry>`) are read too: a lease of a
//! contender that died between its rounds blocks the others until that expiry, which is evidence for a
//! tick nobody could claim in time.
//!
//! A claim in the older format (a plain tick) names no claimant; it is kept, but proves nothing about
//! who. Writes before an AOF rewrite would be lost (a rewrite needs 64 MB; a run writes a few).
//!
//! A Sentinel group is one node of the majority, node 0, whatever server is its master ([`read_group`]).
//! Its claim counted only once `WAIT` said a replica had it (`min_replicas_acked: all`), and a replica
//! with `appendonly yes` writes what it applies to its own AOF (fsync always, before it acknowledges):
//! so a write that counted is in the AOF of at least two data nodes, its master's and a replica's. A
//! write in one data node's AOF only reached no replica — a master cut off from them (hung, then
//! continued after the Sentinels promoted another) answering pipelines queued before its hang — and
//! did not count, though it stays in that AOF. A replica's full resynchronisation rewrites its AOF;
//! the group's data nodes keep the history of theirs (`aof-disable-auto-gc yes`), and the files of
//! that history are read too. Each write is counted once, whichever data nodes hold it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// One claim (or lease) write on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimWrite {
    pub node: usize,
    pub job: String,
    /// The claimed tick (for a lease, the tick its value names), Unix ms.
    pub tick: i64,
    /// The lease value the tick was confirmed for (or the lease's value); `None` for a plain-number claim.
    pub holder: Option<String>,
    /// For a lease write, when the node expires it (Unix ms); `None` for a claim record.
    pub lease_expires: Option<i64>,
}

impl ClaimWrite {
    /// The claimant (`<worker id>/<uuid>`, or a ghost's), if the claim names one.
    pub fn claimant(&self) -> Option<&str> {
        self.holder.as_deref()?.split('|').next()
    }

    /// As saved in `claims.txt` (`<node> <job> <tick> <lease expiry or -> <holder or ->`);
    /// [`ClaimWrite::parse`] reads it back.
    pub fn line(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.node,
            self.job,
            self.tick,
            self.lease_expires
                .map_or("-".to_string(), |e| e.to_string()),
            self.holder.as_deref().unwrap_or("-")
        )
    }

    pub fn parse(line: &str) -> Result<ClaimWrite, String> {
        let fields: Vec<&str> = line.splitn(5, ' ').collect();
        let [node, job, tick, expires, holder] = fields[..] else {
            return Err(format!("claims entry with too few fields: {line:?}"));
        };
        let number = |text: &str| {
            text.parse::<i64>()
                .map_err(|_| format!("bad number {text:?} in {line:?}"))
        };
        Ok(ClaimWrite {
            node: node.parse().map_err(|_| format!("bad node in {line:?}"))?,
            job: job.to_string(),
            tick: number(tick)?,
            holder: (holder != "-").then(|| holder.to_string()),
            lease_expires: if expires == "-" {
                None
            } else {
                Some(number(expires)?)
            },
        })
    }
}

/// The worker index of a claimant `w<k>/<uuid>`; `None` for a ghost's.
pub fn worker_of(claimant: &str) -> Option<usize> {
    claimant.split('/').next()?.strip_prefix('w')?.parse().ok()
}

/// Every claim and lease write in node `node`'s AOF directory (the incremental files, in the manifest's
/// order). A tail cut short by a SIGKILL ends the reading.
pub fn read_aof(node: usize, dir: &Path) -> Vec<ClaimWrite> {
    read_files(node, dir, false)
}

/// What a Sentinel group confirmed, from the AOF directories `dirs` of its data nodes (their current
/// files and their history, see the module): every lease write, and every claim write that `copies`
/// data nodes hold (`min_replicas_acked + 1`: its master's and the replicas' that acknowledged it), each
/// once, as node 0's.
pub fn read_group(dirs: &[std::path::PathBuf], copies: usize) -> Vec<ClaimWrite> {
    let mut writes: Vec<ClaimWrite> = Vec::new();
    let mut holders: HashMap<String, (usize, BTreeSet<usize>)> = HashMap::new();
    for (data, dir) in dirs.iter().enumerate() {
        for write in read_files(0, dir, true) {
            let line = write.line();
            let (_, on) = holders.entry(line).or_insert_with(|| {
                writes.push(write);
                (writes.len() - 1, BTreeSet::new())
            });
            on.insert(data);
        }
    }
    let counted: BTreeSet<usize> = holders
        .values()
        .filter(|(index, on)| writes[*index].lease_expires.is_some() || on.len() >= copies)
        .map(|(index, _)| *index)
        .collect();
    writes
        .into_iter()
        .enumerate()
        .filter(|(index, _)| counted.contains(index))
        .map(|(_, write)| write)
        .collect()
}

/// The claim and lease writes of the incremental files of an AOF directory, in the manifest's order;
/// with `history`, also those of the incremental files it lists as history (kept by
/// `aof-disable-auto-gc`).
fn read_files(node: usize, dir: &Path, history: bool) -> Vec<ClaimWrite> {
    let manifest = std::fs::read_to_string(dir.join("appendonly.aof.manifest")).unwrap_or_default();
    let files: Vec<&str> = manifest
        .lines()
        .filter(|line| line.ends_with("type i") || history && line.ends_with("type h"))
        .filter_map(|line| line.split(' ').nth(1))
        .filter(|file| file.ends_with(".incr.aof"))
        .collect();
    let mut writes = Vec::new();
    for file in files {
        let bytes = std::fs::read(dir.join(file)).unwrap_or_default();
        for command in Commands(&bytes) {
            writes.extend(claim_or_lease_writes(node, &command));
        }
    }
    writes
}

/// The claim record a `SET key value` (with no expiry) on `node` writes, if `key` is one.
pub fn parse_set(node: usize, key: &str, value: &str) -> Option<ClaimWrite> {
    claim_or_lease(
        node,
        &["SET".to_string(), key.to_string(), value.to_string()],
    )
}

/// The lease write `SET key value PXAT expires_ms` on `node`, if `key` is a lease's.
pub fn parse_lease(node: usize, key: &str, value: &str, expires_ms: i64) -> Option<ClaimWrite> {
    claim_or_lease(
        node,
        &[
            "SET".to_string(),
            key.to_string(),
            value.to_string(),
            "PXAT".to_string(),
            expires_ms.to_string(),
        ],
    )
}

/// The claim and lease writes of one AOF command: a `SET`'s, or each pair's of an `MSET` — the claim
/// scripts write their batch's records and fence counters with one `MSET` at their end, which Redis
/// propagates as it is.
fn claim_or_lease_writes(node: usize, command: &[String]) -> Vec<ClaimWrite> {
    match command {
        [mset, pairs @ ..] if mset.eq_ignore_ascii_case("MSET") => pairs
            .chunks_exact(2)
            .filter_map(|pair| {
                claim_or_lease(node, &["SET".to_string(), pair[0].clone(), pair[1].clone()])
            })
            .collect(),
        _ => claim_or_lease(node, command).into_iter().collect(),
    }
}

/// The write `command` makes, if it is a claim record's or a lease's `SET`.
fn claim_or_lease(node: usize, command: &[String]) -> Option<ClaimWrite> {
    let [set, key, value, rest @ ..] = command else {
        return None;
    };
    if !set.eq_ignore_ascii_case("SET") {
        return None;
    }
    let (_, after) = key.split_once(":{")?;
    let (job, suffix) = after.split_once("}:")?;
    let job = job.to_string();
    if suffix == "claim" {
        let (tick, holder) = match value.split_once(' ') {
            Some((tick, holder)) => (tick, Some(holder.to_string())),
            None => (value.as_str(), None),
        };
        return Some(ClaimWrite {
            node,
            job,
            tick: tick.parse().ok()?,
            holder,
            lease_expires: None,
        });
    }
    if suffix != "lease" && !suffix.starts_with("lease:") {
        return None;
    }
    let expires = match rest {
        [unit, at, ..] if unit.eq_ignore_ascii_case("PXAT") => at.parse().ok()?,
        _ => return None,
    };
    Some(ClaimWrite {
        node,
        job,
        tick: value.split('|').nth(2)?.parse().ok()?,
        holder: Some(value.clone()),
        lease_expires: Some(expires),
    })
}

/// The commands of an AOF (RESP arrays of bulk strings), as text.
struct Commands<'a>(&'a [u8]);

impl Commands<'_> {
    fn line(&mut self) -> Option<&[u8]> {
        let end = self.0.windows(2).position(|w| w == b"\r\n")?;
        let (line, rest) = self.0.split_at(end);
        self.0 = &rest[2..];
        Some(line)
    }
}

impl Iterator for Commands<'_> {
    type Item = Vec<String>;

    fn next(&mut self) -> Option<Vec<String>> {
        loop {
            let header = self.line()?;
            // Annotations (`#TS:…`) and anything but an array are skipped.
            let Some(count) = header.strip_prefix(b"*") else {
                continue;
            };
            let count: usize = std::str::from_utf8(count).ok()?.parse().ok()?;
            let mut parts = Vec::with_capacity(count);
            for _ in 0..count {
                let length: usize = std::str::from_utf8(self.line()?.strip_prefix(b"$")?)
                    .ok()?
                    .parse()
                    .ok()?;
                let bytes = self.0.get(..length)?;
                parts.push(String::from_utf8_lossy(bytes).into_owned());
                self.0 = self.0.get(length + 2..)?;
            }
            return Some(parts);
        }
    }
}

/// Who confirmed each (job, tick), on which nodes; and who took its lease, where, until when.
#[derive(Debug, Default)]
pub struct Confirms {
    /// The nodes (or members) a majority is counted of.
    nodes: usize,
    by_tick: HashMap<(String, i64), BTreeMap<String, BTreeSet<usize>>>,
    leases: HashMap<(String, i64), Vec<LeaseTaken>>,
}

/// A lease taken on a node: `(claimant, node, expiry)`.
pub type LeaseTaken = (String, usize, i64);

impl Confirms {
    /// The claims of `writes`, on a cluster of `nodes`.
    pub fn new(writes: &[ClaimWrite], nodes: usize) -> Confirms {
        let mut confirms = Confirms {
            nodes,
            ..Confirms::default()
        };
        for write in writes {
            if let (Some(expires), Some(claimant)) = (write.lease_expires, write.claimant()) {
                confirms
                    .leases
                    .entry((write.job.clone(), write.tick))
                    .or_default()
                    .push((claimant.to_string(), write.node, expires));
            }
        }
        for write in writes.iter().filter(|w| w.lease_expires.is_none()) {
            if let Some(claimant) = write.claimant() {
                confirms
                    .by_tick
                    .entry((write.job.clone(), write.tick))
                    .or_default()
                    .entry(claimant.to_string())
                    .or_default()
                    .insert(write.node);
            }
        }
        confirms
    }

    /// The claimants of `(job, tick)` with their nodes.
    pub fn of(&self, job: &str, tick: i64) -> Vec<(&str, &BTreeSet<usize>)> {
        self.by_tick
            .get(&(job.to_string(), tick))
            .map(|claimants| claimants.iter().map(|(c, n)| (c.as_str(), n)).collect())
            .unwrap_or_default()
    }

    /// The leases taken for `(job, tick)`: `(claimant, node, expiry)`, in the nodes' order of writing.
    pub fn leases(&self, job: &str, tick: i64) -> &[LeaseTaken] {
        self.leases
            .get(&(job.to_string(), tick))
            .map_or(&[], Vec::as_slice)
    }

    /// The claimants that confirmed `(job, tick)` on a majority of the nodes: granted it.
    pub fn granted(&self, job: &str, tick: i64) -> Vec<&str> {
        self.of(job, tick)
            .into_iter()
            .filter(|(_, nodes)| nodes.len() > self.nodes / 2)
            .map(|(claimant, _)| claimant)
            .collect()
    }

    /// The nodes that confirmed `(job, tick)` for a claimant that is not one of `worker`'s: a node confirms
    /// one claimant per tick, so `worker` can never have them.
    pub fn taken_from(&self, job: &str, tick: i64, worker: usize) -> BTreeSet<usize> {
        self.of(job, tick)
            .into_iter()
            .filter(|(claimant, _)| worker_of(claimant) != Some(worker))
            .flat_map(|(_, nodes)| nodes.iter().copied())
            .collect()
    }

    /// Every (job, tick) confirmed on a majority for more than one claimant (what G1 forbids).
    pub fn double_grants(&self) -> Vec<(String, i64, Vec<String>)> {
        let mut found: Vec<(String, i64, Vec<String>)> = self
            .by_tick
            .iter()
            .filter_map(|((job, tick), claimants)| {
                let granted: Vec<String> = claimants
                    .iter()
                    .filter(|(_, nodes)| nodes.len() > self.nodes / 2)
                    .map(|(c, nodes)| format!("{c} on nodes {nodes:?}"))
                    .collect();
                (granted.len() > 1).then(|| (job.clone(), *tick, granted))
            })
            .collect();
        found.sort();
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A script's effects (a lease's SET, the claims' MSET) and a plain SET, as Redis 7 writes them, and a
    /// tail cut short.
    #[test]
    fn claim_writes_are_read_from_an_aof() {
        let dir = crate::support::TestDir::new();
        let aof = dir.path();
        std::fs::write(
            aof.join("appendonly.aof.manifest"),
            "file appendonly.aof.1.base.rdb seq 1 type b\nfile appendonly.aof.1.incr.aof seq 1 type i\n",
        )
        .expect("writable");
        let resp = |parts: &[&str]| {
            let mut out = format!("*{}\r\n", parts.len());
            for p in parts {
                out += &format!("${}\r\n{p}\r\n", p.len());
            }
            out
        };
        let mut text = resp(&["SELECT", "0"]) + &resp(&["MULTI"]);
        text += &resp(&[
            "SET",
            "redcron:{quick}:lease",
            "w1/a|1|5000|ff",
            "PXAT",
            "7000",
        ]);
        // The confirming script's one MSET: a fence counter, then claim records of two jobs.
        text += &resp(&[
            "MSET",
            "redcron:{quick}:fence",
            "5000000",
            "redcron:{quick}:claim",
            "5000 w1/a|1|5000|ff",
            "redcron:{parallel}:claim",
            "5000 w2/b|2|5000|ee",
        ]);
        text += &resp(&["EXEC"]);
        text += &resp(&["SET", "redcron:{long}:claim", "6000"]);
        text += "*3\r\n$3\r\nSET\r\n$5\r\nredc";
        std::fs::write(aof.join("appendonly.aof.1.incr.aof"), text).expect("writable");
        let writes = read_aof(2, aof);
        assert_eq!(writes.len(), 4, "{writes:?}");
        assert_eq!(writes[0].lease_expires, Some(7000));
        assert_eq!(writes[1].claimant(), Some("w1/a"));
        assert_eq!((writes[1].node, writes[1].tick), (2, 5000));
        assert_eq!(
            (writes[2].job.as_str(), writes[2].claimant()),
            ("parallel", Some("w2/b"))
        );
        assert_eq!((writes[3].job.as_str(), &writes[3].holder), ("long", &None));
        for write in &writes {
            assert_eq!(ClaimWrite::parse(&write.line()).as_ref(), Ok(write));
        }
        assert_eq!(worker_of("w1/a"), Some(1));
        assert_eq!(worker_of("ghost-3/b"), None);
    }

    /// A Sentinel group's claim counts once a replica's AOF holds it too — the master's copy and the
    /// replica's are one write — and a claim only one data node holds (a master cut off from its
    /// replicas) does not; a replica's history (an AOF rewritten by a full resynchronisation) is read,
    /// and every lease write is kept, once.
    #[test]
    fn a_group_counts_a_claim_a_replica_holds_too_and_once() {
        let dir = crate::support::TestDir::new();
        let resp = |parts: &[&str]| {
            let mut out = format!("*{}\r\n", parts.len());
            for p in parts {
                out += &format!("${}\r\n{p}\r\n", p.len());
            }
            out
        };
        let lease = resp(&[
            "SET",
            "redcron:{quick}:lease",
            "w1/a|1|5000|ff",
            "PXAT",
            "7000",
        ]);
        let counted = resp(&["SET", "redcron:{quick}:claim", "5000 w1/a|1|5000|ff"]);
        let alone = resp(&["SET", "redcron:{quick}:claim", "6000 w2/b|1|6000|ee"]);
        let aof = |name: &str, manifest: &str, files: &[(&str, String)]| {
            let at = dir.path().join(name);
            std::fs::create_dir(&at).expect("writable");
            std::fs::write(at.join("appendonly.aof.manifest"), manifest).expect("writable");
            for (file, text) in files {
                std::fs::write(at.join(file), text).expect("writable");
            }
            at
        };
        // The master: both claims; a replica that was resynchronised since: the counted one, in its
        // history; a replica that holds nothing.
        let master = aof(
            "master",
            "file appendonly.aof.1.base.rdb seq 1 type b\nfile appendonly.aof.1.incr.aof seq 1 type i\n",
            &[("appendonly.aof.1.incr.aof", lease.clone() + &counted + &alone)],
        );
        let resynced = aof(
            "resynced",
            "file appendonly.aof.1.incr.aof seq 1 type h\nfile appendonly.aof.2.base.rdb seq 2 type b\n\
             file appendonly.aof.2.incr.aof seq 2 type i\n",
            &[
                ("appendonly.aof.1.incr.aof", lease + &counted),
                ("appendonly.aof.2.incr.aof", String::new()),
            ],
        );
        let empty = aof("empty", "", &[]);
        let writes = read_group(&[master, resynced, empty], 2);
        assert_eq!(writes.len(), 2, "{writes:?}");
        assert_eq!(writes[0].lease_expires, Some(7000));
        assert_eq!((writes[1].tick, writes[1].claimant()), (5000, Some("w1/a")));
        assert!(writes.iter().all(|w| w.node == 0));
        let confirms = Confirms::new(&writes, 1);
        assert_eq!(confirms.granted("quick", 5000), ["w1/a"]);
        assert!(confirms.granted("quick", 6000).is_empty());
    }
}
