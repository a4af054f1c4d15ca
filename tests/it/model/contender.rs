//! A contender of the model: one worker's chain of attempts at one (job, tick), and how it reads an attempt
//! that did not win.
//!
//! The reading follows `lost_in_round1` / `lost_in_round2` of `src/store/redis/claim.rs` for v1 and the
//! spec's "Classification when not won" for v2, reduced to what matters to the model: is the outcome
//! final, and if not, does the contender keep its keys (it leads a split vote) or undo them. Pauses
//! between attempts (`retry_delay`, jitter, the holder's remaining TTL) have no length here: a retry is an
//! action the checker may take at any time, or in the liveness check once the system is quiet.

use super::node::{Round1, Round2, Value, Version};

/// The job's `overlap` setting as one contender's worker reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Overlap {
    Skip,
    Allow,
}

/// What a contender wants: a tick (1 or 2) with an overlap, which decides its lease key, and how many
/// attempts it may make (the first and its retries; bounded, which keeps the state space finite).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Spec {
    pub tick: u8,
    pub overlap: Overlap,
    pub attempts: u8,
}

impl Spec {
    /// The index of the lease key: 0 is the job's one key (`skip`), 1 and 2 are the per-tick keys (`allow`).
    pub fn key(&self) -> usize {
        match self.overlap {
            Overlap::Skip => 0,
            Overlap::Allow => usize::from(self.tick),
        }
    }
}

/// Where a contender is. The answers of the round in progress are kept as a tally: which node said what
/// does not matter to the client, only how many said what (so the nodes stay interchangeable).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Round1(Tally1),
    Round2 {
        token: u8,
        tally: Tally2,
    },
    /// Lost an attempt that may be retried; `keep`: it led a split vote and kept its keys.
    Waiting {
        keep: bool,
    },
    Won {
        token: u8,
    },
    GaveUp,
    Crashed,
}

/// The answers to a round 1 so far: `ok` ones and the highest fence they carried, `claimed` ones, and the
/// holders named by `busy` ones (sorted, `None` first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tally1 {
    pub ok: u8,
    pub fence: u8,
    pub claimed: u8,
    pub busy: [Option<Value>; 3],
}

impl Tally1 {
    pub fn add(&mut self, answer: Round1) {
        match answer {
            Round1::Ok { fence } => {
                self.ok += 1;
                self.fence = self.fence.max(fence);
            }
            Round1::Claimed => self.claimed += 1,
            Round1::Busy { holder } => {
                self.busy[0] = Some(holder);
                self.busy.sort();
            }
        }
    }

    pub fn answered(&self) -> u8 {
        self.ok + self.claimed + self.busy.iter().flatten().count() as u8
    }
}

/// The answers to a round 2 so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tally2 {
    pub ok: u8,
    pub lost: u8,
    pub claimed: u8,
}

impl Tally2 {
    pub fn add(&mut self, answer: Round2) {
        match answer {
            Round2::Ok => self.ok += 1,
            Round2::Lost => self.lost += 1,
            Round2::Claimed => self.claimed += 1,
        }
    }

    pub fn answered(&self) -> u8 {
        self.ok + self.lost + self.claimed
    }
}

/// Attempts per contender at most (the state keeps what each attempt sent).
pub const MAX_ATTEMPTS: usize = 3;

/// One contender's state. Attempts count from 0; `expired` attempts (0 .. expired) have passed their
/// deadline, so their lease keys may be dropped by the nodes and they can never be granted. `ids` and
/// `tokens` are what each attempt's requests carry (the value's id, the token of its round 2), so that a
/// request still in flight from an earlier attempt stays what it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Contender {
    pub index: u8,
    pub phase: Phase,
    pub attempt: u8,
    pub expired: u8,
    pub ids: [u8; MAX_ATTEMPTS],
    pub tokens: [u8; MAX_ATTEMPTS],
}

