-- name: schema_lock
-- Serialize migrations of one schema across processes (released at commit). A table lock this strong needs UPDATE, DELETE or TRUNCATE on the table, which only the owner has: no other role can hold it (an advisory key could be taken by any role).
LOCK TABLE {schema}.schema_migrations IN SHARE ROW EXCLUSIVE MODE;

-- name: schema_exists
-- Whether the schema exists (creating it needs CREATE on the database, so it is only tried when missing).
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %(schema)s) AS present;

-- name: schema_create
-- The schema itself.
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: schema_migrations_create
-- The record of applied migrations.
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: schema_versions
-- Versions applied so far (empty when the schema does not exist yet).
SELECT version FROM {schema}.schema_migrations ORDER BY version;

-- name: schema_record
-- Record one applied migration.
INSERT INTO {schema}.schema_migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: schema_present
-- Whether the migrations table exists in this schema (names as parameters, so any schema name is safe).
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %(schema)s AND tablename = 'schema_migrations'
) AS present;

-- name: roles_existing
-- Which of the given role names exist (skiplock grant checks them before granting anything).
SELECT rolname FROM pg_roles WHERE rolname = ANY(%(names)s::text[]);
