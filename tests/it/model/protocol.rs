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

use super::contender::{
    round1_verdict, round2_verdict, Contender, Phase, Spec, Tally1, Verdict,
};
use super::network::{Kind, Msg, Network, MAX_CONTENDERS, ORDERS};
use super::node::{Node, Request, Round1, Value, Version};

/// Safety: no two grants of one (job, tick). G1 of the spec.
pub const AT_MOST_ONCE: &str = "at most one grant per (job, tick)";
/// G1': once tick T is granted, no tick <= T is granted afterwards.
pub const LATER_TICKS_ONLY: &str = "a granted tick excludes later grants of ticks <= it";
/// G2: among grants that share a lease key (`overlap: skip`), tokens rise in grant order.
///
/// Only promised on one key: its proof is the lease. A later holder of the same key can take it on a
/// majority only after the earlier holder's lease is gone there, so its round 1 reads the fences that
/// the earlier grant raised. Holders of different keys (`allow`, or a rollout mixing skip and allow) do
/// not exclude each other: both may read the same fences and pick the same token. Across keys, only the
/// token floor (tick × 1000 in redcron, tick × 10 here) orders them; see [`TOKENS_RISE_ACROSS_KEYS`].
pub const TOKENS_RISE: &str = "tokens rise in grant order on one lease key";
/// G2 stretched over all lease keys: not promised by the spec, checked to show why.
pub const TOKENS_RISE_ACROSS_KEYS: &str = "tokens rise in grant order across lease keys";
/// Liveness: the tick is granted, to a live contender or by a majority of one contender's confirms.
pub const EVENTUALLY_GRANTED: &str = "the tick is eventually granted";

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
    pub crashes: bool,
    /// One node may restart empty (once): the persistence assumption broken. A restart *with*
    /// persistence is no action of its own: the node keeps its keys, and the requests and answers it
    /// loses meanwhile are what delay and loss already are.
    pub empty_restart: bool,
    /// Faults at most in one run: answers lost or read late, timeouts while an answer is still due,
    /// crashes. Bounding them (not their kinds) keeps an exhaustive check within seconds.
    pub faults: u8,
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
            faults: 2,
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
        let contenders_len = contenders.len() as u8;
        Config {
            loss: false,
            timeouts: false,
            faults: contenders_len,
            fair: true,
            ..Config::faulty(version, contenders)
        }
    }
}

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
    /// Faults so far; see [`Config::faults`].
    pub faults: u8,
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

impl Protocol {
    pub fn spec(&self, contender: u8) -> Spec {
        self.config.contenders[usize::from(contender)]
    }

    /// The configured contenders' indices.
    fn contenders(&self) -> impl Iterator<Item = u8> {
        0..self.config.contenders.len() as u8
    }

    /// The script's view of a request: value, lease key, tick, and the sender's latest attempt.
    ///
    /// A key SET at instant t lives until t + ttl on the node's clock, so past the deadline of every
    /// attempt that had started by t, also when the request is a late one from an earlier attempt: the
    /// key's life is bounded by the sender's *latest* attempt, not by the one that sent it.
    pub fn request(&self, state: &State, msg: Msg) -> Request {
        let spec = self.spec(msg.contender);
        let contender = &state.contenders[usize::from(msg.contender)];
        Request {
            value: contender.value(msg.attempt),
            attempt: contender.attempt,
            key: spec.key(),
            tick: spec.tick,
        }
    }

    /// Whether the contender of `msg` waits for its answer: the request belongs to its current round.
    fn awaited(state: &State, msg: Msg) -> bool {
        let contender = &state.contenders[usize::from(msg.contender)];
        contender.attempt == msg.attempt
            && matches!(
                (msg.kind, contender.phase),
                (Kind::Acquire, Phase::Round1(_)) | (Kind::Confirm, Phase::Round2 { .. })
            )
    }

    /// Whether an answer to contender `c`'s round may still come: a request of it is in flight.
    fn due(state: &State, c: u8) -> bool {
        let contender = &state.contenders[usize::from(c)];
        match contender.phase {
            Phase::Round1(_) => state.network.has(c, contender.attempt, Kind::Acquire),
            Phase::Round2 { .. } => state.network.has(c, contender.attempt, Kind::Confirm),
            _ => false,
        }
    }