impl Contender {
    /// A contender that has just sent round 1 of its first attempt.
    pub fn new(index: u8) -> Contender {
        Contender {
            index,
            phase: Phase::Round1(Tally1::default()),
            attempt: 0,
            expired: 0,
            ids: [0; MAX_ATTEMPTS],
            tokens: [0; MAX_ATTEMPTS],
        }
    }

    /// The lease value of an attempt.
    pub fn value(&self, attempt: u8) -> Value {
        Value {
            contender: self.index,
            id: self.ids[usize::from(attempt)],
        }
    }

    /// Whether the current attempt's deadline has passed.
    pub fn expired(&self) -> bool {
        self.expired > self.attempt
    }

    /// In a round, waiting for answers.
    pub fn in_round(&self) -> bool {
        matches!(self.phase, Phase::Round1(_) | Phase::Round2 { .. })
    }

    /// Still trying or won: neither crashed nor given up.
    pub fn alive(&self) -> bool {
        !matches!(self.phase, Phase::Crashed | Phase::GaveUp)
    }
}

/// How a lost attempt ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// AlreadyClaimed, Busy (final) or NoQuorum (v1): no further attempt.
    Final,
    /// Another attempt may change it; `keep`: lead of a split vote, keep the keys.
    Retry { keep: bool },
}

/// The reading of a round 1 without a usable majority of `ok`. `tick_of` tells a holder's tick (v2 reads
/// it from the holder's value).
pub fn round1_verdict(
    version: Version,
    ours: Value,
    tick: u8,
    tally: &Tally1,
    tick_of: impl Fn(Value) -> u8,
) -> Verdict {
    let claimed = usize::from(tally.claimed);
    let granted = usize::from(tally.ok);
    let mut holders: Vec<(Value, usize)> = Vec::new();
    for holder in tally.busy.iter().flatten() {
        match holders.iter_mut().find(|(value, _)| value == holder) {
            Some((_, count)) => *count += 1,
            None => holders.push((*holder, 1)),
        }
    }
    let busy: usize = holders.iter().map(|(_, count)| count).sum();
    let top = holders.iter().map(|(_, count)| *count).max();
    // Leads a split vote: more nodes than every other holder, ties to the smallest value.
    let leads = holders
        .iter()
        .all(|(holder, count)| granted > *count || (granted == *count && ours < *holder));
    match version {
        Version::V1 => {
            if claimed > 0 && claimed + busy >= 2 {
                return Verdict::Final; // AlreadyClaimed: "claimed + busy >= majority" (finding 4).
            }
            match top {
                Some(top) if top + claimed >= 2 => Verdict::Retry { keep: false }, // Busy, look again.
                Some(_) => Verdict::Retry { keep: leads },                         // split vote
                None => Verdict::Final, // AlreadyClaimed (claimed > 0) or NoQuorum, both final in v1.
            }
        }
        Version::V2 => {
            if claimed >= 2 {
                return Verdict::Final; // AlreadyClaimed: a majority can no longer be reached.
            }
            if holders.iter().any(|(holder, _)| tick_of(*holder) != tick) {
                return Verdict::Final; // Busy: the previous run still holds the job.
            }
            match top {
                Some(top) if top >= 2 => Verdict::Retry { keep: false }, // Contended.
                Some(_) => Verdict::Retry { keep: leads },               // split vote
                None => Verdict::Retry { keep: false },                  // NoQuorum, retried.
            }
        }
    }
}

/// The reading of a round 2 without a majority of `ok` before the deadline.
pub fn round2_verdict(version: Version, tally: &Tally2) -> Verdict {
    let claimed = tally.claimed;
    let final_ = match version {
        Version::V1 => claimed > 0,  // any `claimed` is AlreadyClaimed.
        Version::V2 => claimed >= 2, // fewer are leftovers of attempts that may never win.
    };
    if final_ {
        Verdict::Final
    } else {
        Verdict::Retry { keep: false }
    }
}
