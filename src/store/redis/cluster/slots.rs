//! The slot map of a Redis Cluster: which master serves each hash slot (`CLUSTER SHARDS`, parsed and
//! bounded), the slot of a key, and where each command of a pipeline goes.

use redis::{Cmd, Value};
use tokio::time::Instant;

/// How many hash slots a Redis Cluster has.
pub(super) const SLOTS: u16 = 16384;
/// The most shards a slot map may list.
const MOST_SHARDS: usize = 1024;
/// The most nodes a slot map may list in all.
const MOST_NODES: usize = 4096;

/// Which master serves each slot, as a reading of `CLUSTER SHARDS` said.
#[derive(Debug, Default)]
pub(super) struct SlotMap {
    pub(super) shards: Vec<Shard>,
    /// Per slot, the index of its shard in `shards`; `u16::MAX` for a slot no master serves.
    pub(super) owner: Vec<u16>,
    /// When the map was read; `None` before the first reading.
    pub(super) read_at: Option<Instant>,
}

/// One shard: the slots its master serves, the master, and how many replicas are online.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Shard {
    /// Inclusive ranges, sorted.
    pub(super) ranges: Vec<(u16, u16)>,
    /// `host:port` of the master.
    pub(super) master: String,
    pub(super) replicas_up: u32,
}

impl Shard {
    /// The first slot the shard serves: what names it in the registry and in messages.
    pub(super) fn first(&self) -> u16 {
        self.ranges.first().map_or(0, |range| range.0)
    }

    /// `slots 0-5460`: what names the shard in status and metrics, whichever master serves it.
    pub(super) fn slots(&self) -> String {
        let ranges: Vec<String> = self
            .ranges
            .iter()
            .map(|&(start, end)| match start == end {
                true => start.to_string(),
                false => format!("{start}-{end}"),
            })
            .collect();
        format!("slots {}", ranges.join(","))
    }

    /// `slots 0-5460 (master 10.0.0.1:7000)`: what names the shard in errors and logs.
    pub(super) fn describe(&self) -> String {
        format!("{} (master {})", self.slots(), self.master)
    }
}

impl SlotMap {
    /// The shard that serves `slot`, if one does.
    pub(super) fn shard_of(&self, slot: u16) -> Option<usize> {
        match self.owner.get(usize::from(slot)) {
            Some(&owner) if owner != u16::MAX => Some(usize::from(owner)),
            _ => None,
        }
    }

    /// The shard whose master is at `address`, if any.
    pub(super) fn shard_at(&self, address: &str) -> Option<usize> {
        self.shards.iter().position(|shard| shard.master == address)
    }
}

/// Where a command goes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// To the master of this slot.
    Slot(u16),
    /// To any master (`TIME`, a script without keys).
    Any,
    /// Nowhere: its keys are on several slots, which no master can run.
    Spans,
}

/// `(host, port)` of `host:port` (`[v6]:port` too).
pub(super) fn split(address: &str) -> Option<(String, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    Some((host.to_string(), port.parse().ok().filter(|&p| p > 0)?))
}

/// Where `cmd` goes: a script call by its keys (all on one slot), a keyless command anywhere, any
/// other command by its first argument.
pub(super) fn route(cmd: &Cmd) -> Route {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => bytes,
            _ => b"".as_slice(),
        })
        .collect();
    let Some(name) = args.first() else {
        return Route::Any;
    };
    let name = String::from_utf8_lossy(name).to_ascii_uppercase();
    let keys: &[&[u8]] = match name.as_str() {
        "EVALSHA" | "EVAL" => {
            let count = args
                .get(2)
                .and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok())
                .unwrap_or(0);
            args.get(3..3 + count).unwrap_or(&[])
        }
        "TIME" | "PING" | "INFO" | "ROLE" => &[],
        _ => args.get(1..2).unwrap_or(&[]),
    };
    let mut slots = keys.iter().map(|key| slot(key));
    match slots.next() {
        None => Route::Any,
        Some(first) if slots.all(|other| other == first) => Route::Slot(first),
        Some(_) => Route::Spans,
    }
}

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag — what is between the first `{` and the
/// next `}`, when that is not empty — or of the whole key, modulo 16384.
pub fn slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(close) if close > 0 => &key[open + 1..open + 1 + close],
            _ => key,
        },
        None => key,
    };
    crc16(hashed) % SLOTS
}

