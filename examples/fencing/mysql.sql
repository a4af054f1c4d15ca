-- mysql.sql: the job's write to MySQL or MariaDB, made only if the run's fencing token raised the
-- resource's fence row — in the same transaction. Expects @resource and @value (strings) and @token
-- (DECIMAL(20,0)) set before it in the same session (mysql.sh sets them). Prints `written` or `refused`.
--
-- Guarantees: the UPDATE raises the fence only if the token is above it, and holds the row's lock until
-- COMMIT; a concurrent run's UPDATE waits for that lock and then reads the committed row (InnoDB's
-- locking read, at any isolation level). Every write of the transaction is conditional on that UPDATE
-- having matched (@fenced = 1), so the job's writes land only for a token above every token that
-- committed before, whatever the order the runs arrive in. A check in a statement (or transaction) of
-- its own before the write would be a race: a newer run could commit between the check and the write.
-- (The mysql client has no branches; a program checks the UPDATE's affected-row count instead and rolls
-- back on 0.)
--
-- Limits: only writes gated on the fence are fenced; every writer of the resource must go through its
-- fence row. ROW_COUNT() counts rows changed, which is rows matched here (a raised token always differs).
-- A paused run that holds the row's lock makes the next run wait for it (innodb_lock_wait_timeout; a
-- server-side wait_timeout ends the paused session and rolls its transaction back). Side effects outside
-- this database are not undone.
START TRANSACTION;
-- The resource's fence row, at 0 the first time (a no-op after).
INSERT INTO fence (resource, token) VALUES (@resource, 0) ON DUPLICATE KEY UPDATE token = token;
-- The check and the fence, one statement: 1 row if this token is above the fence, 0 if a run with this
-- token or a higher one has written.
UPDATE fence SET token = @token
 WHERE resource = @resource
   AND token < @token;
SET @fenced = ROW_COUNT();
-- The job's writes, each gated on the fence.
INSERT INTO report (resource, value, token) SELECT @resource, @value, @token FROM DUAL WHERE @fenced = 1
    ON DUPLICATE KEY UPDATE value = @value, token = @token;
COMMIT;
SELECT IF(@fenced = 1, 'written', 'refused');
