//! One Redis node of the model: its keys for the one job, and the scripts that run atomically on it.
//!
//! The scripts are `ACQUIRE`, `CONFIRM` and `RELEASE` of the first release (v1, commit 9edae72) and of
//! `src/store/redis/scripts.rs` (v2), written over small integers instead of strings so that the checker's
//! states stay small. Each script is one function that the model calls when a request is delivered, which
//! is exactly the atomicity Redis gives a Lua script.

/// Which protocol the scripts and the client follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    /// The first release's protocol: the claim key holds a plain tick number.
    V1,
    /// The protocol of `src/lock/`: the claim key holds the tick and the lease value that confirmed it.
    V2,
}

/// A lease value. In v1 a fresh one per attempt (`<worker>/<uuid>`; `id` is the attempt that made it, and
/// a split-vote leader keeps it for its next attempt). In v2 `<claimant>|<attempt>|<tick>|<fingerprint>`:
/// the claimant is the contender, `id` the attempt; tick and fingerprint follow from the contender.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value {
    pub contender: u8,
    pub id: u8,
}

/// A lease key's content: the value, and the holder's latest attempt when a `SET … PX ttl` last wrote it.
/// That attempt's deadline bounds the key's life: the node may drop the key only once it has passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Held {
    pub value: Value,
    pub set_by: u8,
}

/// The claim key: the highest tick confirmed on this node. `by` is the value that confirmed it; v2's
/// scripts read it, v1's do not (v1 stores a plain number; the model keeps `by` only so that the checker
/// can tell which contender a majority of claims belongs to).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Claim {
    pub tick: u8,
    pub by: Value,
}

/// A node's keys for the job: the lease keys (index 0: `overlap: skip`, one per job; 1 and 2: `overlap:
/// allow`, one per tick), the fence counter and the claim.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    pub leases: [Option<Held>; 3],
    pub fence: u8,
    pub claim: Option<Claim>,
}

/// A node's answer to `ACQUIRE`. The remaining TTL of `busy` is abstracted away (no clocks in the model).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Round1 {
    Ok { fence: u8 },
    Claimed,
    Busy { holder: Value },
}

/// A node's answer to `CONFIRM`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Round2 {
    Ok,
    Lost,
    Claimed,
}

/// What a script needs to know about the request beside the value: which lease key, which tick, and the
/// sender's latest attempt (for the life of a key it sets).
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub value: Value,
    pub attempt: u8,
    pub key: usize,
    pub tick: u8,
}

impl Node {
    /// `ACQUIRE`: take the lease unless the tick is claimed (v2: by another claimant) or another value
    /// (v2: another claimant) holds it; answer the fence counter.
    pub fn acquire(&mut self, version: Version, request: Request) -> Round1 {
        if self.claimed_against(version, request, true) {
            return Round1::Claimed;
        }
        if let Some(held) = self.leases[request.key] {
            let foreign = match version {
                Version::V1 => held.value != request.value,
                Version::V2 => held.value.contender != request.value.contender,
            };
            if foreign {
                return Round1::Busy { holder: held.value };
            }
        }
        self.leases[request.key] = Some(Held {
            value: request.value,
            set_by: request.attempt,
        });
        Round1::Ok { fence: self.fence }
    }

    /// `CONFIRM`: where our value still holds the lease, raise the fence to the token and claim the tick.
    pub fn confirm(&mut self, version: Version, request: Request, token: u8) -> Round2 {
        if self.leases[request.key].map(|held| held.value) != Some(request.value) {
            return Round2::Lost;
        }
        if self.claimed_against(version, request, false) {
            return Round2::Claimed;
        }
        self.fence = self.fence.max(token);
        self.claim = Some(Claim {
            tick: request.tick,
            by: request.value,
        });
        Round2::Ok
    }

    /// `RELEASE`: compare-and-delete of our value.
    pub fn release(&mut self, value: Value, key: usize) {
        if self.leases[key].map(|held| held.value) == Some(value) {
            self.leases[key] = None;
        }
    }

    /// Whether the claim refuses this request. v1's `ACQUIRE` refuses `claim >= T` and its `CONFIRM` only
    /// `claim > T`, so an equal claim passes `CONFIRM` whoever wrote it (finding 1). v2 refuses a later
    /// tick, or the same tick confirmed by another claimant, in both scripts.
    fn claimed_against(&self, version: Version, request: Request, acquire: bool) -> bool {
        let Some(claim) = self.claim else {
            return false;
        };
        match version {
            Version::V1 if acquire => claim.tick >= request.tick,
            Version::V1 => claim.tick > request.tick,
            Version::V2 => {
                claim.tick > request.tick
                    || (claim.tick == request.tick && claim.by.contender != request.value.contender)
            }
        }
    }
}