/// CRC16/XMODEM (polynomial 0x1021, initial 0), as Redis Cluster hashes keys.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The fields of a `CLUSTER SHARDS` entry (a RESP2 array of names and values, or a RESP3 map).
fn fields(value: &Value) -> Option<Vec<(String, &Value)>> {
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    };
    match value {
        Value::Array(items) if items.len().is_multiple_of(2) => items
            .chunks(2)
            .map(|pair| Some((text(&pair[0])?, &pair[1])))
            .collect(),
        Value::Map(pairs) => pairs
            .iter()
            .map(|(name, value)| Some((text(name)?, value)))
            .collect(),
        _ => None,
    }
}

/// A text or number field as text.
fn as_text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Some(text.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The slot map of a `CLUSTER SHARDS` reply; with `tls`, nodes are reached on their `tls-port`. A
/// reply that is not such a map, lists too much, or gives one slot to two shards is an error.
pub(super) fn parse_shards(reply: &Value, tls: bool) -> Result<SlotMap, String> {
    let Value::Array(entries) = reply else {
        return Err("CLUSTER SHARDS gave no list".to_string());
    };
    if entries.len() > MOST_SHARDS {
        return Err(format!(
            "CLUSTER SHARDS listed {} shards, more than {MOST_SHARDS}",
            entries.len()
        ));
    }
    let mut map = SlotMap {
        shards: Vec::new(),
        owner: vec![u16::MAX; usize::from(SLOTS)],
        read_at: Some(Instant::now()),
    };
    let mut nodes_seen = 0;
    for entry in entries {
        let entry_fields = fields(entry).ok_or("a CLUSTER SHARDS entry is not a map")?;
        let get = |name: &str| {
            entry_fields
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| *v)
        };
        let slots = match get("slots") {
            Some(Value::Array(slots)) => slots,
            _ => return Err("a shard has no `slots` list".to_string()),
        };
        let bounds: Vec<u16> = slots
            .iter()
            .map(|slot| {
                as_text(slot)
                    .and_then(|text| text.parse::<u16>().ok())
                    .filter(|&slot| slot < SLOTS)
            })
            .collect::<Option<_>>()
            .ok_or("a shard lists a slot that is not 0 to 16383")?;
        if !bounds.len().is_multiple_of(2) {
            return Err("a shard's `slots` are not pairs of bounds".to_string());
        }
        let mut ranges: Vec<(u16, u16)> = bounds
            .chunks(2)
            .map(|pair| (pair[0], pair[1]))
            .filter(|(start, end)| start <= end)
            .collect();
        ranges.sort_unstable();
        let nodes = match get("nodes") {
            Some(Value::Array(nodes)) => nodes,
            _ => return Err("a shard has no `nodes` list".to_string()),
        };
        nodes_seen += nodes.len();
        if nodes_seen > MOST_NODES {
            return Err(format!(
                "CLUSTER SHARDS listed more than {MOST_NODES} nodes"
            ));
        }
        let mut master: Option<(String, bool)> = None;
        let mut replicas_up = 0;
        for node in nodes {
            let node_fields = fields(node).ok_or("a shard's node is not a map")?;
            let get = |name: &str| {
                node_fields
                    .iter()
                    .find(|(n, _)| n == name)
                    .and_then(|(_, v)| as_text(v))
            };
            let online = get("health").as_deref() == Some("online");
            match get("role").as_deref() {
                Some("master") => {
                    let host = get("endpoint")
                        .filter(|endpoint| !endpoint.is_empty() && endpoint != "?")
                        .or_else(|| get("ip"))
                        .filter(|host| !host.is_empty() && host.len() <= 255)
                        .ok_or("a master has no address")?;
                    let port = get(if tls { "tls-port" } else { "port" })
                        .and_then(|port| port.parse::<u16>().ok())
                        .filter(|&port| port > 0)
                        .ok_or(if tls {
                            "a master has no tls-port (is TLS on in the cluster?)"
                        } else {
                            "a master has no port"
                        })?;
                    let address = match host.contains(':') {
                        true => format!("[{host}]:{port}"),
                        false => format!("{host}:{port}"),
                    };
                    // Two masters in one shard (a view in flux): the online one.
                    if master
                        .as_ref()
                        .is_none_or(|(_, was_online)| !was_online && online)
                    {
                        master = Some((address, online));
                    }
                }
                _ if online => replicas_up += 1,
                _ => {}
            }
        }
        if ranges.is_empty() {
            continue;
        }
        let Some((master, _)) = master else {
            continue;
        };
        let index = u16::try_from(map.shards.len()).map_err(|_| "too many shards")?;
        for &(start, end) in &ranges {
            for slot in start..=end {
                let owner = &mut map.owner[usize::from(slot)];
                if *owner != u16::MAX {
                    return Err(format!("slot {slot} is listed in two shards"));
                }
                *owner = index;
            }
        }
        map.shards.push(Shard {
            ranges,
            master,
            replicas_up,
        });
    }
    if map.shards.is_empty() {
        return Err("CLUSTER SHARDS listed no master that serves slots".to_string());
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::{crc16, parse_shards, route, slot, Route};

    /// The hash slots Redis computes (`CLUSTER KEYSLOT`), hash tags included.
    #[test]
    fn slots_are_redis_cluster_slots() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        // An empty tag hashes the whole key.
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"rc:{nightly}:lease"), slot(b"rc:{nightly}:fence"));
    }

    /// A script call goes to its keys' slot, a call across slots nowhere, `TIME` anywhere.
    #[test]
    fn commands_are_routed_by_their_keys() {
        let mut call = redis::cmd("EVALSHA");
        call.arg("abc")
            .arg(2)
            .arg("p:{a}:lease")
            .arg("p:{a}:fence")
            .arg("x");
        assert_eq!(route(&call), Route::Slot(slot(b"a")));
        let mut spans = redis::cmd("EVALSHA");
        spans
            .arg("abc")
            .arg(2)
            .arg("p:{a}:lease")
            .arg("p:{b}:lease");
        assert_eq!(route(&spans), Route::Spans);
        let mut none = redis::cmd("EVALSHA");
        none.arg("abc").arg(0).arg("x");
        assert_eq!(route(&none), Route::Any);
        assert_eq!(route(&redis::cmd("TIME")), Route::Any);
        let mut get = redis::cmd("GET");
        get.arg("p:{b}:paused");
        assert_eq!(route(&get), Route::Slot(slot(b"b")));
    }

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn node(port: i64, role: &str, health: &str) -> Value {
        Value::Array(vec![
            bulk("id"),
            bulk("abc"),
            bulk("port"),
            Value::Int(port),
            bulk("ip"),
            bulk("127.0.0.1"),
            bulk("endpoint"),
            bulk("127.0.0.1"),
            bulk("role"),
            bulk(role),
            bulk("health"),
            bulk(health),
        ])
    }

    fn shard(slots: &[i64], nodes: Vec<Value>) -> Value {
        Value::Array(vec![
            bulk("slots"),
            Value::Array(slots.iter().map(|&s| Value::Int(s)).collect()),
            bulk("nodes"),
            Value::Array(nodes),
        ])
    }

    /// A reply of three shards maps every slot to its master and counts the replicas online.
    #[test]
    fn a_shards_reply_maps_every_slot() {
        let reply = Value::Array(vec![
            shard(
                &[0, 5460],
                vec![
                    node(7000, "master", "online"),
                    node(7003, "replica", "online"),
                ],
            ),
            shard(
                &[5461, 10922],
                vec![
                    node(7001, "master", "online"),
                    node(7004, "replica", "failed"),
                ],
            ),
            shard(
                &[10923, 16383],
                vec![
                    node(7005, "replica", "online"),
                    node(7002, "master", "online"),
                ],
            ),
        ]);
        let map = parse_shards(&reply, false).expect("a map");
        assert_eq!(map.shards.len(), 3);
        let of = |slot: u16| &map.shards[map.shard_of(slot).unwrap()];
        assert_eq!(of(0).master, "127.0.0.1:7000");
        assert_eq!(of(5460).replicas_up, 1);
        assert_eq!(of(5461).master, "127.0.0.1:7001");
        assert_eq!(of(5461).replicas_up, 0);
        assert_eq!(of(16383).master, "127.0.0.1:7002");
        assert_eq!(
            of(16383).describe(),
            "slots 10923-16383 (master 127.0.0.1:7002)"
        );
    }

    /// What a hostile or broken server sends is an error, not a map: overlapping shards, a slot out
    /// of range, a master without a port, a reply that is no list.
    #[test]
    fn a_bad_shards_reply_is_an_error() {
        let overlapping = Value::Array(vec![
            shard(&[0, 100], vec![node(7000, "master", "online")]),
            shard(&[100, 16383], vec![node(7001, "master", "online")]),
        ]);
        assert!(parse_shards(&overlapping, false)
            .unwrap_err()
            .contains("two shards"));
        let out_of_range = Value::Array(vec![shard(
            &[0, 16384],
            vec![node(7000, "master", "online")],
        )]);
        assert!(parse_shards(&out_of_range, false).is_err());
        let no_port = Value::Array(vec![shard(&[0, 16383], vec![node(0, "master", "online")])]);
        assert!(parse_shards(&no_port, false).is_err());
        assert!(parse_shards(&Value::Int(3), false).is_err());
        let no_master = Value::Array(vec![shard(
            &[0, 16383],
            vec![node(7000, "replica", "online")],
        )]);
        assert!(parse_shards(&no_master, false).is_err());
    }
}
