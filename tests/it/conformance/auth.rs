//! Auth: where a store is set up with credentials, a client without them changes nothing of its state —
//! it claims no tick, takes no job, lifts no pause, and the holder's lease, the claim record and the
//! pause stand. On Redis nodes with `requirepass`, an etcd cluster with auth enabled, a PostgreSQL or
//! MariaDB user's password, and ZooKeeper digest auth; not on the embedded store, whose file has the
//! operating system's permissions and no credentials.
//!
//! The client without credentials is the same store built from a config without them (a wrong password
//! for the SQL servers, which refuse a login without one). It goes first, before the store with
//! credentials: on ZooKeeper that makes the store's nodes open to anyone (`world:anyone:cdrwa`, as a
//! worker run without auth does), which the store with credentials must take over.

use std::any::Any;
use std::time::Duration;

use redcron::lock::{ClaimOutcome, InForce, Pause};
use redcron::store::Store;

use super::request;
use crate::support::{claim_until_final, claim_won, Backend, TestDir, SETTLE};

/// The password of every store with credentials here.
const PASSWORD: &str = "conformance-pw";

/// A store set up with credentials: what keeps it running, and the store section of a config with
/// them and without them.
struct Guarded {
    _running: Box<dyn Any>,
    with: String,
    without: String,
}

/// `items` as a YAML flow list of JSON strings.
fn list(items: &[String]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|item| serde_json::to_string(item).unwrap_or_default())
        .collect();
    format!("[{}]", quoted.join(", "))
}

impl Guarded {
    /// `backend` set up with credentials (see the module).
    async fn start(backend: Backend) -> Guarded {
        match backend {
            Backend::Redis => {
                let cluster = crate::support::RedisCluster::builder()
                    .nodes(3)
                    .password(PASSWORD)
                    .start();
                let bare: Vec<String> = (0..3)
                    .map(|i| format!("redis://127.0.0.1:{}", cluster.port(i)))
                    .collect();
                Guarded {
                    with: format!("redis:\n  nodes: {}\n", list(&cluster.urls())),
                    without: format!("redis:\n  nodes: {}\n", list(&bare)),
                    _running: Box::new(cluster),
                }
            }
            Backend::RedisSentinel => {
                let group = crate::support::SentinelGroup::builder()
                    .replicas(1)
                    .sentinels(1)
                    .password(PASSWORD)
                    .sentinel_password(PASSWORD)
                    .start();
                let bare = format!(
                    "{{sentinels: [{}], master: {}}}",
                    group.sentinel_addresses().join(", "),
                    group.master_name()
                );
                Guarded {
                    with: format!("redis:\n  nodes:\n    - {}\n", group.node_yaml()),
                    without: format!("redis:\n  nodes:\n    - {bare}\n"),
                    _running: Box::new(group),
                }
            }
            Backend::RedisCluster => {
                let cluster = testkit::ShardedRedis::builder().password(PASSWORD).start();
                let bare: Vec<String> = (0..cluster.len())
                    .map(|i| format!("redis://127.0.0.1:{}", cluster.nodes().port(i)))
                    .collect();
                Guarded {
                    with: format!("redis:\n  {}\n", cluster.cluster_yaml()),
                    without: format!("redis:\n  cluster: {}\n", list(&bare)),
                    _running: Box::new(cluster),
                }
            }
            Backend::Etcd => {
                let cluster = crate::support::EtcdCluster::start();
                let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
                    .await
                    .expect("connect as the administrator");
                admin
                    .user_add("root", PASSWORD, None)
                    .await
                    .expect("add root");
                admin
                    .user_grant_role("root", "root")
                    .await
                    .expect("grant root");
                admin.auth_enable().await.expect("enable auth");
                let endpoints = list(&cluster.endpoints());
                Guarded {
                    with: format!(
                        "etcd:\n  endpoints: {endpoints}\n  username: root\n  password: \"{PASSWORD}\"\n"
                    ),
                    without: format!("etcd:\n  endpoints: {endpoints}\n"),
                    _running: Box::new(cluster),
                }
            }
            Backend::Postgres | Backend::Mariadb => {
                let kind = backend.sql_kind().expect("a SQL backend");
                let server = testkit::SqlServer::start(kind);
                let section = match kind {
                    testkit::SqlKind::Postgres => "postgres",
                    testkit::SqlKind::Mariadb => "mysql",
                };
                let wrong = server.url_as(
                    testkit::sql::USER,
                    "not-the-password",
                    testkit::sql::DATABASE,
                );
                let url = |url: &str| serde_json::to_string(url).unwrap_or_default();
                Guarded {
                    with: format!(
                        "{section}:\n  url: {}\n  tls: disable\n",
                        url(&server.url())
                    ),
                    without: format!("{section}:\n  url: {}\n  tls: disable\n", url(&wrong)),
                    _running: Box::new(server),
                }
            }
            Backend::Zookeeper => {
                let zk = testkit::SharedZk::get();
                let section = format!(
                    "zookeeper:\n  hosts: {}\n  key_prefix: {}\n",
                    list(&zk.ensemble().addresses()),
                    zk.prefix()
                );
                Guarded {
                    with: format!("{section}  username: redcron\n  password: \"{PASSWORD}\"\n"),
                    without: section,
                    _running: Box::new(zk),
                }
            }
            Backend::Embedded => panic!("the embedded store has no credentials"),
        }
    }

