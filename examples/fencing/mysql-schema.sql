-- mysql-schema.sql: the tables of mysql.sql, for MySQL or MariaDB (InnoDB) — run once
-- (mysql < mysql-schema.sql).
--
-- fence:  one row per resource the job writes, holding the highest token that has written it.
-- report: the job's own data (here one value per resource; a real job has its own tables).
-- Tokens are DECIMAL(20,0): exact for every u64 (BIGINT UNSIGNED would do too; a double is exact only
-- below 2^53). InnoDB: the row locks that make the check and the write one step are InnoDB's.
-- Limits: the tables fence nothing by themselves; mysql.sql says what its transaction guarantees.
CREATE TABLE IF NOT EXISTS fence (
    resource VARCHAR(191) NOT NULL PRIMARY KEY,
    token DECIMAL(20, 0) NOT NULL
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS report (
    resource VARCHAR(191) NOT NULL PRIMARY KEY,
    value MEDIUMTEXT NOT NULL,
    token DECIMAL(20, 0) NOT NULL
) ENGINE = InnoDB;
