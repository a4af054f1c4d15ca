//! Model checks of the claim protocol, v1 (today's) against v2 (the spec), with `stateright`.
//!
//! The protocol's promises are about every interleaving of messages, crashes and expiries, which no test
//! against real nodes can enumerate. Here the checker does: `protocol.rs` is the model (3 nodes, 2–3
//! contenders for one job, asynchronous messages), `node.rs` the scripts, `contender.rs` a contender's
//! reading of a lost attempt, `narrate.rs` prints a counterexample. `docs/model.md` says what is modelled
//! and what is abstracted. Each check is exhaustive over its configuration and runs in seconds.

mod contender;
mod narrate;
mod network;
mod node;
mod protocol;

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path};

use self::contender::{Overlap, Spec};
use self::node::Version;
use self::protocol::{
    Action, Config, Protocol, State, AT_MOST_ONCE, EVENTUALLY_GRANTED, LATER_TICKS_ONLY,
    TOKENS_RISE, TOKENS_RISE_ACROSS_KEYS,
};

/// What one check found, and its size.
struct Checked {
    model: Protocol,
    discoveries: HashMap<&'static str, Path<State, Action>>,
}

impl Checked {
    /// The counterexample to `property`, printed step by step; panics if there is none.
    fn counterexample(&self, property: &'static str) -> Vec<String> {
        let path = self.discoveries.get(property).cloned();
        let path = path.unwrap_or_else(|| panic!("no counterexample to {property:?}"));
        let lines = narrate::narrate(&self.model, path);
        println!("counterexample to {property:?}:\n{}", lines.join("\n"));
        lines
    }

    /// Panics with the counterexample if any property has one.
    fn assert_holds(&self) {
        if let Some(property) = self.discoveries.keys().next() {
            self.counterexample(property);
            panic!("{property:?} does not hold");
        }
    }
}

