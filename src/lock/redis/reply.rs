//! Parsing the scripts' replies: every reply is data from the network, so nothing here panics.

use redis::Value;

/// What one node answered to round 1 of one claim.
#[derive(Debug)]
pub(super) enum Round1 {
    Ok { fence: u64 },
    Claimed,
    Busy { holder: String, pttl_ms: i64 },
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
        Value::ServerError(error) => Some(format!("{error:?}")),
        _ => None,
    }
}

/// Parses round 1's `{"ok", fence}` / `{"claimed", claim}` / `{"busy", holder, pttl}`.
pub(super) fn parse_round1(value: Value) -> Round1 {
    if let Some(error) = server_error(&value) {
        return Round1::Failed(error);
    }
    let Value::Array(items) = value else {
        return Round1::Failed(format!("unexpected reply {value:?}"));
    };
    let fields: Vec<String> = items.iter().filter_map(text).collect();
    match fields.as_slice() {
        [status, fence] if status == "ok" => match fence.parse() {
            Ok(fence) => Round1::Ok { fence },
            Err(_) => Round1::Failed(format!("bad fence counter {fence:?}")),
        },
        [status, _] if status == "claimed" => Round1::Claimed,
        [status, holder, pttl] if status == "busy" => Round1::Busy {
            holder: holder.clone(),
            pttl_ms: pttl.parse().unwrap_or(-1),
        },
        _ => Round1::Failed(format!("unexpected reply {fields:?}")),
    }
}

/// Parses a status string (`"ok"`, `"lost"`, `"claimed"`).
pub(super) fn parse_status(value: Value) -> Result<String, String> {
    if let Some(error) = server_error(&value) {
        return Err(error);
    }
    text(&value).ok_or_else(|| format!("unexpected reply {value:?}"))
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