    /// Whether the node may find the lease key that `msg` reads expired: the holder's deadline has
    /// passed, or may pass now (in the liveness configuration, not during the holder's own round).
    fn may_expire(&self, state: &State, msg: Msg) -> bool {
        let key = self.spec(msg.contender).key();
        let Some(held) = state.nodes[usize::from(msg.node)].leases[key] else {
            return false;
        };
        let holder = &state.contenders[usize::from(held.value.contender)];
        let passed = held.set_by < holder.expired;
        let in_round = holder.attempt == held.set_by && holder.in_round();
        msg.kind != Kind::Release && (passed || !(self.config.fair && in_round))
    }

    /// Whether the key must be found expired: in the liveness configuration, a v2 retry waits out the
    /// remaining TTL of a holder whose deadline has passed.
    fn must_expire(&self, state: &State, msg: Msg) -> bool {
        let key = self.spec(msg.contender).key();
        let Some(held) = state.nodes[usize::from(msg.node)].leases[key] else {
            return false;
        };
        let holder = &state.contenders[usize::from(held.value.contender)];
        self.config.fair
            && self.config.version == Version::V2
            && msg.kind == Kind::Acquire
            && msg.attempt > 0
            && held.set_by < holder.expired
    }

    /// Whether reading this answer decides a round in the contender's favour (its second `ok`), where
    /// reading it late makes a difference.
    fn decisive(&self, state: &State, msg: Msg) -> bool {
        let mut node = state.nodes[usize::from(msg.node)];
        let request = self.request(state, msg);
        let contender = &state.contenders[usize::from(msg.contender)];
        match contender.phase {
            Phase::Round1(tally) => {
                let answer = node.acquire(self.config.version, request);
                tally.ok == 1 && matches!(answer, Round1::Ok { .. })
            }
            Phase::Round2 { tally, .. } => {
                let token = contender.tokens[usize::from(msg.attempt)];
                let answer = node.confirm(self.config.version, request, token);
                tally.ok == 1 && answer == super::node::Round2::Ok
            }
            _ => false,
        }
    }

    /// The deadline of contender `c`'s `attempt` (and so of every earlier one) has passed.
    fn deadline_passes(state: &mut State, c: u8, attempt: u8) {
        let contender = &mut state.contenders[usize::from(c)];
        contender.expired = contender.expired.max(attempt + 1);
    }

    fn deliver(&self, state: &mut State, msg: Msg, expire: bool, answer: Answer) {
        state.network.remove(msg);
        let key = self.spec(msg.contender).key();
        let n = usize::from(msg.node);
        if expire {
            if let Some(held) = state.nodes[n].leases[key].take() {
                Self::deadline_passes(state, held.value.contender, held.set_by);
            }
        }
        if answer == Answer::Late {
            Self::deadline_passes(state, msg.contender, msg.attempt);
        }
        let read = answer != Answer::Lost && Self::awaited(state, msg);
        let version = self.config.version;
        let request = self.request(state, msg);
        let contender = &mut state.contenders[usize::from(msg.contender)];
        let node = &mut state.nodes[n];
        match (msg.kind, &mut contender.phase) {
            (Kind::Acquire, Phase::Round1(tally)) if read => tally.add(node.acquire(version, request)),
            (Kind::Confirm, Phase::Round2 { tally, token }) if read => {
                tally.add(node.confirm(version, request, *token))
            }
            (Kind::Acquire, _) => {
                node.acquire(version, request);
            }
            (Kind::Confirm, _) => {
                node.confirm(version, request, contender.tokens[usize::from(msg.attempt)]);
            }
            (Kind::Release, _) => node.release(request.value, key),
        }
        if read {
            self.decide(state, msg.contender, false);
        }
    }

