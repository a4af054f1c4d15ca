//! What a view's reads could not see: the nodes that did not answer and the stored items that could not be
//! parsed. Part of every report's JSON (`store`, `missing_nodes`, `skipped`, and `groups` on a store with
//! Sentinel groups), and the warnings on stderr.

use serde::Serialize;

use crate::store::{GroupState, Read, Store};

/// A node that did not answer a read, and why; the address never shows a password.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MissingNode {
    pub node: String,
    pub error: String,
}

/// What the reads of a report could not see. Serialised flat into every report (`store`, `missing_nodes`,
/// `skipped`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Notes {
    /// The nodes' addresses (without passwords), `etcd:<endpoints>` or `embedded:<path>`.
    pub store: String,
    /// The nodes that did not answer, each once, by address; the answer came from the others, a majority.
    pub missing_nodes: Vec<MissingNode>,
    /// Stored items that could not be read (garbage on a node), each once, naming its node.
    pub skipped: Vec<String>,
    /// Each Sentinel group of the store, with the master the reads found (status reports only; absent
    /// from the JSON on other stores).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupState>,
}

impl Notes {
    /// No notes yet, of reads from `store`.
    pub fn new(store: &Store) -> Notes {
        Notes {
            store: store.describe(),
            ..Notes::default()
        }
    }

    /// Keeps the notes of `read` and gives its value: a node is listed once, with its latest error, in
    /// the order of the addresses; a skipped item once, in the order first seen.
    pub fn keep<T>(&mut self, read: Read<T>) -> T {
        for (node, error) in read.missing {
            match self
                .missing_nodes
                .binary_search_by(|missing| missing.node.cmp(&node))
            {
                Ok(at) => self.missing_nodes[at].error = error,
                Err(at) => self.missing_nodes.insert(at, MissingNode { node, error }),
            }
        }
        for skipped in read.skipped {
            if !self.skipped.contains(&skipped) {
                self.skipped.push(skipped);
            }
        }
        read.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(missing: &[(&str, &str)], skipped: &[&str]) -> Read<()> {
        Read {
            value: (),
            missing: missing
                .iter()
                .map(|(node, why)| (node.to_string(), why.to_string()))
                .collect(),
            skipped: skipped.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Several reads' notes: each node once (sorted, latest error), each skipped item once (first seen).
    #[test]
    fn the_notes_of_several_reads_name_each_node_and_item_once() {
        let mut notes = Notes::default();
        notes.keep(read(&[("redis://b", "refused")], &["x on b"]));
        notes.keep(read(
            &[("redis://a", "timeout"), ("redis://b", "reset")],
            &["y on a", "x on b"],
        ));
        let nodes: Vec<(&str, &str)> = notes
            .missing_nodes
            .iter()
            .map(|m| (m.node.as_str(), m.error.as_str()))
            .collect();
        assert_eq!(nodes, [("redis://a", "timeout"), ("redis://b", "reset")]);
        assert_eq!(notes.skipped, ["x on b", "y on a"]);
    }
}
