//! Parsing the scripts' replies: every reply is data from the network, so nothing here panics.

use redis::Value;

use crate::lock::keys::Holder;
use crate::lock::Pause;

/// What one node answered to round 1 of one claim.
#[derive(Debug)]
pub(super) enum Round1 {
    Ok {
        fence: u64,
    },
    /// The job is paused here.
    Paused(Pause),
    /// Another claimant confirmed this tick or a later one here (`None`: a record that names nobody, or a
    /// claim whose window has ended).
    Claimed(Option<Holder>),
    /// Another claimant's attempt holds the lease here: its value, and what remains of its TTL.
    Busy {
        value: String,
        pttl_ms: i64,
    },
    /// The claim's tick is too far ahead of this node's clock, which read `node_ms`.
    Ahead {
        node_ms: i64,
    },
    Failed(String),
}

/// What one node answered to round 2 of one claim.
#[derive(Debug)]
pub(super) enum Round2 {
    Ok,
    /// Our lease is not held here any more.
    Lost,
    /// The job is paused here.
    Paused(Pause),
    /// Another claimant confirmed this tick or a later one here.
    Claimed(Option<Holder>),
    Failed(String),
}

/// A bulk or simple string, or an integer, as text.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn server_error(value: &Value) -> Option<String> {
    match value {
        Value::ServerError(error) => Some(describe(error)),
        _ => None,
    }
}

/// A server's error as messages show it: `CODE detail`; a Redis Cluster shard's failure
/// ([`super::cluster`]) as its detail alone, which names the shard.
pub(super) fn describe(error: &redis::ServerError) -> String {
    match (error.code(), error.details()) {
        ("CLUSTER", Some(detail)) => detail.to_string(),
        (code, Some(detail)) => format!("{code} {detail}"),
        (code, None) => code.to_string(),
    }
}

/// The fields of an array reply, as text; a server error or another shape is a failure.
fn fields(value: Value) -> Result<Vec<String>, String> {
    if let Some(error) = server_error(&value) {
        return Err(error);
    }
    match value {
        Value::Array(items) => Ok(items.iter().filter_map(text).collect()),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// Parses round 1's `{"ok", fence}` / `{"paused", pause}` / `{"claimed", record}` / `{"ahead", node ms}` /
/// `{"busy", holder, pttl}`.
pub(super) fn parse_round1(value: Value) -> Round1 {
    let fields = match fields(value) {
        Ok(fields) => fields,
        Err(why) => return Round1::Failed(why),
    };
    match fields.as_slice() {
        [status, fence] if status == "ok" => match fence.parse() {
            Ok(fence) => Round1::Ok { fence },
            Err(_) => Round1::Failed(format!("bad fence counter {fence:?}")),
        },
        [status, pause] if status == "paused" => Round1::Paused(Pause::from_value(pause)),
        [status, record] if status == "claimed" => Round1::Claimed(Holder::from_record(record)),
        [status, node_ms] if status == "ahead" => match node_ms.parse() {
            Ok(node_ms) => Round1::Ahead { node_ms },
            Err(_) => Round1::Failed(format!("bad node time {node_ms:?}")),
        },
        [status, holder, pttl] if status == "busy" => Round1::Busy {
            value: holder.clone(),
            pttl_ms: pttl.parse().unwrap_or(-1),
        },
        _ => Round1::Failed(format!("unexpected reply {fields:?}")),
    }
}

/// Parses round 2's `{"ok"}` / `{"lost"}` / `{"paused", pause}` / `{"claimed", record}`.
pub(super) fn parse_round2(value: Value) -> Round2 {
    let fields = match fields(value) {
        Ok(fields) => fields,
        Err(why) => return Round2::Failed(why),
    };
    match fields.as_slice() {
        [status] if status == "ok" => Round2::Ok,
        [status] if status == "lost" => Round2::Lost,
        [status, pause] if status == "paused" => Round2::Paused(Pause::from_value(pause)),
        [status, record] if status == "claimed" => Round2::Claimed(Holder::from_record(record)),
        _ => Round2::Failed(format!("unexpected reply {fields:?}")),
    }
}

/// Parses the reply to `SET … NX`: `OK` when set, nil when the key exists.
pub(super) fn parse_set(value: Value) -> Result<bool, String> {
    match value {
        Value::Okay => Ok(true),
        Value::Nil => Ok(false),
        other => {
            server_error(&other).map_or_else(|| Err(format!("unexpected reply {other:?}")), Err)
        }
    }
}

/// Parses an integer reply.
pub(super) fn parse_integer(value: Value) -> Result<i64, String> {
    if let Some(error) = server_error(&value) {
        return Err(error);
    }
    match value {
        Value::Int(n) => Ok(n),
        other => Err(format!("unexpected reply {other:?}")),
    }
}
