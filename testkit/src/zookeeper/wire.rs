//! [`ZkSession`]: a minimal ZooKeeper client written against the wire protocol (jute), for the harness
//! and the tests to look at and tamper with an ensemble without the store's client: create, read, write,
//! list, delete, and delete a whole tree.
//!
//! It is blocking, speaks one request at a time on one connection to one member, and never reconnects:
//! a session lost or a member gone is an error, and the caller asks again on another member if it cares.
//! Every read is bounded (a reply larger than [`MAX_REPLY`] is an error), so planted garbage cannot make
//! the harness allocate without limit.

use std::io::{self, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The largest reply read: ZooKeeper's own default `jute.maxbuffer` (1 MiB) and room for its header.
pub const MAX_REPLY: usize = (1 << 20) + 4096;

/// ZooKeeper's error code for a node that does not exist (`NONODE`).
pub const NO_NODE: i32 = -101;
/// ZooKeeper's error code for a node that exists already (`NODEEXISTS`).
pub const NODE_EXISTS: i32 = -110;
/// ZooKeeper's error code for a node that still has children (`NOTEMPTY`).
pub const NOT_EMPTY: i32 = -111;

/// One client session on one member, closed on drop.
pub struct ZkSession {
    stream: TcpStream,
    xid: i32,
    /// The session's id, as the ensemble granted it.
    pub session_id: i64,
}

/// A node's data and the zxid of its creation (`czxid`) and of its last change (`mzxid`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub data: Vec<u8>,
    pub czxid: i64,
    pub mzxid: i64,
    /// Nonzero for an ephemeral node: the session that owns it.
    pub ephemeral_owner: i64,
    pub num_children: i32,
}

/// A request's outcome: ZooKeeper's error code when it answered with one, or a broken connection.
#[derive(Debug)]
pub enum WireError {
    /// The server's answer was this error code (`NONODE` = -101, `NODEEXISTS` = -110, ...).
    Code(i32),
    Io(io::Error),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Code(code) => write!(f, "ZooKeeper error code {code}"),
            WireError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl From<io::Error> for WireError {
    fn from(e: io::Error) -> Self {
        WireError::Io(e)
    }
}

const CREATE: i32 = 1;
const DELETE: i32 = 2;
const GET_DATA: i32 = 4;
const SET_DATA: i32 = 5;
const GET_CHILDREN: i32 = 8;
const CLOSE_SESSION: i32 = -11;

impl ZkSession {
    /// A session of `timeout` (which the member may clamp to its bounds) on the member at `port`, each
    /// read and write bounded by `timeout` too; an error if the member does not grant one (no quorum).
    pub fn connect(port: u16, timeout: Duration) -> io::Result<ZkSession> {
        let mut stream =
            TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        // ConnectRequest: protocolVersion, lastZxidSeen, timeOut (ms), sessionId, passwd, readOnly.
        let mut request = Vec::new();
        put_i32(&mut request, 0);
        put_i64(&mut request, 0);
        put_i32(
            &mut request,
            i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX),
        );
        put_i64(&mut request, 0);
        put_bytes(&mut request, &[0u8; 16]);
        request.push(0);
        send(&mut stream, &request)?;
        // ConnectResponse: protocolVersion, timeOut, sessionId, passwd (, readOnly).
        let response = receive(&mut stream, 4096)?;
        let mut reader = Reader(&response);
        let (_, _, session_id) = (reader.i32()?, reader.i32()?, reader.i64()?);
        if session_id == 0 {
            return Err(io::Error::other(
                "the member granted no session (no quorum?)",
            ));
        }
        Ok(ZkSession {
            stream,
            xid: 0,
            session_id,
        })
    }

    /// Creates `path` with `data`, open to anyone (`world:anyone`, all permissions), persistent; the
    /// created path.
    pub fn create(&mut self, path: &str, data: &[u8]) -> Result<String, WireError> {
        let mut body = Vec::new();
        put_str(&mut body, path);
        put_bytes(&mut body, data);
        put_i32(&mut body, 1); // one ACL
        put_i32(&mut body, 31); // ALL
        put_str(&mut body, "world");
        put_str(&mut body, "anyone");
        put_i32(&mut body, 0); // persistent
        let reply = self.call(CREATE, &body)?;
        Ok(Reader(&reply).string()?)
    }

