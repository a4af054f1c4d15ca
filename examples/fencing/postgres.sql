-- postgres.sql: the job's write to PostgreSQL, committed only if the run's fencing token raised the
-- resource's fence row — in the same transaction (a psql script: psql -v resource=… -v value=…
-- -v token="$REDCRON_FENCING_TOKEN" -f postgres.sql; postgres.sh runs it). Prints `written` or `refused`.
--
-- Guarantees: the UPDATE raises the fence only if the token is above it, and holds the row's lock until
-- COMMIT or ROLLBACK; a concurrent run waits for that lock and then re-reads the row (READ COMMITTED, or
-- any stricter level, where it fails with a serialization error instead). So the job's writes commit only
-- for a token above every token that committed before, whatever the order the runs arrive in. A check in
-- a statement (or transaction) of its own before the write would be a race: a newer run could commit
-- between the check and the write.
--
-- Limits: only writes made in a transaction that raised the fence are fenced; every writer of the
-- resource must go through its fence row. A paused run that holds the row's lock makes the next run wait
-- for it (set lock_timeout, and idle_in_transaction_session_timeout, which ends the paused session and
-- rolls its transaction back). Side effects outside this database are not undone by the ROLLBACK.
BEGIN;
-- The resource's fence row, at 0 the first time (a no-op after).
INSERT INTO fence (resource, token) VALUES (:'resource', 0) ON CONFLICT (resource) DO NOTHING;
-- The check and the fence, one statement: 1 row if this token is above the fence, 0 if a run with this
-- token or a higher one has written.
UPDATE fence SET token = :'token'::numeric
 WHERE resource = :'resource'
   AND token < :'token'::numeric;
\if :ROW_COUNT
    -- The job's writes, in the fenced transaction.
    INSERT INTO report (resource, value, token) VALUES (:'resource', :'value', :'token'::numeric)
        ON CONFLICT (resource) DO UPDATE SET value = EXCLUDED.value, token = EXCLUDED.token;
    COMMIT;
    \echo written
\else
    ROLLBACK;
    \echo refused
\endif
