//! The claim protocol as a `stateright` model: 3 nodes, 2–3 contenders for one job, every request a
//! message in flight.
//!
//! A state is the nodes' keys, the contenders, the requests in flight and the grants so far, in grant
//! order. An action is one step of one party: a node runs a script on a request (atomically, as Redis runs
//! Lua) and the contender reads the answer or not; a contender gives up on a round (timeout), retries or
//! crashes; a node restarts empty. Requests are delivered in any order, or never.
//!
//! Time has no value in the model. What the spec derives from time is kept as an order of events: a
//! node drops a lease key only after the deadline of the attempt that set it has passed, and an attempt
//! whose deadline has passed is never granted. Expiry is taken when it can be seen: a script that reads a
//! lease key may first find it expired, and the holder's deadline passes at that moment (if it had not).
//! A deadline that passes unseen changes nothing but the holder's own decision, which an answer read
//! "late" covers.

use stateright::{Model, Property, Representative};

pub use super::config::Config;
use super::contender::{Contender, Phase};
use super::network::{Kind, Msg, Network, MAX_CONTENDERS};
use super::node::Node;
use super::properties;
pub use super::properties::{
    AT_MOST_ONCE, EVENTUALLY_GRANTED, LATER_TICKS_ONLY, TOKENS_RISE, TOKENS_RISE_ACROSS_KEYS,
};

/// A grant: a contender's round 2 reached a majority before its deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Grant {
    pub contender: u8,
    pub tick: u8,
    pub key: u8,
    pub token: u8,
}

/// The whole system. Contenders beyond the configured ones stay idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct State {
    pub nodes: [Node; 3],
    pub contenders: [Contender; MAX_CONTENDERS],
    pub network: Network,
    /// In grant order.
    pub grants: [Option<Grant>; MAX_CONTENDERS],
    pub restarted: bool,
}

impl State {
    pub fn grants(&self) -> impl Iterator<Item = Grant> + Clone + '_ {
        self.grants.iter().flatten().copied()
    }
}

/// What becomes of a node's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// The contender reads it (if it still waits for it).
    Read,
    /// It is lost; the contender's timeout ends the round.
    Lost,
    /// The contender reads it after its deadline passed, so it cannot go on with it.
    Late,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The node runs the request's script. `expire`: first, the deadline of the lease key's holder passes
    /// and the node drops the key.
    Deliver {
        msg: Msg,
        expire: bool,
        answer: Answer,
    },
    Timeout(u8),
    Retry(u8),
    Crash(u8),
    Restart(u8),
}

/// The model: a configuration; the states are built by [`Model::init_states`] and [`Model::next_state`].
pub struct Protocol {
    pub config: Config,
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let mut state = State {
            nodes: Default::default(),
            contenders: [0, 1, 2].map(Contender::new),
            network: Network::default(),
            grants: [None; MAX_CONTENDERS],
            restarted: false,
        };
        for c in 0..MAX_CONTENDERS as u8 {
            if self.contenders().any(|configured| configured == c) {
                state.network.broadcast(c, 0, Kind::Acquire);
            } else {
                state.contenders[usize::from(c)].phase = Phase::GaveUp;
            }
        }
        vec![state]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let config = &self.config;
        for msg in state.network.iter() {
            let expire: &[bool] = match (self.must_expire(state, msg), self.may_expire(state, msg))
            {
                (true, _) => &[true],
                (false, true) => &[false, true],
                (false, false) => &[false],
            };
            let awaited = Self::awaited(state, msg);
            for &expire in expire {
                actions.push(Action::Deliver {
                    msg,
                    expire,
                    answer: Answer::Read,
                });
                if awaited && config.loss {
                    actions.push(Action::Deliver {
                        msg,
                        expire,
                        answer: Answer::Lost,
                    });
                }
                // Read late: with loss on, an answer lost and a timeout do the same to the nodes.
                let live = !state.contenders[usize::from(msg.contender)].expired();
                let late = config.timeouts && !config.loss && live;
                if awaited && late && self.decisive(state, msg) {
                    actions.push(Action::Deliver {
                        msg,
                        expire,
                        answer: Answer::Late,
                    });
                }
            }
        }
        let alive = self
            .contenders()
            .filter(|c| state.contenders[usize::from(*c)].alive());
        let alive = alive.count();
        for c in self.contenders() {
            let contender = &state.contenders[usize::from(c)];
            // A round with no answer left to come can only end by a timeout, also without slowness.
            let due = Self::due(state, c);
            if contender.in_round() && (config.timeouts || !due) {
                actions.push(Action::Timeout(c));
            }
            let waiting = matches!(contender.phase, Phase::Waiting { .. });
            if waiting && (!config.fair || state.network.is_empty()) {
                actions.push(Action::Retry(c));
            }
            let last = alive <= 1;
            let crashable = contender.in_round() || waiting;
            if config.crashes && crashable && !(config.fair && last) {
                actions.push(Action::Crash(c));
            }
        }
        if config.empty_restart && !state.restarted {
            actions.extend((0..3).map(Action::Restart));
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = *last;
        match action {
            Action::Deliver {
                msg,
                expire,
                answer,
            } => self.deliver(&mut state, msg, expire, answer),
            Action::Timeout(c) => self.decide(&mut state, c, true),
            Action::Retry(c) => match state.contenders[usize::from(c)].phase {
                Phase::Waiting { keep } => self.retry(&mut state, c, keep),
                _ => unreachable!("only a waiting contender retries"),
            },
            Action::Crash(c) => {
                let contender = &mut state.contenders[usize::from(c)];
                contender.phase = Phase::Crashed;
                contender.expired = contender.attempt + 1;
            }
            Action::Restart(node) => {
                state.nodes[usize::from(node)] = Node::default();
                state.restarted = true;
            }
        }
        self.normalize(&mut state);
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all(self)
    }
}

/// The nodes are interchangeable: a state with its nodes renumbered behaves the same, so the checker
/// needs to explore only one renumbering: nodes sorted by their keys and the requests in flight to them.
/// (Contenders keep only counts of answers, never which node gave them, so that renumbering touches only
/// nodes and requests.)
impl Representative for State {
    fn representative(&self) -> State {
        let key = |n: usize| (self.nodes[n], self.network.of_node(n as u8));
        let mut by_key = [0, 1, 2];
        by_key.sort_by_key(|n| key(*n));
        let mut order = [0; 3];
        let mut state = *self;
        for (new, old) in by_key.into_iter().enumerate() {
            order[old] = new as u8;
            state.nodes[new] = self.nodes[old];
        }
        state.network = self.network.renumber(order);
        state
    }
}
