//! The configurations of the model: which protocol, which contenders, which faults, and the
//! liveness configuration with the restrictions that make an `eventually` property decidable.

use super::contender::Spec;
use super::node::Version;

/// One configuration of the model: which protocol, which contenders, which faults.
#[derive(Clone, Debug)]
pub struct Config {
    pub version: Version,
    pub contenders: Vec<Spec>,
    /// A node's answer may be lost after its script ran. (A request may always stay in flight for ever,
    /// which is what its loss means to everyone else.)
    pub loss: bool,
    /// A contender may end a round before all answers are in (node_timeout, the deadline).
    pub timeouts: bool,
    /// A contender may crash in a round or between attempts; its requests in flight still land. With
    /// `loss` on, a crash adds nothing at the nodes (it is every later answer lost, and no further
    /// step); it matters to liveness, where "one stays alive" is the premise.
    pub crashes: bool,
    /// One node may restart empty (once): the persistence assumption broken. A restart *with*
    /// persistence is no action of its own: the node keeps its keys, and the requests and answers it
    /// loses meanwhile are what delay and loss already are.
    pub empty_restart: bool,
    /// Tokens start at tick × 10 (redcron: tick_ms × 1000); without it, at the highest fence + 1.
    pub token_floor: bool,
    /// The liveness configuration; see [`Config::live`].
    pub fair: bool,
}

impl Config {
    /// Everything may happen: loss, early timeouts, crashes at any point (a node restart with persistence
    /// is covered by delay and loss).
    pub fn faulty(version: Version, contenders: Vec<Spec>) -> Config {
        Config {
            version,
            contenders,
            loss: true,
            timeouts: true,
            crashes: true,
            empty_restart: false,
            token_floor: true,
            fair: false,
        }
    }

    /// The liveness configuration: what the promise assumes, and what a model checker needs to decide it.
    ///
    /// - No message loss, no early timeout, all nodes up, and a contender's deadline
    ///   does not pass during its own rounds (rounds are short against the TTL): the spec's premise.
    /// - Crashes at any point, except of the last contender that is still trying: "one stays alive".
    /// - A retry starts only when the system is quiet: no request in flight. This stands for the random
    ///   jitter between contenders: without it, an adversary can schedule every retry against another
    ///   one's and make a bounded number of retries run out (a split vote livelocks only with
    ///   probability zero, which no exhaustive checker can express).
    /// - v2 only: a retry finds the keys of holders whose deadline has passed gone, since a v2 contender
    ///   that sees the same holder again waits out its remaining TTL. v1's retries do not wait for it.
    ///
    /// With that, every path ends (messages are finite, attempts bounded), and `stateright` checks an
    /// `eventually` property in the states where no action is left, which is what the promise is about.
    pub fn live(version: Version, contenders: Vec<Spec>) -> Config {
        Config {
            loss: false,
            timeouts: false,
            fair: true,
            ..Config::faulty(version, contenders)
        }
    }
}
