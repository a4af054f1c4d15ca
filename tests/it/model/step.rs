//! How one step changes the state: a script run and the answer read, a round decided, an attempt lost
//! or retried, and the forgetting of what no step can read any more.

use super::contender::{round1_verdict, round2_verdict, Phase, Spec, Tally1, Verdict};
use super::network::{Kind, Msg};
use super::node::{Request, Round1, Round2, Value, Version};
use super::protocol::{Answer, Grant, Protocol, State};

impl Protocol {
    pub fn spec(&self, contender: u8) -> Spec {
        self.config.contenders[usize::from(contender)]
    }

    /// The configured contenders' indices.
    pub(super) fn contenders(&self) -> impl Iterator<Item = u8> {
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
    pub(super) fn awaited(state: &State, msg: Msg) -> bool {
        let contender = &state.contenders[usize::from(msg.contender)];
        contender.attempt == msg.attempt
            && matches!(
                (msg.kind, contender.phase),
                (Kind::Acquire, Phase::Round1(_)) | (Kind::Confirm, Phase::Round2 { .. })
            )
    }

    /// Whether an answer to contender `c`'s round may still come: a request of it is in flight.
    pub(super) fn due(state: &State, c: u8) -> bool {
        let contender = &state.contenders[usize::from(c)];
        match contender.phase {
            Phase::Round1(_) => state.network.has(c, contender.attempt, Kind::Acquire),
            Phase::Round2 { .. } => state.network.has(c, contender.attempt, Kind::Confirm),
            _ => false,
        }
    }

    /// Whether the node may find the lease key that `msg` reads expired: the holder's deadline has
    /// passed, or may pass now (in the liveness configuration, not during the holder's own round).
    pub(super) fn may_expire(&self, state: &State, msg: Msg) -> bool {
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
    pub(super) fn must_expire(&self, state: &State, msg: Msg) -> bool {
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
    pub(super) fn decisive(&self, state: &State, msg: Msg) -> bool {
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
                tally.ok == 1 && answer == Round2::Ok
            }
            _ => false,
        }
    }

    /// The deadline of contender `c`'s `attempt` (and so of every earlier one) has passed.
    pub(super) fn deadline_passes(state: &mut State, c: u8, attempt: u8) {
        let contender = &mut state.contenders[usize::from(c)];
        contender.expired = contender.expired.max(attempt + 1);
    }

    pub(super) fn deliver(&self, state: &mut State, msg: Msg, expire: bool, answer: Answer) {
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
            (Kind::Acquire, Phase::Round1(tally)) if read => {
                tally.add(node.acquire(version, request))
            }
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
    pub(super) fn decide(&self, state: &mut State, c: u8, give_up: bool) {
        let spec = self.spec(c);
        let contender = state.contenders[usize::from(c)];
        let attempt = contender.attempt;
        let decided =
            |answered: u8, ok: u8| ok >= 2 || answered - ok >= 2 || answered == 3 || give_up;
        match contender.phase {
            Phase::Round1(tally) => {
                if tally.ok >= 2 && !contender.expired() {
                    let floor = if self.config.token_floor {
                        spec.tick * 10
                    } else {
                        0
                    };
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
                    let verdict =
                        round1_verdict(self.config.version, ours, spec.tick, &tally, tick_of);
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
    pub(super) fn lose(&self, state: &mut State, c: u8, verdict: Verdict) {
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
    pub(super) fn retry(&self, state: &mut State, c: u8, keep: bool) {
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
    pub(super) fn normalize(&self, state: &mut State) {
        for c in self.contenders() {
            let index = usize::from(c);
            let in_flight = |attempt: u8, kinds: &[Kind]| {
                kinds
                    .iter()
                    .any(|kind| state.network.has(c, attempt, *kind))
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
                keys.clone()
                    .any(|held| held.value.contender == c && held.set_by == attempt)
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
}
