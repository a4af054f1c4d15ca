//! The ZooKeeper store over TLS against a real member that serves it ([`ZkEnsemble::with_tls`]): the
//! `zookeeper.tls` section as an operator writes it, end to end.

use std::time::Duration;

use redcron::lock::ClaimOutcome;
use redcron::store::Store;
use testkit::ZkEnsemble;

use crate::conformance::request;
use crate::support::{claim_until_final, won, TestDir, SETTLE};

/// TLS as a ZooKeeper operator sets it up: a member that serves clients over TLS and requires a client
/// certificate; a store built from a `jobs.yaml` whose `zookeeper.tls` names the CA, the client
/// certificate and key claims, renews and releases through it, and a token rises; a store without a
/// client certificate is refused by the server and never granted anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_work_over_tls_with_a_client_certificate() {
    let ensemble = ZkEnsemble::with_tls();
    let address = ensemble.secure_address().expect("a TLS port");
    let (ca, cert, key) = ensemble.certificate();
    let dir = TestDir::new();
    let store_with = |identity: bool| {
        let identity = if identity {
            format!(
                ", cert_file: {}, key_file: {}",
                cert.display(),
                key.display()
            )
        } else {
            String::new()
        };
        let yaml = format!(
            "zookeeper:\n  hosts: [\"{address}\"]\n  tls: {{ca_file: {}{identity}}}\n{}\
             jobs:\n  - {{name: a, schedule: \"* * * * *\", command: [\"true\"]}}\n",
            ca.display(),
            testkit::stores::ZK_LEASES,
        );
        let config = redcron::config::parse_with_env(&yaml, &dir.join("jobs.yaml"), &|_| None)
            .unwrap_or_else(|e| panic!("{e}"));
        Store::open(&config).expect("the TLS files are readable")
    };

    let store = store_with(true);
    let first = won(claim_until_final(&store, &request("w", "tls", 1_000), SETTLE).await);
    let mut lease = won(claim_until_final(&store, &request("w", "tls-2", 1_000), SETTLE).await);
    assert!(
        lease.token > first.token,
        "{} after {}",
        lease.token,
        first.token
    );
    store.renew(&mut lease).await.expect("renewed over TLS");
    store.release(&lease).await;
    let again = store.claim(&request("v", "tls-2", 1_000)).await;
    assert!(
        matches!(again, ClaimOutcome::AlreadyClaimed { .. }),
        "{again:?}"
    );

    let anonymous = store_with(false);
    let refused = claim_until_final(
        &anonymous,
        &request("x", "tls", 2_000),
        Duration::from_secs(5),
    )
    .await;
    eprintln!("without a client certificate: {refused:?}");
    assert!(
        !matches!(refused, ClaimOutcome::Won(_)),
        "a client without a certificate was granted a tick: {refused:?}"
    );
}
