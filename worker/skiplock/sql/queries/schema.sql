-- name: schema_lock
-- Serialize migrations of one schema across processes (released at commit).
SELECT pg_advisory_xact_lock(%(key)s::bigint);

-- name: schema_create
-- The schema itself and the record of applied migrations.
CREATE SCHEMA IF NOT EXISTS {schema};
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
-- Whether the migrations table exists in this schema.
SELECT to_regclass(%(table)s) IS NOT NULL AS present;
