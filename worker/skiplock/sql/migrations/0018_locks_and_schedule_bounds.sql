-- name: 0018_locks_and_schedule_bounds
-- A purge lock only the schema's owner can take (a row of a new locks table, not an advisory key any role could take).

-- Why (issue 37, item 8): the purge serialized on pg_advisory_xact_lock of a public hash of the schema name, which
-- any role of the database could take and hold, stopping every purge of this schema. A row lock needs the UPDATE
-- privilege on its table, which only the owner has (skiplock grant gives no other role any right on it); migrations
-- lock schema_migrations itself for the same reason (skiplock.migrate).
CREATE TABLE {schema}.locks (
    name text PRIMARY KEY CHECK (name IN ('purge'))
);
INSERT INTO {schema}.locks (name) VALUES ('purge');
REVOKE ALL ON {schema}.locks FROM PUBLIC;
