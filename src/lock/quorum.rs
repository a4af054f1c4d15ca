//! Counting one round's answers against the *configured* nodes.
//!
//! A majority is always `configured / 2 + 1`, however many nodes are reachable: counting against the
//! reachable ones (a bug reported in peers) lets two sides of a partition both believe they hold a
//! majority. The tally is pure, so the rules can be tested without Redis.

/// The number of nodes that must agree: a strict majority of the configured nodes.
pub fn quorum(configured: usize) -> usize {
    configured / 2 + 1
}

/// What one node answered to one request of a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vote {
    /// The node did what was asked (set, confirmed, renewed).
    Granted,
    /// The node refused for a reason that is an answer, not a failure (busy, claimed, not held).
    Refused,
    /// The node did not answer in time, or answered with an error.
    Failed(String),
}

/// The running count of one request's votes in one round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally {
    configured: usize,
    granted: usize,
    refused: usize,
    failed: usize,
}

/// Where a round stands for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A majority of the configured nodes granted.
    Reached,
    /// So many nodes refused or failed that a majority can no longer grant.
    Impossible,
    /// Neither yet: wait for more answers.
    Pending,
}

impl Tally {
    /// An empty tally over `configured` nodes.
    pub fn new(configured: usize) -> Tally {
        Tally {
            configured,
            granted: 0,
            refused: 0,
            failed: 0,
        }
    }

    /// Counts one node's vote.
    pub fn add(&mut self, vote: &Vote) {
        match vote {
            Vote::Granted => self.granted += 1,
            Vote::Refused => self.refused += 1,
            Vote::Failed(_) => self.failed += 1,
        }
    }

    /// How many nodes granted so far.
    pub fn granted(&self) -> usize {
        self.granted
    }

    /// Whether the outcome is known: a quorum granted, or a quorum can no longer grant.
    ///
    /// This is what lets a round return as soon as the outcome is known instead of after the slowest node.
    pub fn decision(&self) -> Decision {
        let needed = quorum(self.configured);
        let answered = self.granted + self.refused + self.failed;
        let still_possible = self.granted + self.configured.saturating_sub(answered);
        if self.granted >= needed {
            Decision::Reached
        } else if still_possible < needed {
            Decision::Impossible
        } else {
            Decision::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(configured: usize, votes: &[Vote]) -> Tally {
        let mut tally = Tally::new(configured);
        votes.iter().for_each(|vote| tally.add(vote));
        tally
    }

    #[test]
    fn quorum_is_a_strict_majority_of_configured_nodes() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
    }

    #[test]
    fn unreachable_nodes_still_count_against_the_majority() {
        // 5 configured, 3 down: the 2 reachable nodes both granting is not a majority.
        let down = Vote::Failed("connection refused".into());
        let t = tally(
            5,
            &[
                Vote::Granted,
                Vote::Granted,
                down.clone(),
                down.clone(),
                down,
            ],
        );
        assert_eq!(t.decision(), Decision::Impossible);
    }

    #[test]
    fn decides_as_soon_as_the_outcome_is_known() {
        assert_eq!(
            tally(5, &[Vote::Granted, Vote::Granted]).decision(),
            Decision::Pending
        );
        assert_eq!(
            tally(5, &[Vote::Granted, Vote::Granted, Vote::Granted]).decision(),
            Decision::Reached
        );
        let refused = [Vote::Refused, Vote::Refused, Vote::Refused];
        assert_eq!(tally(5, &refused).decision(), Decision::Impossible);
        let mixed = [Vote::Granted, Vote::Refused, Vote::Failed("timeout".into())];
        assert_eq!(tally(5, &mixed).decision(), Decision::Pending);
    }

    #[test]
    fn a_minority_failure_does_not_prevent_a_quorum() {
        let f = Vote::Failed("timeout".into());
        let t = tally(
            5,
            &[f.clone(), f, Vote::Granted, Vote::Granted, Vote::Granted],
        );
        assert_eq!(t.decision(), Decision::Reached);
    }
}