    /// The store of `section`, with a TTL that outlasts the stranger's refused attempts.
    fn store(&self, dir: &TestDir, section: &str) -> Store {
        // `$` is doubled: the config expands `${VAR}`.
        let yaml = format!(
            "{}lock:\n  ttl: 30s\n  renew_every: 10s\n  node_timeout: 400ms\n  retry_delay: 50ms\n\
             jobs:\n  - {{name: a, schedule: \"* * * * *\", command: [\"true\"]}}\n",
            section.replace('$', "$$")
        );
        let config = redcron::config::parse_with_env(&yaml, &dir.join("jobs.yaml"), &|_| None)
            .unwrap_or_else(|e| panic!("{e}"));
        Store::open(&config).expect("a store")
    }
}

/// What a client without credentials answers once final, within a few seconds: never a grant.
async fn refused(store: &Store, job: &str, tick: i64) -> ClaimOutcome {
    let outcome = claim_until_final(
        store,
        &request("stranger", job, tick),
        Duration::from_secs(3),
    )
    .await;
    assert!(
        !matches!(outcome, ClaimOutcome::Won(_)),
        "a client without credentials was granted {job} at {tick}"
    );
    outcome
}

/// A client without credentials, before and after the store with them: no grant of a held job, of a
/// free one, no pause lifted; the holder's lease renews, its tick stays claimed, the free job is still
/// free for the store with credentials, the pause stands.
pub(super) async fn a_client_without_credentials_changes_nothing(backend: Backend) {
    let guarded = Guarded::start(backend).await;
    let dir = TestDir::new();
    let stranger = guarded.store(&dir, &guarded.without);
    // Granted on ZooKeeper, where nothing has credentials yet; refused everywhere else.
    let first = request("stranger", "warm-up", 500);
    let _ = claim_until_final(&stranger, &first, Duration::from_secs(3)).await;

    let owner = guarded.store(&dir, &guarded.with);
    let mut held = claim_won(&owner, &request("owner", "guarded", 1_000)).await;
    let pause = Pause {
        until: None,
        by: "ops@host".to_string(),
        reason: "auth test".to_string(),
    };
    owner
        .pause("paused", &pause, InForce::KeepLonger)
        .await
        .expect("paused by the owner");

    let later = refused(&stranger, "guarded", 2_000).await;
    let free = refused(&stranger, "free", 1_000).await;
    let resumed = stranger.resume("paused").await;
    let replaced = stranger.pause("guarded", &pause, InForce::Replace).await;
    eprintln!("{backend:?} without credentials: {later:?}; {free:?}; resume {resumed:?}; pause {replaced:?}");

    owner
        .renew(&mut held)
        .await
        .expect("the lease is still held");
    let again = claim_until_final(&owner, &request("other", "guarded", 1_000), SETTLE).await;
    assert!(
        matches!(again, ClaimOutcome::AlreadyClaimed { .. }),
        "the claim record of guarded at 1000 is gone: {again:?}"
    );
    let fresh = claim_won(&owner, &request("owner", "free", 1_000)).await;
    owner.release(&fresh).await;
    let still = claim_until_final(&owner, &request("owner", "paused", 1_000), SETTLE).await;
    assert!(
        matches!(still, ClaimOutcome::Paused(_)),
        "the pause was lifted by a client without credentials: {still:?}"
    );
    let guarded_pause =
        claim_until_final(&owner, &request("owner2", "guarded", 3_000), SETTLE).await;
    assert!(
        !matches!(guarded_pause, ClaimOutcome::Paused(_)),
        "a client without credentials paused a job: {guarded_pause:?}"
    );
    owner.release(&held).await;
}