/// Checks every state of `config` (breadth first, so a counterexample is a shortest one), stopping early
/// once `stop_at` has one; prints the number of states and the time.
fn check(name: &str, config: Config, stop_at: &[&'static str]) -> Checked {
    let started = Instant::now();
    let until = match stop_at {
        [] => HasDiscoveries::All,
        names => HasDiscoveries::AnyOf(names.iter().copied().collect::<BTreeSet<_>>()),
    };
    let builder = Protocol {
        config: config.clone(),
    }
    .checker()
    .finish_when(until);
    let search = std::env::var("MODEL_SEARCH").unwrap_or_default();
    let threads = std::env::var("MODEL_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(1);
    let (unique, total, depth, discoveries) = if search == "bfs" {
        let c = builder.threads(threads).spawn_bfs().join();
        (c.unique_state_count(), c.state_count(), c.max_depth(), c.discoveries())
    } else if search == "dfs" {
        let c = builder.threads(threads).spawn_dfs().join();
        (c.unique_state_count(), c.state_count(), c.max_depth(), c.discoveries())
    } else {
        let c = builder.threads(threads).symmetry().spawn_dfs().join();
        (c.unique_state_count(), c.state_count(), c.max_depth(), c.discoveries())
    };
    println!(
        "model {name}: {unique} states ({total} generated), depth {depth}, {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Checked {
        discoveries,
        model: Protocol { config },
    }
}

fn spec(tick: u8, overlap: Overlap, attempts: u8) -> Spec {
    Spec {
        tick,
        overlap,
        attempts,
    }
}

/// Two workers at tick 1 during a rollout of `overlap: allow`: one still reads `skip`, one `allow`.
fn mixed_overlap() -> Vec<Spec> {
    vec![spec(1, Overlap::Skip, 2), spec(1, Overlap::Allow, 1)]
}

/// Finding 1: v1 grants one tick twice when two workers disagree on `overlap` (different lease keys).
#[test]
fn v1_double_grants_when_workers_disagree_on_overlap() {
    let config = Config::faulty(Version::V1, mixed_overlap());
    let checked = check("v1 mixed overlap", config, &[AT_MOST_ONCE]);
    let path = checked.counterexample(AT_MOST_ONCE);
    assert!(path.iter().filter(|line| line.contains("GRANT")).count() == 2);
}

/// G1: v2 grants each (job, tick) at most once with mixed overlap, loss, early timeouts, crashes at any
/// point, a persistent node restart and retries by the same claimant.
#[test]
fn v2_grants_each_tick_at_most_once() {
    let config = Config::faulty(Version::V2, mixed_overlap());
    check("v2 mixed overlap", config, &[]).assert_holds();
    let three = vec![
        spec(1, Overlap::Skip, 1),
        spec(1, Overlap::Allow, 1),
        spec(1, Overlap::Skip, 1),
    ];
    let config = Config::faulty(Version::V2, three);
    check("v2 three contenders", config, &[]).assert_holds();
}

/// G2 and G1': v2 tokens rise in grant order on the shared `skip` key, and a granted tick excludes
/// later grants of earlier ticks, with ticks 1 and 2 contended (tokens without the floor, so that the
/// lease alone must order them).
#[test]
fn v2_tokens_rise_and_ticks_only_move_forward() {
    let contenders = vec![
        spec(2, Overlap::Skip, 1),
        spec(1, Overlap::Skip, 1),
        spec(1, Overlap::Allow, 1),
    ];
    let config = Config {
        token_floor: false,
        ..Config::faulty(Version::V2, contenders)
    };
    let checked = check("v2 ticks 1 and 2, no floor", config, &[]);
    for property in [AT_MOST_ONCE, LATER_TICKS_ONLY, TOKENS_RISE] {
        assert!(
            !checked.discoveries.contains_key(property),
            "{property}: {:?}",
            checked.counterexample(property)
        );
    }
}

/// Why G2 is stated per lease key: with `overlap: allow` two ticks take different keys, and without the
/// token floor their grants may carry tokens that do not rise.
#[test]
fn tokens_need_the_floor_across_lease_keys() {
    let contenders = vec![spec(1, Overlap::Allow, 1), spec(2, Overlap::Allow, 1)];
    let config = Config {
        token_floor: false,
        ..Config::faulty(Version::V2, contenders)
    };
    let checked = check("v2 allow, no floor", config, &[TOKENS_RISE_ACROSS_KEYS]);
    checked.counterexample(TOKENS_RISE_ACROSS_KEYS);
    assert!(!checked.discoveries.contains_key(TOKENS_RISE));
}

/// Liveness: with no loss and one contender that stays alive, v2 grants the tick, also when the other
/// contender (of the other lease key) crashed at any point.
#[test]
fn v2_grants_the_tick_while_a_contender_lives() {
    let config = Config::live(Version::V2, mixed_overlap());
    check("v2 liveness", config, &[]).assert_holds();
}

/// Findings 3 and 4: under the same assumptions, v1 can leave a tick never granted after a contender
/// crashed between or during its rounds.
#[test]
fn v1_loses_the_tick_after_a_contender_crashes() {
    let both_skip = vec![spec(1, Overlap::Skip, 1), spec(1, Overlap::Skip, 1)];
    let config = Config::live(Version::V1, both_skip);
    let checked = check("v1 liveness", config, &[EVENTUALLY_GRANTED]);
    checked.counterexample(EVENTUALLY_GRANTED);
}

/// The persistence assumption: a node that restarts empty forgets its claims, and v2 can then grant one
/// tick twice.
#[test]
fn v2_double_grants_after_a_node_restarts_empty() {
    let config = Config {
        empty_restart: true,
        ..Config::faulty(Version::V2, mixed_overlap())
    };
    let checked = check("v2 empty restart", config, &[AT_MOST_ONCE]);
    checked.counterexample(AT_MOST_ONCE);
}

#[test]
fn zz_explore() {
    // MODEL_EXPLORE="v2 1s2,1a1 loss,timeouts,crashes,restart,fair,nofloor 2"
    let Ok(which) = std::env::var("MODEL_EXPLORE") else { return };
    let parts: Vec<&str> = which.split(' ').collect();
    let version = if parts[0] == "v1" { Version::V1 } else { Version::V2 };
    let specs: Vec<Spec> = parts[1].split(',').map(|p| {
        let b = p.as_bytes();
        spec(b[0] - b'0', if b[1] == b's' { Overlap::Skip } else { Overlap::Allow }, b[2] - b'0')
    }).collect();
    let flags = parts.get(2).copied().unwrap_or("");
    let mut config = if flags.contains("fair") { Config::live(version, specs) } else { Config::faulty(version, specs) };
    if !flags.contains("fair") {
        config.loss = flags.contains("loss");
        config.timeouts = flags.contains("timeouts");
        config.crashes = flags.contains("crashes");
        config.empty_restart = flags.contains("empty");
    }
    config.token_floor = !flags.contains("nofloor");
    if let Some(f) = parts.get(3) { config.faults = f.parse().unwrap(); }
    let stop: Vec<&'static str> = if std::env::var("MODEL_SEARCH").is_ok() { vec![AT_MOST_ONCE, LATER_TICKS_ONLY, TOKENS_RISE, TOKENS_RISE_ACROSS_KEYS, EVENTUALLY_GRANTED] } else { vec![] };
    let checked = check(&which, config, &stop);
    for p in checked.discoveries.keys() { checked.counterexample(p); }
}

#[test]
fn zz_path() {
    if std::env::var("MODEL_PATH").is_err() { return; }
    use self::network::{Kind, Msg};
    use self::protocol::{Action, Answer};
    let config = Config { empty_restart: true, loss: false, timeouts: false, crashes: false, faults: 0, ..Config::faulty(Version::V2, vec![spec(1, Overlap::Skip, 1), spec(1, Overlap::Allow, 1)]) };
    let model = Protocol { config };
    let d = |contender, kind, node| Action::Deliver { msg: Msg { contender, attempt: 0, kind, node }, expire: false, answer: Answer::Read };
    let mut s = model.init_states()[0];
    for a in [d(0, Kind::Acquire, 0), d(0, Kind::Acquire, 1), d(1, Kind::Acquire, 1), d(0, Kind::Confirm, 0), d(0, Kind::Confirm, 1), Action::Restart(1), d(1, Kind::Acquire, 2), d(1, Kind::Confirm, 1), d(1, Kind::Confirm, 2)] {
        let mut acts = Vec::new();
        model.actions(&s, &mut acts);
        println!("{a:?} enabled {}", acts.contains(&a));
        s = model.next_state(&s, a).unwrap();
        println!("{:?}", s.contenders.map(|c| c.phase));
    }
    println!("{:?}", s.grants);
}
