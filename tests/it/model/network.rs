//! The requests in flight, as a set of bits, and the renumbering of nodes for symmetry reduction.
//!
//! A request is named by who sent it (contender, attempt), what it is (ACQUIRE, CONFIRM, RELEASE) and
//! where it goes (node); what it carries (value, token) is kept by the contender per attempt. So the
//! network is a 81-bit set, and a state is a small `Copy` value that hashes fast: the checker runs in a
//! debug build, where that is what decides whether a check takes seconds or minutes.

use super::contender::MAX_ATTEMPTS;

/// Contenders at most.
pub const MAX_CONTENDERS: usize = 3;

/// Which script a request runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Acquire,
    Confirm,
    Release,
}

const KINDS: [Kind; 3] = [Kind::Acquire, Kind::Confirm, Kind::Release];

/// A request in flight to `node` from `contender`'s `attempt`. Replies are not messages of their own: a
/// contender reads a node's answer when the node runs the script, or never (the answer was lost or came
/// after the contender stopped waiting, which its timeout covers); see `docs/model.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Msg {
    pub contender: u8,
    pub attempt: u8,
    pub kind: Kind,
    pub node: u8,
}

impl Msg {
    /// The group of three bits (one per node) of this request's sender and kind.
    fn group(contender: u8, attempt: u8, kind: Kind) -> usize {
        (usize::from(contender) * MAX_ATTEMPTS + usize::from(attempt)) * 3 + kind as usize
    }

    fn bit(&self) -> u128 {
        1 << (Msg::group(self.contender, self.attempt, self.kind) * 3 + usize::from(self.node))
    }
}

/// The set of requests in flight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Network(u128);

impl Network {
    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }

    /// Whether a request of `kind` from `contender`'s `attempt` is in flight to any node.
    pub fn has(&self, contender: u8, attempt: u8, kind: Kind) -> bool {
        (self.0 >> (Msg::group(contender, attempt, kind) * 3)) & 0b111 != 0
    }

    pub fn remove(&mut self, msg: Msg) {
        self.0 &= !msg.bit();
    }

    /// Sends a request of `kind` from `contender`'s `attempt` to every node.
    pub fn broadcast(&mut self, contender: u8, attempt: u8, kind: Kind) {
        self.0 |= 0b111 << (Msg::group(contender, attempt, kind) * 3);
    }

    /// The requests in flight, in a fixed order.
    pub fn iter(&self) -> impl Iterator<Item = Msg> {
        let mut bits = self.0;
        std::iter::from_fn(move || {
            if bits == 0 {
                return None;
            }
            let at = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let (group, node) = (at / 3, at % 3);
            let (sender, kind) = (group / 3, KINDS[group % 3]);
            Some(Msg {
                contender: (sender / MAX_ATTEMPTS) as u8,
                attempt: (sender % MAX_ATTEMPTS) as u8,
                kind,
                node: node as u8,
            })
        })
    }

    /// The requests to `node`, as bits in node 0's places.
    pub fn of_node(&self, node: u8) -> u128 {
        (self.0 >> node) & NODE_0
    }

    /// The same set with node `old` renamed `order[old]`.
    pub fn renumber(&self, order: [u8; 3]) -> Network {
        let mut renamed = 0;
        for (old, new) in order.iter().enumerate() {
            renamed |= self.of_node(old as u8) << new;
        }
        Network(renamed)
    }
}

/// The bits of node 0 in every group.
const NODE_0: u128 = {
    let mut mask = 0;
    let mut group = 0;
    while group < MAX_CONTENDERS * MAX_ATTEMPTS * 3 {
        mask |= 1 << (group * 3);
        group += 1;
    }
    mask
};
