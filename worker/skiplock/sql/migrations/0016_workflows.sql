-- name: 0016_workflows
-- Results, dependencies between jobs (a `waiting` status, the edges, the trigger that releases or cancels a job's children in the statement that ends it) and durable steps.

-- Running it again (a schema_migrations row removed by hand) replaces what it made, as 0015 does.
-- A job enqueued with parents waits in its own status, outside every claim index, until its last parent is final.
-- The status check is replaced in place as in 0004 (NOT VALID: every stored row holds one of the older statuses).
ALTER TABLE {schema}.jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE {schema}.jobs
    ADD CONSTRAINT jobs_status_check
        CHECK (status IN ('pending', 'processing', 'done', 'failed', 'cancelled', 'waiting')) NOT VALID;

-- Nullable columns without defaults: adding them rewrites nothing, and a plain job stores none of them (NULL is a
-- bit in the row's null bitmap). NULL means false for the flags.
-- result: the task's return value, written with `done` in the same statement.
-- waiting_on: parents not final yet (NULL: the job has no parents); the trigger below counts it down, so a child's
-- readiness never depends on its parents' rows still existing (retention may purge them).
-- run_on_parent_failure: run once every parent is final, whatever they ended as (else cancelled when one fails).
-- has_children / awaited: what makes the trigger below fire (a plain job sets neither, so it never does).
-- workflow_id: the workflow (chain, group, chord) the job belongs to, if any.
-- has_steps: the job stored a durable step (job_steps), deleted with it.
ALTER TABLE {schema}.jobs
    ADD COLUMN IF NOT EXISTS result jsonb,
    ADD COLUMN IF NOT EXISTS waiting_on integer,
    ADD COLUMN IF NOT EXISTS run_on_parent_failure boolean,
    ADD COLUMN IF NOT EXISTS has_children boolean,
    ADD COLUMN IF NOT EXISTS awaited boolean,
    ADD COLUMN IF NOT EXISTS workflow_id uuid,
    ADD COLUMN IF NOT EXISTS has_steps boolean;
ALTER TABLE {schema}.jobs
    DROP CONSTRAINT IF EXISTS jobs_result_size_check,
    ADD CONSTRAINT jobs_result_size_check CHECK (pg_column_size(result) <= 1048576) NOT VALID;

CREATE INDEX IF NOT EXISTS jobs_workflow_idx ON {schema}.jobs (workflow_id) WHERE workflow_id IS NOT NULL;
-- The waiting gauge and `skiplock show`'s per-queue counts.
CREATE INDEX IF NOT EXISTS jobs_waiting_idx ON {schema}.jobs (queue) WHERE status = 'waiting';

-- One row per (parent, child). parent_status: what the parent ended as, once it did (NULL: not final yet). An
-- edge is resolved once, so a parent that ends twice (failed, re-driven, done) counts its children down once.
CREATE TABLE IF NOT EXISTS {schema}.job_dependencies (
    parent        bigint NOT NULL,
    child         bigint NOT NULL,
    parent_status text,
    PRIMARY KEY (parent, child),
    CONSTRAINT job_dependencies_status_check CHECK (parent_status IN ('done', 'failed', 'cancelled'))
);
CREATE INDEX IF NOT EXISTS job_dependencies_child_idx ON {schema}.job_dependencies (child);

-- Durable steps: one row per step a job completed (job.step), written in its own short transaction.
CREATE TABLE IF NOT EXISTS {schema}.job_steps (
    job_id     bigint NOT NULL,
    name       text   NOT NULL,
    result     jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name),
    CONSTRAINT job_steps_name_check CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT job_steps_result_size_check CHECK (pg_column_size(result) <= 1048576)
);

-- A parent ended as `ended` (done, failed or cancelled): resolve its open edges and count its children down, set-based,
-- locking them in id order. A waiting child whose last parent this was becomes pending (due no earlier than now) and
-- its queue's workers are woken at commit; a child of a parent that failed or was cancelled is cancelled, naming the
-- parent, unless it runs on parent failure. Ending a child this way fires this trigger for it in turn.
CREATE OR REPLACE FUNCTION {schema}.jobs_resolve_children(parent_id bigint, ended text, wakeup text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    woken text;
BEGIN
    FOR woken IN
        WITH resolved AS (
            UPDATE {schema}.job_dependencies AS d SET parent_status = ended
            WHERE d.parent = parent_id AND d.parent_status IS NULL
            RETURNING d.child
        ), locked AS (
            SELECT c.id FROM {schema}.jobs AS c WHERE c.id IN (SELECT child FROM resolved) ORDER BY c.id FOR UPDATE
        ), judged AS (
            UPDATE {schema}.jobs AS c
            SET waiting_on = c.waiting_on - 1,
                status = CASE WHEN c.status <> 'waiting' THEN c.status
                              WHEN ended <> 'done' AND c.run_on_parent_failure IS NOT TRUE THEN 'cancelled'
                              WHEN c.waiting_on <= 1 THEN 'pending'
                              ELSE 'waiting' END,
                last_error = CASE WHEN c.status = 'waiting' AND ended <> 'done' AND c.run_on_parent_failure IS NOT TRUE
                                  THEN format('ParentFailed: parent job %s ended %s', parent_id, ended)
                                  ELSE c.last_error END,
                visible_at = CASE WHEN c.status = 'waiting' AND c.waiting_on <= 1 THEN greatest(c.visible_at, now())
                                  ELSE c.visible_at END,
                updated_at = now()
            FROM locked WHERE c.id = locked.id
            RETURNING c.queue, c.status
        )
        SELECT DISTINCT queue FROM judged WHERE status = 'pending'
    LOOP
        PERFORM pg_notify(wakeup, woken);
    END LOOP;
END
$$;

-- Fires only for a job that has children or a waiter (flags a plain job never sets), when it becomes final.
CREATE OR REPLACE FUNCTION {schema}.jobs_ended() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.has_children THEN
        PERFORM {schema}.jobs_resolve_children(NEW.id, NEW.status, TG_TABLE_SCHEMA || '_wakeup');
    END IF;
    IF NEW.awaited THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA || '_done', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS jobs_ended ON {schema}.jobs;
CREATE TRIGGER jobs_ended AFTER UPDATE OF status ON {schema}.jobs
    FOR EACH ROW
    WHEN ((NEW.has_children OR NEW.awaited) AND NEW.status IN ('done', 'failed', 'cancelled')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {schema}.jobs_ended();

-- A deleted job (retention, or by hand) takes its edges and steps with it. A parent deleted before it ended counts as
-- cancelled for its children, so none is stranded; a purged finished parent resolved its edges when it ended.
CREATE OR REPLACE FUNCTION {schema}.jobs_unlinked() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF OLD.has_children THEN
        PERFORM {schema}.jobs_resolve_children(OLD.id, 'cancelled', TG_TABLE_SCHEMA || '_wakeup');
        DELETE FROM {schema}.job_dependencies WHERE parent = OLD.id;
    END IF;
    IF OLD.waiting_on IS NOT NULL THEN
        DELETE FROM {schema}.job_dependencies WHERE child = OLD.id;
    END IF;
    IF OLD.has_steps THEN
        DELETE FROM {schema}.job_steps WHERE job_id = OLD.id;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS jobs_unlinked ON {schema}.jobs;
CREATE TRIGGER jobs_unlinked AFTER DELETE ON {schema}.jobs
    FOR EACH ROW WHEN (OLD.has_children OR OLD.waiting_on IS NOT NULL OR OLD.has_steps)
    EXECUTE FUNCTION {schema}.jobs_unlinked();

-- What a producer role needs for after=, workflows and wait() without UPDATE of jobs or SELECT of their errors:
-- functions that run as the schema's owner (SECURITY DEFINER, a fixed search_path). skiplock grant gives the producer
-- role EXECUTE on them; PUBLIC has none. jobs_lock_parents locks the parents an enqueue names (until its transaction
-- ends, as after= needs: a parent cannot end unseen); jobs_link and jobs_tag_workflow change only rows the calling
-- transaction inserted (created_at = now(), the transaction's start: a producer cannot make another's job wait, nor
-- re-tag it); jobs_await asks for a notification when one job ends; jobs_outcome reads one job's status, result and
-- last error line (what wait() returns).
CREATE OR REPLACE FUNCTION {schema}.jobs_lock_parents(bigint[]) RETURNS TABLE (id bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
SELECT j.id FROM {schema}.jobs AS j WHERE j.id = ANY($1) ORDER BY j.id FOR NO KEY UPDATE;
$$;

CREATE OR REPLACE FUNCTION {schema}.jobs_await(bigint) RETURNS TABLE (id bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
UPDATE {schema}.jobs AS j SET awaited = true
WHERE j.id = $1 AND j.status NOT IN ('done', 'failed', 'cancelled') AND j.awaited IS NOT TRUE
RETURNING j.id;
$$;

CREATE OR REPLACE FUNCTION {schema}.jobs_link(bigint[], bigint[], boolean, uuid)
RETURNS TABLE (found bigint[], linked bigint, marked bigint)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
WITH parent AS (
    SELECT id, status FROM {schema}.jobs WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE
), complete AS (
    SELECT (SELECT count(*) FROM parent) = cardinality($1) AS ok
), marked AS (
    UPDATE {schema}.jobs AS j SET has_children = true
    FROM parent WHERE j.id = parent.id AND j.has_children IS NOT TRUE AND (SELECT ok FROM complete)
    RETURNING j.id
), own AS (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE j.id = ANY($2) AND j.status = 'pending' AND j.created_at = now() AND (SELECT ok FROM complete)
), edges AS (
    INSERT INTO {schema}.job_dependencies (parent, child, parent_status)
    SELECT p.id, c.id, CASE WHEN p.status IN ('done', 'failed', 'cancelled') THEN p.status END
    FROM parent AS p CROSS JOIN own AS c
    RETURNING parent, child, parent_status
), judged AS (
    SELECT child, count(*) FILTER (WHERE parent_status IS NULL) AS open,
           min(parent) FILTER (WHERE parent_status IN ('failed', 'cancelled')) AS failed_parent,
           min(parent_status) FILTER (WHERE parent_status IN ('failed', 'cancelled')) AS failed_as
    FROM edges GROUP BY child
), linked AS (
    UPDATE {schema}.jobs AS j
    SET waiting_on = judged.open, run_on_parent_failure = $3, workflow_id = $4,
        status = CASE WHEN judged.failed_parent IS NOT NULL AND NOT $3 THEN 'cancelled'
                      WHEN judged.open = 0 THEN 'pending' ELSE 'waiting' END,
        last_error = CASE WHEN judged.failed_parent IS NOT NULL AND NOT $3
                          THEN format('ParentFailed: parent job %s ended %s', judged.failed_parent, judged.failed_as)
                     END,
        updated_at = now()
    FROM judged WHERE j.id = judged.child
    RETURNING j.id
)
SELECT array(SELECT id FROM parent ORDER BY id), (SELECT count(*) FROM linked), (SELECT count(*) FROM marked);
$$;

CREATE OR REPLACE FUNCTION {schema}.jobs_tag_workflow(bigint[], uuid) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
UPDATE {schema}.jobs SET workflow_id = $2 WHERE id = ANY($1) AND created_at = now();
$$;

CREATE OR REPLACE FUNCTION {schema}.jobs_outcome(bigint)
RETURNS TABLE (id bigint, status text, result jsonb, last_error text)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
SELECT j.id, j.status, j.result, j.last_error FROM {schema}.jobs AS j WHERE j.id = $1;
$$;

REVOKE ALL ON FUNCTION {schema}.jobs_lock_parents(bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.jobs_await(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.jobs_link(bigint[], bigint[], boolean, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.jobs_tag_workflow(bigint[], uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.jobs_outcome(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.jobs_resolve_children(bigint, text, text) FROM PUBLIC;
REVOKE ALL ON {schema}.job_dependencies, {schema}.job_steps FROM PUBLIC;