    /// Ends contender `c`'s round if its outcome is known (a majority agreed, or can no longer agree),
    /// or at once if `give_up` (a timeout).
    fn decide(&self, state: &mut State, c: u8, give_up: bool) {
        let spec = self.spec(c);
        let contender = state.contenders[usize::from(c)];
        let attempt = contender.attempt;
        let decided = |answered: u8, ok: u8| ok >= 2 || answered - ok >= 2 || answered == 3 || give_up;
        match contender.phase {
            Phase::Round1(tally) => {
                if tally.ok >= 2 && !contender.expired() {
                    let floor = if self.config.token_floor { spec.tick * 10 } else { 0 };
                    let token = (tally.fence + 1).max(floor);
                    let contender = &mut state.contenders[usize::from(c)];
                    contender.tokens[usize::from(attempt)] = token;
                    contender.phase = Phase::Round2 {
                        token,
                        tally: Default::default(),
                    };
                    state.network.broadcast(c, attempt, Kind::Confirm);
                } else if decided(tally.answered(), tally.ok) {
                    let tick_of = |value: Value| self.spec(value.contender).tick;
                    let ours = contender.value(attempt);
                    let verdict = round1_verdict(self.config.version, ours, spec.tick, &tally, tick_of);
                    self.lose(state, c, verdict);
                }
            }
            Phase::Round2 { token, tally } => {
                if tally.ok >= 2 && !contender.expired() {
                    state.contenders[usize::from(c)].phase = Phase::Won { token };
                    let slot = state.grants.iter().position(Option::is_none);
                    state.grants[slot.expect("one grant per contender at most")] = Some(Grant {
                        contender: c,
                        tick: spec.tick,
                        key: spec.key() as u8,
                        token,
                    });
                } else if decided(tally.answered(), tally.ok) {
                    self.lose(state, c, round2_verdict(self.config.version, &tally));
                }
            }
            _ => unreachable!("only a contender in a round decides"),
        }
    }

    /// An attempt that did not win: wait for a retry, or give up; undo its lease unless it keeps it.
    fn lose(&self, state: &mut State, c: u8, verdict: Verdict) {
        let contender = &mut state.contenders[usize::from(c)];
        let last = contender.attempt + 1 >= self.spec(c).attempts;
        let keep = match verdict {
            Verdict::Retry { keep } if !last => {
                contender.phase = Phase::Waiting { keep };
                keep
            }
            _ => {
                contender.phase = Phase::GaveUp;
                false
            }
        };
        // The undo. Outside the liveness configuration, a node may find any lease key expired when a
        // script reads it, so an undo adds no behaviour there (a lost attempt is never granted), only
        // states; it is sent only where expiry is restricted.
        if !keep && self.config.fair {
            state.network.broadcast(c, contender.attempt, Kind::Release);
        }
    }

    /// Starts contender `c`'s next attempt: a fresh value (v1, unless it kept its keys) or the same
    /// claimant with the next attempt number (v2).
    fn retry(&self, state: &mut State, c: u8, keep: bool) {
        let contender = &mut state.contenders[usize::from(c)];
        let previous = contender.ids[usize::from(contender.attempt)];
        contender.attempt += 1;
        let attempt = contender.attempt;
        contender.ids[usize::from(attempt)] = if keep && self.config.version == Version::V1 {
            previous
        } else {
            attempt
        };
        contender.phase = Phase::Round1(Tally1::default());
        state.network.broadcast(c, attempt, Kind::Acquire);
    }

    /// Forgets what no step can read any more, so that states that differ only there are one state: the
    /// value and token of an attempt with no request in flight (unless current), and whether the deadline
    /// passed of an attempt that is not in a round, set no key and has no ACQUIRE in flight.
    fn normalize(&self, state: &mut State) {
        for c in self.contenders() {
            let index = usize::from(c);
            let in_flight = |attempt: u8, kinds: &[Kind]| {
                kinds.iter().any(|kind| state.network.has(c, attempt, *kind))
            };
            let contender = state.contenders[index];
            let mut normal = contender;
            for attempt in 0..self.spec(c).attempts {
                let all = [Kind::Acquire, Kind::Confirm, Kind::Release];
                if attempt != contender.attempt && !in_flight(attempt, &all) {
                    normal.ids[usize::from(attempt)] = 0;
                    normal.tokens[usize::from(attempt)] = 0;
                }
            }
            let holds = |attempt: u8| {
                let keys = state.nodes.iter().flat_map(|n| n.leases.iter().flatten());
                keys.clone().any(|held| held.value.contender == c && held.set_by == attempt)
            };
            while normal.expired <= contender.attempt {
                let at = normal.expired;
                let in_round = at == contender.attempt && contender.in_round();
                if in_round || holds(at) || in_flight(at, &[Kind::Acquire]) {
                    break;
                }
                normal.expired += 1;
            }
            state.contenders[index] = normal;
        }
    }

