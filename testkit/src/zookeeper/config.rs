//! A test member's files: its `zoo.cfg`, a quiet `log4j.properties`, and `data/myid`.
//!
//! `tickTime` is 250 ms, so the member grants session timeouts from 500 ms to 20 s (the store's 4 s ones
//! included) and drops a silent follower after `syncLimit` (2 s). No admin server, only the `srvr`,
//! `ruok` and `mntr` four-letter words, small preallocated logs, no purging (the chaos run reads every
//! transaction log at the end). A TLS member also serves a secure client port with PEM stores, requiring
//! a client certificate.

use std::path::Path;

/// Writes member `i`'s files into `dir`: its client port, the ensemble's `(quorum, election)` ports (none
/// for a standalone member), and `(TLS port, directory of server.pem and ca.pem)` for a TLS member.
pub(super) fn write(
    dir: &Path,
    i: usize,
    client_port: u16,
    peers: &[(u16, u16)],
    tls: Option<(u16, &Path)>,
) {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).expect("cannot create a member directory");
    std::fs::write(data.join("myid"), format!("{}\n", i + 1)).expect("cannot write myid");
    let mut config = format!(
        "tickTime=250\n\
         initLimit=40\n\
         syncLimit=8\n\
         minSessionTimeout=500\n\
         maxSessionTimeout=20000\n\
         dataDir={}\n\
         clientPortAddress=127.0.0.1\n\
         clientPort={client_port}\n\
         admin.enableServer=false\n\
         4lw.commands.whitelist=srvr,ruok,mntr\n\
         maxClientCnxns=0\n\
         preAllocSize=4096\n\
         snapCount=10000\n\
         autopurge.purgeInterval=0\n",
        data.display(),
    );
    if !peers.is_empty() {
        config.push_str("standaloneEnabled=false\n");
        for (m, (quorum, election)) in peers.iter().enumerate() {
            config.push_str(&format!("server.{}=127.0.0.1:{quorum}:{election}\n", m + 1));
        }
    }
    if let Some((port, pems)) = tls {
        let pem = |name: &str| pems.join(name).display().to_string();
        config.push_str(&format!(
            "secureClientPortAddress=127.0.0.1\n\
             secureClientPort={port}\n\
             serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
             ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
             ssl.trustStore.location={}\nssl.trustStore.type=PEM\n\
             ssl.clientAuth=need\n",
            pem("server.pem"),
            pem("ca.pem"),
        ));
    }
    std::fs::write(dir.join("zoo.cfg"), config).expect("cannot write zoo.cfg");
    // Warnings and the quorum's own news (elections, who leads, followers lost), not every session.
    std::fs::write(
        dir.join("log4j.properties"),
        "log4j.rootLogger=WARN, FILE\n\
         log4j.logger.org.apache.zookeeper.server.quorum.QuorumPeer=INFO\n\
         log4j.logger.org.apache.zookeeper.server.quorum.Leader=INFO\n\
         log4j.appender.FILE=org.apache.log4j.ConsoleAppender\n\
         log4j.appender.FILE.layout=org.apache.log4j.PatternLayout\n\
         log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{1}: %m%n\n",
    )
    .expect("cannot write log4j.properties");
}
