//! A counterexample in words: one line per step of a path found by the checker, with what it changed.
//!
//! `stateright` reports a path as a list of `Debug`-printed actions and states, which is correct but hard
//! to quote. These lines name the contenders (`c0 (tick 1, skip)`), the lease keys and the answers.

use stateright::{Model, Path};

use super::contender::{Overlap, Phase};
use super::network::{Kind, Msg};
use super::node::{Round1, Round2, Value};
use super::protocol::{Action, Answer, Protocol, State};

/// The path as numbered lines, each an action and what it did.
pub fn narrate(model: &Protocol, path: Path<State, Action>) -> Vec<String> {
    let mut lines = vec![format!("contenders: {}", contenders(model))];
    for (step, (state, action)) in path.into_vec().into_iter().enumerate() {
        let Some(action) = action else { break };
        let next = model
            .next_state(&state, action)
            .expect("every action of a path has a next state");
        let mut line = format!(
            "{:>2}. {}",
            step + 1,
            describe(model, &state, &next, action)
        );
        for (c, (before, after)) in state.contenders.iter().zip(&next.contenders).enumerate() {
            if std::mem::discriminant(&before.phase) != std::mem::discriminant(&after.phase) {
                line.push_str(&format!("; c{c} {}", phase(&after.phase)));
            }
        }
        if let Some(grant) = next.grants().nth(state.grants().count()) {
            line.push_str(&format!(
                "; GRANT #{}: c{} tick {} token {}",
                next.grants().count(),
                grant.contender,
                grant.tick,
                grant.token
            ));
        }
        lines.push(line);
    }
    lines
}

fn contenders(model: &Protocol) -> String {
    let list: Vec<String> = model
        .config
        .contenders
        .iter()
        .enumerate()
        .map(|(c, spec)| {
            let overlap = match spec.overlap {
                Overlap::Skip => "skip",
                Overlap::Allow => "allow",
            };
            format!(
                "c{c} = tick {} overlap {overlap} on key {}",
                spec.tick,
                key(spec.key())
            )
        })
        .collect();
    format!("{} ({:?})", list.join(", "), model.config.version)
}

fn describe(model: &Protocol, before: &State, next: &State, action: Action) -> String {
    match action {
        Action::Deliver {
            msg,
            expire,
            answer,
        } => deliver(model, before, msg, expire, answer),
        Action::Timeout(c) => format!("c{c} stops waiting for its round (timeout)"),
        Action::Retry(c) => format!(
            "c{c} retries (attempt {})",
            next.contenders[usize::from(c)].attempt
        ),
        Action::Crash(c) => format!("c{c} crashes"),
        Action::Restart(node) => format!("n{node} restarts EMPTY (no persistence)"),
    }
}

/// A script run, with the node's answer (computed again on a copy of the node as it was).
fn deliver(model: &Protocol, before: &State, msg: Msg, expire: bool, answer: Answer) -> String {
    let version = model.config.version;
    let mut node = before.nodes[usize::from(msg.node)];
    let spec = model.spec(msg.contender);
    let (n, k, t) = (msg.node, key(spec.key()), spec.tick);
    let mut line = String::new();
    if expire {
        let held = node.leases[spec.key()].take().expect("an expired key");
        line.push_str(&format!("n{n}: {k} of {} expires; ", value(held.value)));
    }
    let request = model.request(before, msg);
    let v = value(request.value);
    line.push_str(&match msg.kind {
        Kind::Acquire => {
            let answer = round1(node.acquire(version, request));
            format!("n{n}: ACQUIRE({v}, {k}, tick {t}) -> {answer}")
        }
        Kind::Confirm => {
            let contender = &before.contenders[usize::from(msg.contender)];
            let token = contender.tokens[usize::from(msg.attempt)];
            let answer = round2(node.confirm(version, request, token));
            format!("n{n}: CONFIRM({v}, {k}, token {token}, tick {t}) -> {answer}")
        }
        Kind::Release => format!("n{n}: RELEASE({v}, {k})"),
    });
    line.push_str(match answer {
        Answer::Read => "",
        Answer::Lost => " (answer lost)",
        Answer::Late => " (read after the deadline passed)",
    });
    line
}

fn phase(phase: &Phase) -> String {
    match phase {
        Phase::Round1(_) => "starts round 1".to_string(),
        Phase::Round2 { token, .. } => format!("starts round 2 with token {token}"),
        Phase::Waiting { keep: true } => "lost the attempt, keeps its keys".to_string(),
        Phase::Waiting { keep: false } => "lost the attempt, undoes it, will retry".to_string(),
        Phase::Won { token } => format!("WON with token {token}"),
        Phase::GaveUp => "gives up (final), undoes its attempt".to_string(),
        Phase::Crashed => "is gone".to_string(),
    }
}

fn round1(answer: Round1) -> String {
    match answer {
        Round1::Ok { fence } => format!("ok(fence {fence})"),
        Round1::Claimed => "claimed".to_string(),
        Round1::Busy { holder } => format!("busy({})", value(holder)),
    }
}

fn round2(answer: Round2) -> String {
    format!("{answer:?}").to_lowercase()
}

fn value(v: Value) -> String {
    format!("c{}/{}", v.contender, v.id)
}

fn key(index: usize) -> String {
    match index {
        0 => "lease".to_string(),
        tick => format!("lease:{tick}"),
    }
}
