//! The nodes' clocks: one `TIME` to every node in parallel, each exchange timed on its own.
//!
//! The worker's clock task ([`crate::clock::cluster`]) turns these readings into this host's offset to
//! the cluster. A reading goes through the same connection as the claims ([`Node::eval`]), so it costs no
//! connection of its own and sees a node as the claims see it.

use std::time::Instant;

use futures_util::future::join_all;
use redis::Value;

use super::node::Node;
use super::RedisStore;
use crate::clock::cluster::{node_time_us, wall_now_us, Readings, Sample};

impl RedisStore {
    /// Sends `TIME` to every node at once and returns every node's answer within `node_timeout`.
    ///
    /// Waits for all nodes (bounded by the timeout) rather than for a majority: the more clocks, the
    /// better the median.
    pub(super) async fn read_time(&self) -> Readings {
        let timeout = self.settings.node_timeout;
        let answers = join_all(
            self.nodes
                .iter()
                .enumerate()
                .map(
                    |(index, node)| async move { (index, read_clock(node, index, timeout).await) },
                ),
        )
        .await;
        let mut readings = Readings {
            configured: self.nodes.len(),
            ..Readings::default()
        };
        for (index, answer) in answers {
            match answer {
                Ok(sample) => readings.samples.push(sample),
                Err(why) => readings
                    .failures
                    .push((self.nodes[index].label.clone(), why)),
            }
        }
        readings
    }
}

/// One timed `TIME` exchange with `node`.
async fn read_clock(
    node: &Node,
    index: usize,
    timeout: std::time::Duration,
) -> Result<Sample, String> {
    let mut pipeline = redis::pipe();
    pipeline.cmd("TIME");
    let sent_us = wall_now_us();
    let sent = Instant::now();
    let values = node.eval(&pipeline, timeout).await?;
    let rtt = sent.elapsed();
    let value = values.into_iter().next().unwrap_or(Value::Nil);
    Ok(Sample {
        node: index,
        sent_us,
        rtt,
        node_us: parse_time(value)?,
    })
}

/// A `TIME` reply: `[seconds, microseconds]` as two strings.
fn parse_time(value: Value) -> Result<i64, String> {
    let shown = format!("{value:?}");
    let (seconds, micros) = redis::from_redis_value::<(String, String)>(value)
        .map_err(|_| format!("unexpected TIME reply {shown}"))?;
    node_time_us(&seconds, &micros)
}

#[cfg(test)]
mod tests {
    use super::parse_time;
    use redis::Value;

    #[test]
    fn time_replies_are_parsed_and_bad_ones_refused() {
        let reply = |s: &str, us: &str| {
            Value::Array(vec![
                Value::BulkString(s.as_bytes().to_vec()),
                Value::BulkString(us.as_bytes().to_vec()),
            ])
        };
        assert_eq!(
            parse_time(reply("1800000000", "000042")),
            Ok(1_800_000_000_000_042)
        );
        assert!(parse_time(reply("1800000000", "1000000")).is_err());
        assert!(parse_time(Value::Nil).is_err());
        assert!(parse_time(Value::Array(vec![Value::Int(1)])).is_err());
    }
}
