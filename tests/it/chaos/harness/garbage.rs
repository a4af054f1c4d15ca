//! Garbage plants: trigger requests, member records and a history entry that no `redcron` can have
//! written, planted straight into the store with the helpers of [`crate::support::garbage`] (shared with
//! `store_garbage`): on the Redis nodes a plant names that serve (directly, not through the proxy),
//! through a plain etcd client, through the harness's own ZooKeeper client, with SQL into the SQL
//! server's tables while it serves, on a Sentinel group's master (its replicas get it from there), or
//! on the master of each key's slot of a Redis Cluster.

use super::nodes::Nodes;
use super::{now_ms, Cluster};
use crate::chaos::faults::{Fault, Garbage, Ghost, GARBAGE_KEPT_MS};
use crate::chaos::timeline::Happening;
use crate::support::garbage::{self, Target};

/// The size of the huge entries: a 64 KiB request and a 64 KiB blob.
const HUGE: usize = 64 << 10;
/// The size of the junk member's `host`.
const MEMBER_HOST: usize = 4 << 10;
/// How far ahead of now the junk history entry's tick is: the job's newest entry for the rest of the run.
const HISTORY_AHEAD_MS: i64 = 3_600_000;

impl Cluster {
    /// Plants `plant` and records what was written where.
    pub(super) fn plant_garbage(&mut self, plant: Garbage) {
        let jobs = crate::chaos::jobs();
        let mut requests: Vec<(String, String)> = Vec::new();
        for (index, job) in jobs.iter().enumerate() {
            let tag = plant.tag << 2 | index as u8;
            let huge = (index == plant.huge_job).then_some(HUGE);
            requests.extend(garbage::trigger_requests(&job.name, tag, huge));
        }
        let members = garbage::members(&format!("mallory{}", plant.tag), MEMBER_HOST);
        let history_job = &jobs[plant.history_job].name;
        let tick = (now_ms() + HISTORY_AHEAD_MS).div_euclid(1000) * 1000;
        let history_id = format!("{tick}|mallory{}|junk", plant.tag);
        let (target, nodes) = match &self.nodes {
            Nodes::Redis(redis) => {
                let on: Vec<usize> = Ghost::nodes(plant.nodes)
                    .into_iter()
                    .filter(|&node| redis.is_serving(node))
                    .collect();
                let target = Target::Redis {
                    nodes: redis,
                    on: on.clone(),
                };
                (target, on)
            }
            Nodes::Etcd(members) => (Target::Etcd(members), Vec::new()),
            // The server killed or hung: nothing planted (the client would wait for a hung one).
            Nodes::Sql(server) if !server.is_serving() => {
                self.timeline.push(
                    now_ms(),
                    Happening::Skipped {
                        fault: Fault::Garbage(plant),
                        why: "the SQL server is down or hung".to_string(),
                    },
                );
                return;
            }
            Nodes::Sql(server) => (Target::Sql(server), vec![0]),
            // The master every Sentinel names; none during a failover: nothing planted.
            Nodes::Sentinel(group) => match group.master() {
                Some(master) => (
                    Target::Redis {
                        nodes: &group.data,
                        on: vec![master],
                    },
                    vec![master],
                ),
                None => {
                    self.timeline.push(
                        now_ms(),
                        Happening::Skipped {
                            fault: Fault::Garbage(plant),
                            why: "the Sentinel group has no master".to_string(),
                        },
                    );
                    return;
                }
            },
            Nodes::Zookeeper(members) => (Target::Zookeeper(members), Vec::new()),
            Nodes::Sharded(cluster) => (Target::Sharded(cluster), Vec::new()),
        };
        // On etcd, ZooKeeper, SQL and a Redis Cluster a plant is one store's writes: what failed is not
        // there.
        let etcd = matches!(
            target,
            Target::Etcd(_) | Target::Sql(_) | Target::Zookeeper(_) | Target::Sharded(_)
        );
        let mut failed =
            garbage::plant_triggers(&target, &requests, Some(now_ms() + GARBAGE_KEPT_MS));
        failed.extend(garbage::plant_members(&target, &members));
        let history_failed =
            garbage::plant_history(&target, history_job, tick, &history_id, "{not json");
        let history_written = if etcd {
            history_failed.is_empty()
        } else {
            history_failed.len() < nodes.len()
        };
        failed.extend(history_failed);
        // A node that failed a write holds part of the plant at most; on etcd a key whose put failed is
        // not there.
        let written_nodes: Vec<usize> = nodes
            .iter()
            .copied()
            .filter(|node| {
                !failed
                    .iter()
                    .any(|f| f.starts_with(&format!("node {node}:")))
            })
            .collect();
        let written = |key: &str| {
            (etcd || !written_nodes.is_empty()) && !failed.iter().any(|f| f.contains(key))
        };
        let requests: Vec<String> = requests
            .into_iter()
            .map(|(id, _)| id)
            .filter(|id| written(&format!("triggers/{id}")))
            .collect();
        let members: Vec<String> = members
            .into_iter()
            .map(|(id, _)| id)
            .filter(|id| written(&format!("members/{id}")))
            .collect();
        self.timeline.push(
            now_ms(),
            Happening::Garbage {
                tag: plant.tag,
                nodes: written_nodes,
                requests,
                members,
                history: history_written.then(|| history_job.clone()),
                failed,
            },
        );
    }
}