    /// [`Self::create`] of `path` and of each missing parent, with `data` on `path` only; a `path` that
    /// exists already is left as it is.
    pub fn create_all(&mut self, path: &str, data: &[u8]) -> Result<(), WireError> {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        for end in 1..=parts.len() {
            let at = format!("/{}", parts[..end].join("/"));
            let data = if end == parts.len() { data } else { &[] };
            match self.create(&at, data) {
                Ok(_) | Err(WireError::Code(NODE_EXISTS)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// `path`'s data and stat.
    pub fn get(&mut self, path: &str) -> Result<Node, WireError> {
        let mut body = Vec::new();
        put_str(&mut body, path);
        body.push(0); // no watch
        let reply = self.call(GET_DATA, &body)?;
        let mut reader = Reader(&reply);
        let data = reader.bytes()?;
        // Stat: czxid, mzxid, ctime, mtime, version, cversion, aversion, ephemeralOwner, dataLength,
        // numChildren, pzxid.
        let (czxid, mzxid) = (reader.i64()?, reader.i64()?);
        let _times = (reader.i64()?, reader.i64()?);
        let _versions = (reader.i32()?, reader.i32()?, reader.i32()?);
        let ephemeral_owner = reader.i64()?;
        let (_length, num_children) = (reader.i32()?, reader.i32()?);
        Ok(Node {
            data,
            czxid,
            mzxid,
            ephemeral_owner,
            num_children,
        })
    }

    /// The names of `path`'s children (unordered, as ZooKeeper answers).
    pub fn children(&mut self, path: &str) -> Result<Vec<String>, WireError> {
        let mut body = Vec::new();
        put_str(&mut body, path);
        body.push(0); // no watch
        let reply = self.call(GET_CHILDREN, &body)?;
        let mut reader = Reader(&reply);
        let count = reader.i32()?;
        (0..count.max(0)).map(|_| Ok(reader.string()?)).collect()
    }

    /// Replaces `path`'s data (any version).
    pub fn set_data(&mut self, path: &str, data: &[u8]) -> Result<(), WireError> {
        let mut body = Vec::new();
        put_str(&mut body, path);
        put_bytes(&mut body, data);
        put_i32(&mut body, -1);
        self.call(SET_DATA, &body).map(|_| ())
    }

    /// Deletes `path` (any version).
    pub fn delete(&mut self, path: &str) -> Result<(), WireError> {
        let mut body = Vec::new();
        put_str(&mut body, path);
        put_i32(&mut body, -1);
        self.call(DELETE, &body).map(|_| ())
    }

    /// Every node under `path` (not `path` itself), depth first; a node that vanished meanwhile is
    /// skipped.
    pub fn descendants(&mut self, path: &str) -> Result<Vec<String>, WireError> {
        let mut found = Vec::new();
        let mut pending = vec![path.to_string()];
        while let Some(parent) = pending.pop() {
            let names = match self.children(&parent) {
                Ok(names) => names,
                Err(WireError::Code(NO_NODE)) => continue,
                Err(e) => return Err(e),
            };
            for name in names {
                let child = format!("{}/{name}", parent.trim_end_matches('/'));
                found.push(child.clone());
                pending.push(child);
            }
        }
        Ok(found)
    }

    /// Deletes `path` and everything under it (`/` keeps itself and ZooKeeper's own `/zookeeper`); a node
    /// that vanished meanwhile is fine, one that gained a child meanwhile is tried again.
    pub fn delete_tree(&mut self, path: &str) -> Result<(), WireError> {
        for _ in 0..10 {
            let mut nodes = self.descendants(path)?;
            nodes.retain(|n| n != "/zookeeper" && !n.starts_with("/zookeeper/"));
            // Deepest first: a parent after its children.
            nodes.sort_by_key(|n| std::cmp::Reverse(n.matches('/').count()));
            if path != "/" {
                nodes.push(path.to_string());
            }
            let mut again = false;
            for node in nodes {
                match self.delete(&node) {
                    Ok(()) | Err(WireError::Code(NO_NODE)) => {}
                    Err(WireError::Code(NOT_EMPTY)) => again = true,
                    Err(e) => return Err(e),
                }
            }
            if !again {
                return Ok(());
            }
        }
        Err(WireError::Code(NOT_EMPTY))
    }

    /// One request and its reply's body; a reply with an error code is [`WireError::Code`].
    fn call(&mut self, op: i32, body: &[u8]) -> Result<Vec<u8>, WireError> {
        self.xid += 1;
        let mut request = Vec::with_capacity(8 + body.len());
        put_i32(&mut request, self.xid);
        put_i32(&mut request, op);
        request.extend_from_slice(body);
        send(&mut self.stream, &request)?;
        loop {
            let reply = receive(&mut self.stream, MAX_REPLY)?;
            let mut reader = Reader(&reply);
            let (xid, _zxid, err) = (reader.i32()?, reader.i64()?, reader.i32()?);
            // -2 is a ping's answer, -1 a watch event: neither is ours.
            if xid != self.xid {
                continue;
            }
            if err != 0 {
                return Err(WireError::Code(err));
            }
            return Ok(reader.0.to_vec());
        }
    }
}

impl Drop for ZkSession {
    /// Closes the session, so that its ephemeral nodes (none: this client makes none) and the session
    /// itself go at once rather than at its timeout.
    fn drop(&mut self) {
        let _ = self.call(CLOSE_SESSION, &[]);
    }
}

/// A four-letter word's answer from the member on `port` (bounded: 64 KiB, 1 s), if it answers.
pub(super) fn four_letter_word(port: u16, word: &str) -> Option<String> {
    let timeout = Duration::from_secs(1);
    let mut stream =
        TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    stream.write_all(word.as_bytes()).ok()?;
    let mut answer = Vec::new();
    stream.take(64 * 1024).read_to_end(&mut answer).ok()?;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    (!answer.is_empty() && !answer.contains("not currently serving")).then_some(answer)
}

fn put_i32(out: &mut Vec<u8>, v: i32) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_bytes(out: &mut Vec<u8>, v: &[u8]) {
    put_i32(out, i32::try_from(v.len()).unwrap_or(i32::MAX));
    out.extend_from_slice(v);
}

fn put_str(out: &mut Vec<u8>, v: &str) {
    put_bytes(out, v.as_bytes());
}

/// Writes one length-framed packet.
fn send(stream: &mut TcpStream, body: &[u8]) -> io::Result<()> {
    let length = i32::try_from(body.len()).map_err(io::Error::other)?;
    let mut packet = Vec::with_capacity(4 + body.len());
    put_i32(&mut packet, length);
    packet.extend_from_slice(body);
    stream.write_all(&packet)
}

/// Reads one length-framed packet of at most `limit` bytes.
fn receive(stream: &mut TcpStream, limit: usize) -> io::Result<Vec<u8>> {
    let mut length = [0u8; 4];
    stream.read_exact(&mut length)?;
    let length = usize::try_from(i32::from_be_bytes(length))
        .ok()
        .filter(|l| *l <= limit)
        .ok_or_else(|| io::Error::other("a ZooKeeper packet of a bad or too large length"))?;
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body)?;
    Ok(body)
}

/// Reads jute's big-endian fields off a reply.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        if self.0.len() < n {
            return Err(io::Error::other("a ZooKeeper reply cut short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn i32(&mut self) -> io::Result<i32> {
        let bytes = self.take(4)?;
        Ok(i32::from_be_bytes(
            bytes.try_into().map_err(io::Error::other)?,
        ))
    }

    fn i64(&mut self) -> io::Result<i64> {
        let bytes = self.take(8)?;
        Ok(i64::from_be_bytes(
            bytes.try_into().map_err(io::Error::other)?,
        ))
    }

    /// A buffer: its length (-1 for none), then its bytes.
    fn bytes(&mut self) -> io::Result<Vec<u8>> {
        let length = self.i32()?;
        if length < 0 {
            return Ok(Vec::new());
        }
        Ok(self.take(length as usize)?.to_vec())
    }

    fn string(&mut self) -> io::Result<String> {
        Ok(String::from_utf8_lossy(&self.bytes()?).into_owned())
    }
}
