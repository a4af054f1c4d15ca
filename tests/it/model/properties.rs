//! The properties the checker verifies in every state: the spec's G1, G1', G2 and liveness.
//!
//! Grants are kept in the state in grant order (the instant a contender learnt its round 2 reached a
//! majority before its deadline), so each property is a predicate on one state.

use stateright::Property;

use super::node::{Value, Version};
use super::protocol::{Grant, Protocol, State};

/// Safety: no two grants of one (job, tick). G1 of the spec.
pub const AT_MOST_ONCE: &str = "at most one grant per (job, tick)";
/// G1': once tick T is granted, no tick <= T is granted afterwards. Holds among grants that share a lease
/// key; across keys it does not, for the reason given at [`TOKENS_RISE`] (see
/// `ticks_and_tokens_are_ordered_only_on_one_lease_key`).
pub const LATER_TICKS_ONLY: &str = "a granted tick excludes later grants of ticks <= it";
/// G2: among grants that share a lease key (`overlap: skip`), tokens rise in grant order.
///
/// Only promised on one key, because its proof is the lease: a later holder of the same key can take it
/// on a majority only after the earlier holder's lease is gone there (its deadline passed, so it is
/// never granted afterwards), so the later holder's round 1 reads the fences that the earlier grant
/// raised. Holders of different keys (`overlap: allow`, or a rollout mixing skip and allow) do not
/// exclude each other: their rounds interleave freely, a tick-1 claim may complete after a tick-2 grant,
/// and the token floor (tick × 1000 in redcron, tick × 10 here) then orders tokens by tick, not by grant.
pub const TOKENS_RISE: &str = "tokens rise in grant order on one lease key";
/// G2 stretched over all lease keys: not promised by the spec; checked to show why.
pub const TOKENS_RISE_ACROSS_KEYS: &str = "tokens rise in grant order across lease keys";
/// Liveness: the tick is granted, to a live contender or by a majority of one contender's confirms.
pub const EVENTUALLY_GRANTED: &str = "the tick is eventually granted";

/// The properties of a configuration; liveness only in the liveness configuration.
pub fn all(model: &Protocol) -> Vec<Property<Protocol>> {
    let mut properties = vec![
        Property::always(AT_MOST_ONCE, |_, s: &State| {
            let ticks = s.grants().map(|g| g.tick);
            let mut seen = ticks.clone().collect::<Vec<_>>();
            seen.sort();
            seen.dedup();
            seen.len() == ticks.count()
        }),
        Property::always(LATER_TICKS_ONLY, |_, s: &State| {
            is_rising(s, None, |g| g.tick)
        }),
        Property::always(TOKENS_RISE, |_, s: &State| {
            (0..3).all(|key| is_rising(s, Some(key), |g| g.token))
        }),
        Property::always(TOKENS_RISE_ACROSS_KEYS, |_, s: &State| {
            is_rising(s, None, |g| g.token)
        }),
    ];
    if model.config.fair {
        properties.push(Property::eventually(
            EVENTUALLY_GRANTED,
            |m: &Protocol, s| s.grants[0].is_some() || m.committed(s),
        ));
    }
    properties
}

/// Whether `field` strictly rises along the grants (on one lease key, or all), each against every later.
fn is_rising(state: &State, key: Option<u8>, field: impl Fn(&Grant) -> u8) -> bool {
    let grants: Vec<Grant> = state
        .grants()
        .filter(|g| key.is_none_or(|k| g.key == k))
        .collect();
    grants
        .iter()
        .enumerate()
        .all(|(i, g)| grants[i + 1..].iter().all(|later| field(g) < field(later)))
}

impl Protocol {
    /// Whether a majority of nodes hold the claim of one contender (v2: one claimant; v1: one value) for
    /// its tick: the tick is taken for good, granted even if that contender crashed before it knew.
    pub fn committed(&self, state: &State) -> bool {
        let claims = state.nodes.iter().filter_map(|n| n.claim);
        claims.clone().any(|claim| {
            let same = |other: Value| match self.config.version {
                Version::V1 => other == claim.by,
                Version::V2 => other.contender == claim.by.contender,
            };
            let count = claims
                .clone()
                .filter(|c| c.tick == claim.tick && same(c.by))
                .count();
            count >= 2
        })
    }
}
