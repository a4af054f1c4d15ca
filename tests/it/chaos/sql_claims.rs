//! What the SQL server granted: every write of every claim record and lease, kept by the server itself in
//! a table of the test's own — the SQL run's counterpart of the Redis nodes' append-only files
//! ([`super::claims`]) and of etcd's history ([`super::etcd_claims`]).
//!
//! A claim overwrites its job's one row in `redcron_claims` (its primary key is the claim key), so the
//! table read at the end holds each job's last claim only. Before any worker starts, the harness creates
//! the store's tables as the workers' user would ([`redcron::store::sql::Schema::script`]: the workers'
//! schema check then finds them as they would have made them) and, as the administrator, a row trigger on
//! `redcron_claims` and one on `redcron_leases` that copy every row written (insert, or update by an
//! upsert or a renewal) into `chaos_grants`. A trigger runs inside the writing transaction, so a row of
//! `chaos_grants` exists exactly when the claim (or lease) committed — rolled back with it, lost with it,
//! kept across a server crash with it (fsync on) — whether or not its worker lived to log `tick.won`. Each
//! claim row is read back as a claim record `<tick> <value>` confirmed on node 0, the only one: a
//! majority of one, so two claimants with a row for one tick would be a double grant. Each lease row is
//! read as a lease write whose expiry is the server's `expires_us` (the server and the test share the
//! machine's clock), as the AOF's `PXAT` is on Redis. (`chaos_probe` is the probe's row: [`super::probe`].)

use testkit::sql::{PASSWORD, USER};
use testkit::{SqlKind, SqlServer};

use super::claims::{self, ClaimWrite};

/// The table the triggers write.
const GRANTS: &str = "chaos_grants";
/// The workers' key prefix (the default `key_prefix`).
const PREFIX: &str = "redcron";

/// Creates the store's tables on `server` as the workers' user, and the triggers that record every claim
/// and lease write; panics if the server refuses (the run's evidence would be missing).
pub fn record_grants(server: &SqlServer) {
    let kind = server.kind();
    let schema = redcron::store::sql::Schema::new(kind.dialect(), PREFIX);
    server
        .try_exec_as(USER, PASSWORD, &schema.script())
        .unwrap_or_else(|e| panic!("cannot create the store's tables: {e}"));
    let (claims, leases) = (format!("{PREFIX}_claims"), format!("{PREFIX}_leases"));
    let probe = "CREATE TABLE chaos_probe (id INT PRIMARY KEY, n BIGINT NOT NULL);
                 INSERT INTO chaos_probe VALUES (1, 0);\n";
    let sql = match kind {
        SqlKind::Postgres => format!(
            "{probe}CREATE TABLE {GRANTS} (seq BIGSERIAL PRIMARY KEY, kind CHAR(1) NOT NULL, \
               lock_key TEXT NOT NULL, at BIGINT NOT NULL, value TEXT NOT NULL);
             CREATE FUNCTION chaos_claim_written() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
               BEGIN INSERT INTO {GRANTS} (kind, lock_key, at, value)
                 VALUES ('c', NEW.lock_key, NEW.tick, NEW.value); RETURN NULL; END $$;
             CREATE FUNCTION chaos_lease_written() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
               BEGIN INSERT INTO {GRANTS} (kind, lock_key, at, value)
                 VALUES ('l', NEW.lock_key, NEW.expires_us / 1000, NEW.value); RETURN NULL; END $$;
             CREATE TRIGGER chaos_claims AFTER INSERT OR UPDATE ON {claims}
               FOR EACH ROW EXECUTE FUNCTION chaos_claim_written();
             CREATE TRIGGER chaos_leases AFTER INSERT OR UPDATE ON {leases}
               FOR EACH ROW EXECUTE FUNCTION chaos_lease_written();"
        ),
        SqlKind::Mariadb => {
            let trigger = |name: &str, event: &str, table: &str, kind: char, at: &str| {
                format!(
                    "CREATE TRIGGER {name} AFTER {event} ON {table} FOR EACH ROW \
                     INSERT INTO {GRANTS} (kind, lock_key, at, value) \
                     VALUES ('{kind}', NEW.lock_key, {at}, NEW.value);\n"
                )
            };
            format!(
                "{probe}CREATE TABLE {GRANTS} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, kind CHAR(1) NOT NULL, \
                   lock_key VARCHAR(1024) NOT NULL, at BIGINT NOT NULL, value MEDIUMTEXT NOT NULL) \
                   ENGINE = InnoDB;\n{}{}{}{}",
                trigger("chaos_claims_i", "INSERT", &claims, 'c', "NEW.tick"),
                trigger("chaos_claims_u", "UPDATE", &claims, 'c', "NEW.tick"),
                trigger("chaos_leases_i", "INSERT", &leases, 'l', "NEW.expires_us DIV 1000"),
                trigger("chaos_leases_u", "UPDATE", &leases, 'l', "NEW.expires_us DIV 1000"),
            )
        }
    };
    server
        .try_exec(&sql)
        .unwrap_or_else(|e| panic!("cannot install the grant-recording triggers: {e}"));
}

/// Every claim and lease write the server committed, in commit order of their rows, as written on node
/// 0; panics if the server cannot be read.
pub fn read_grants(server: &SqlServer) -> Vec<ClaimWrite> {
    let rows = server
        .try_exec(&format!(
            "SELECT kind, lock_key, at, value FROM {GRANTS} ORDER BY seq"
        ))
        .unwrap_or_else(|e| panic!("cannot read the SQL server's record of grants: {e}"));
    rows.lines()
        .filter_map(|row| {
            let mut fields = row.splitn(4, '\t');
            let (kind, key, at, value) = (
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
            );
            match kind {
                "c" => claims::parse_set(0, key, &format!("{at} {value}")),
                _ => claims::parse_lease(0, key, value, at.parse().ok()?),
            }
        })
        .collect()
}
