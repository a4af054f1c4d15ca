//! One Redis node of the lock: its address (never shown with a password) and its connection.
//!
//! Connections are opened lazily and re-opened by redis-rs's `ConnectionManager` after an I/O error, so a
//! node that is down when the worker starts, or that dies later, is simply a failed vote until it is back.
//! Every request is bounded by the caller's per-node timeout: a hung node (SIGSTOP, a black-holed route)
//! costs one timeout per round, never a TCP or client timeout.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Pipeline, Value};

use crate::store::StoreError;

/// The address of a node for logs and errors: the URL with any password replaced by `***`.
///
/// `redis://user:secret@host:6379/2` becomes `redis://user:***@host:6379/2`; a URL that does not parse is
/// shown as its scheme and host part only, so nothing after an `@` can leak.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (scheme, rest),
        None => return "<invalid URL>".to_string(),
    };
    // The authority ends at the first '/' after the last '@' (passwords may contain '/', but not '@').
    let Some(at) = rest.rfind('@') else {
        return url.to_string();
    };
    let (userinfo, host) = (&rest[..at], &rest[at + 1..]);
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
        None => format!("{scheme}://{userinfo}@{host}"),
    }
}

/// A Redis node: a lazily connected, self-reconnecting multiplexed connection.
pub(crate) struct Node {
    /// The redacted address, for logs and errors.
    pub(crate) label: String,
    connection: ConnectionManager,
}

impl Node {
    /// Prepares a node from its URL without connecting (the connection is opened on first use).
    pub(crate) fn new(url: &str, node_timeout: Duration) -> Result<Node, StoreError> {
        let label = redact(url);
        let client = redis::Client::open(url).map_err(|error| StoreError::InvalidNode {
            url: label.clone(),
            reason: error.to_string().replace(url, &label),
        })?;
        let config = ConnectionManagerConfig::new()
            // Connecting may take longer than one vote (TLS, a remote link); the attempt goes on in the
            // background while votes that cannot wait for it count the node as failed.
            .set_connection_timeout(Some(Duration::from_secs(2).max(node_timeout * 4)))
            // One attempt per reconnection: the rounds retry by themselves, and a long backoff inside the
            // manager would only hide a node that is back.
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500))
            // No response timeout here: each round bounds its own wait (see `query`).
            .set_response_timeout(None);
        let connection =
            ConnectionManager::new_lazy_with_config(client, config).map_err(|error| {
                StoreError::InvalidNode {
                    url: label.clone(),
                    reason: error.to_string(),
                }
            })?;
        Ok(Node { label, connection })
    }

    /// Sends a pipeline of `EVALSHA`s and returns one value per command, or why the node failed, all
    /// within `timeout`.
    ///
    /// A node that restarted (or flushed its script cache) answers `NOSCRIPT`; the scripts are then loaded
    /// and the pipeline sent once more. That is safe because a `NOSCRIPT` command did not run, and every
    /// script is idempotent for the same value anyway. A server error in one command comes back as
    /// `Value::ServerError` in its slot, so one bad key does not hide the answers for the others.
    pub(crate) async fn eval(
        &self,
        pipeline: &Pipeline,
        timeout: Duration,
    ) -> Result<Vec<Value>, String> {
        let mut connection = self.connection.clone();
        let exchange = async {
            let first = pipeline.query_async::<Vec<Value>>(&mut connection).await;
            if !needs_scripts(&first) {
                return first;
            }
            let mut load = redis::pipe();
            for source in super::scripts::sources() {
                load.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
            }
            for source in super::history::sources() {
                load.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
            }
            for source in super::triggers::sources() {
                load.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
            }
            for source in super::pause::sources() {
                load.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
            }
            load.query_async::<()>(&mut connection).await?;
            pipeline.query_async::<Vec<Value>>(&mut connection).await
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(values)) => Ok(values),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
        }
    }

    /// Starts connecting in the background, so that the first round does not pay for the connection.
    pub(crate) fn warm_up(&self) {
        let mut connection = self.connection.clone();
        tokio::spawn(async move {
            let _ = redis::cmd("PING")
                .query_async::<Value>(&mut connection)
                .await;
        });
    }
}

/// Whether a reply says that a script is not in the node's cache.
fn needs_scripts(reply: &redis::RedisResult<Vec<Value>>) -> bool {
    let is_noscript = |text: &str| text.contains("NOSCRIPT");
    match reply {
        Err(error) => {
            error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                || is_noscript(&error.to_string())
        }
        Ok(values) => values
            .iter()
            .any(|value| matches!(value, Value::ServerError(e) if is_noscript(&format!("{e:?}")))),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redact("redis://:s3cret@host:6379/2"),
            "redis://:***@host:6379/2"
        );
        assert_eq!(
            redact("rediss://app:p@ss:w/rd@host:6380"),
            "rediss://app:***@host:6380"
        );
        assert_eq!(redact("redis://app@host"), "redis://app@host");
        assert_eq!(redact("host:6379"), "<invalid URL>");
    }
}
