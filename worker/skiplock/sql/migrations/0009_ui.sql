-- name: 0009_ui
-- The web UI: failures grouped by a fingerprint the database computes (stored and indexed for failed rows only), and the audit table of the UI's actions (every statement can run again).

-- A failure's error with what varies between occurrences of one cause normalised away: UUIDs, quoted values,
-- 0x hex numbers, ids (a word with a digit and a letter: user_42, a1b2c3) and numbers. Only the first line counts
-- (the type and message; a traceback may follow), at most 500 characters of it. IMMUTABLE (only immutable built-ins, schema-qualified): an index can store it.
CREATE OR REPLACE FUNCTION {schema}.error_normalised(error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT AS $$
    SELECT pg_catalog.regexp_replace(pg_catalog.regexp_replace(pg_catalog.regexp_replace(
           pg_catalog.regexp_replace(pg_catalog.regexp_replace(pg_catalog.regexp_replace(
               pg_catalog.left(pg_catalog.split_part(error, E'\n', 1), 500),
               '[0-9a-fA-F]{{8}}-[0-9a-fA-F]{{4}}-[0-9a-fA-F]{{4}}-[0-9a-fA-F]{{4}}-[0-9a-fA-F]{{12}}', '<uuid>', 'g'),
               '''[^'']*''|"[^"]*"', '<str>', 'g'),
               '\m0x[0-9a-fA-F]+\M', '<hex>', 'g'),
               '\m(?=\w*[0-9])(?=\w*[A-Za-z_])\w+\M', '<id>', 'g'),
               '[0-9]+([.][0-9]+)?', '<n>', 'g'),
               '\s+', ' ', 'g')
$$;

-- One group per task and normalised error: a short stable key (16 hex digits) the UI and the CLI name groups by.
CREATE OR REPLACE FUNCTION {schema}.error_fingerprint(task text, error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT pg_catalog.left(pg_catalog.md5(
        coalesce(task, '') || E'\x1f' || coalesce({schema}.error_normalised(error), '')), 16)
$$;

-- Each failed job's fingerprint, stored by the trigger below when a job fails, so that grouping 100,000 failed jobs
-- reads one index only (an expression index cannot serve an index-only scan in PostgreSQL: every row's error would
-- be normalised again at each read, about 50 us a row). Nullable without a default: adding it rewrites nothing.
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS failure_fingerprint text;

-- Set whenever a statement sets last_error on a row whose new status is failed (the worker's failure and the lease
-- recovery both do). The claim and the completion never set last_error, so for a job that succeeds this trigger
-- is never considered: the fingerprint costs the hot path nothing. A retried job keeps its old value, outside the
-- index (failed rows only) until it fails again, when it is computed anew.
CREATE OR REPLACE FUNCTION {schema}.jobs_failure_fingerprint() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.failure_fingerprint := {schema}.error_fingerprint(NEW.task, NEW.last_error);
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS jobs_failure_fingerprint ON {schema}.jobs;
CREATE TRIGGER jobs_failure_fingerprint BEFORE UPDATE OF last_error ON {schema}.jobs
    FOR EACH ROW WHEN (NEW.status = 'failed')
    EXECUTE FUNCTION {schema}.jobs_failure_fingerprint();

-- The jobs that failed before this migration (their rows are locked for the statement's time; no live job is).
-- Taking the locks is bounded like 0007: past 5 s of waiting the migration fails, changing nothing; running it
-- again applies it.
SET LOCAL lock_timeout = '5s';
UPDATE {schema}.jobs SET failure_fingerprint = {schema}.error_fingerprint(task, last_error)
WHERE status = 'failed' AND failure_fingerprint IS NULL;

-- The failure groups, read by an index-only scan: fingerprint, then id (a group's jobs by keyset), with the time
-- and queue the groups page shows and filters on. Failed rows only: a job that succeeds never has an entry.
CREATE INDEX IF NOT EXISTS jobs_failure_fingerprint_idx ON {schema}.jobs (failure_fingerprint, id) INCLUDE (updated_at, queue)
    WHERE status = 'failed';

-- The failed jobs newest first by id, for the UI's job list filtered on status failed (failed rows only).
CREATE INDEX IF NOT EXISTS jobs_failed_id_idx ON {schema}.jobs (id) WHERE status = 'failed';

-- One row per action taken from the UI (or its API): who (the token's name, or the user a trusted proxy named),
-- what, on what, when, and how many jobs it changed. action_key makes an action idempotent: a second submission
-- with the same key (a double click) finds this row and changes nothing more. detail holds what the action
-- needs to continue or be checked later (a canary's job ids, a bulk action's keyset cursor).
CREATE TABLE IF NOT EXISTS {schema}.ui_audit (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    actor      text        NOT NULL,
    action     text        NOT NULL,
    target     text        NOT NULL,
    job_count  integer     NOT NULL DEFAULT 0,
    action_key text        NOT NULL,
    detail     jsonb       NOT NULL DEFAULT '{{}}'::jsonb,
    CONSTRAINT ui_audit_action_key_key UNIQUE (action_key),
    CONSTRAINT ui_audit_actor_check CHECK (length(actor) BETWEEN 1 AND 200),
    CONSTRAINT ui_audit_action_key_check CHECK (length(action_key) BETWEEN 1 AND 100)
);
