-- postgres-schema.sql: the tables of postgres.sql — run once (psql -f postgres-schema.sql).
--
-- fence:  one row per resource the job writes, holding the highest token that has written it.
-- report: the job's own data (here one value per resource; a real job has its own tables).
-- Tokens are NUMERIC(20,0): exact for every u64 (BIGINT stops at 2^63 - 1, a double at 2^53).
-- Limits: the tables fence nothing by themselves; postgres.sql says what its transaction guarantees.
CREATE TABLE IF NOT EXISTS fence (
    resource text PRIMARY KEY,
    token numeric(20, 0) NOT NULL
);
CREATE TABLE IF NOT EXISTS report (
    resource text PRIMARY KEY,
    value text NOT NULL,
    token numeric(20, 0) NOT NULL
);