    /// Whether a majority of nodes hold the claim of one contender (v2: one claimant; v1: one value) for
    /// its tick: the tick is taken for good, granted even if that contender crashed before it knew.
    pub fn committed(&self, state: &State) -> bool {
        let claims = state.nodes.iter().filter_map(|n| n.claim);
        claims.clone().any(|claim| {
            let same = |other: Value| match self.config.version {
                Version::V1 => other == claim.by,
                Version::V2 => other.contender == claim.by.contender,
            };
            let count = claims.clone().filter(|c| c.tick == claim.tick && same(c.by)).count();
            count >= 2
        })
    }
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
            faults: 0,
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
        let fault = state.faults < config.faults;
        for msg in state.network.iter() {
            let expire: &[bool] = match (self.must_expire(state, msg), self.may_expire(state, msg)) {
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
                if awaited && config.loss && fault {
                    actions.push(Action::Deliver {
                        msg,
                        expire,
                        answer: Answer::Lost,
                    });
                }
                // Read late: with loss on, an answer lost and a timeout do the same to the nodes.
                let live = !state.contenders[usize::from(msg.contender)].expired();
                let late = config.timeouts && !config.loss && live && fault;
                if awaited && late && self.decisive(state, msg) {
                    actions.push(Action::Deliver {
                        msg,
                        expire,
                        answer: Answer::Late,
                    });
                }
            }
        }
        let alive = self.contenders().filter(|c| state.contenders[usize::from(*c)].alive());
        let alive = alive.count();
        for c in self.contenders() {
            let contender = &state.contenders[usize::from(c)];
            // A round with no answer left to come can only end by a timeout, which is no fault.
            let due = Self::due(state, c);
            if contender.in_round() && ((config.timeouts && fault) || !due) {
                actions.push(Action::Timeout(c));
            }
            let waiting = matches!(contender.phase, Phase::Waiting { .. });
            if waiting && (!config.fair || state.network.is_empty()) {
                actions.push(Action::Retry(c));
            }
            let last = alive <= 1;
            let crashable = contender.in_round() || waiting;
            if config.crashes && fault && crashable && !(config.fair && last) {
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
            } => {
                state.faults += u8::from(answer != Answer::Read);
                self.deliver(&mut state, msg, expire, answer)
            }
            Action::Timeout(c) => {
                state.faults += u8::from(Self::due(last, c));
                self.decide(&mut state, c, true)
            }
            Action::Retry(c) => match state.contenders[usize::from(c)].phase {
                Phase::Waiting { keep } => self.retry(&mut state, c, keep),
                _ => unreachable!("only a waiting contender retries"),
            },
            Action::Crash(c) => {
                state.faults += 1;
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
        let mut properties = vec![
            Property::always(AT_MOST_ONCE, |_, s: &State| {
                let ticks = s.grants().map(|g| g.tick);
                let mut seen = ticks.clone().collect::<Vec<_>>();
                seen.sort();
                seen.dedup();
                seen.len() == ticks.count()
            }),
            Property::always(LATER_TICKS_ONLY, |_, s: &State| is_rising(s, None, |g| g.tick)),
            Property::always(TOKENS_RISE, |_, s: &State| {
                (0..3).all(|key| is_rising(s, Some(key), |g| g.token))
            }),
            Property::always(TOKENS_RISE_ACROSS_KEYS, |_, s: &State| {
                is_rising(s, None, |g| g.token)
            }),
        ];
        if self.config.fair {
            properties.push(Property::eventually(EVENTUALLY_GRANTED, |m: &Protocol, s| {
                s.grants[0].is_some() || m.committed(s)
            }));
        }
        properties
    }
}

/// Whether `field` strictly rises along the grants (on one lease key, or all), each against every later.
fn is_rising(state: &State, key: Option<u8>, field: impl Fn(&Grant) -> u8) -> bool {
    let grants: Vec<Grant> = state.grants().filter(|g| key.is_none_or(|k| g.key == k)).collect();
    grants
        .iter()
        .enumerate()
        .all(|(i, g)| grants[i + 1..].iter().all(|later| field(g) < field(later)))
}

/// The nodes are interchangeable: a state with its nodes renumbered behaves the same, so the checker
/// needs to explore only one of the renumberings, the smallest. (Contenders keep only counts of
/// answers, never which node gave them, so that renumbering touches only nodes and requests.)
impl Representative for State {
    fn representative(&self) -> State {
        ORDERS
            .iter()
            .map(|order| {
                let mut state = *self;
                for (old, node) in self.nodes.iter().enumerate() {
                    state.nodes[usize::from(order[old])] = *node;
                }
                state.network = self.network.renumber(*order);
                state
            })
            .min()
            .expect("six orders")
    }
}
