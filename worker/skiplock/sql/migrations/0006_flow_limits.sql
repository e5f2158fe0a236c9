-- name: 0006_flow_limits
-- Per-key serial execution, global concurrency and rate limits per task: job columns, indexes, the limits and slots tables, and the trigger that frees a concurrency slot whenever a run ends.

-- Jobs sharing a serial key run one at a time, lowest id first (the claim statement picks only the head of a
-- key). serial_skip_on_retry: while this job waits for a retry, later jobs of its key may run.
ALTER TABLE {schema}.jobs ADD COLUMN serial_key text;
ALTER TABLE {schema}.jobs ADD COLUMN serial_skip_on_retry boolean NOT NULL DEFAULT false;
ALTER TABLE {schema}.jobs
    ADD CONSTRAINT jobs_serial_key_check CHECK (serial_key IS NULL OR length(serial_key) BETWEEN 1 AND 255) NOT VALID;

-- The concurrency slot of its task the current run took (set by the claim, NULL for runs of unlimited tasks): the
-- trigger below frees it when the run ends.
ALTER TABLE {schema}.jobs ADD COLUMN slot integer;

-- The head of each key (lowest live id) and whether a job of the key runs: both looked up per keyed candidate.
CREATE INDEX jobs_serial_idx ON {schema}.jobs (serial_key, id)
    WHERE serial_key IS NOT NULL AND status IN ('pending', 'processing');

-- The guarantee itself: never two running jobs of one key, whatever the claim statements compute. A claim that
-- would break it fails and is retried (it needs a race the head rule leaves only in rare cases: a retried failed
-- job re-driven while a later one runs, or a skip-ahead retry falling due during a concurrent claim).
CREATE UNIQUE INDEX jobs_serial_running_idx ON {schema}.jobs (serial_key)
    WHERE serial_key IS NOT NULL AND status = 'processing';

-- Per-task limits, registered by workers at start from their tasks' options (the latest start wins).
CREATE TABLE {schema}.task_limits (
    task                text PRIMARY KEY,
    global_concurrency  integer,
    rate_limit          integer,
    rate_period_seconds double precision,
    registered_by       text,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT task_limits_concurrency_check CHECK (global_concurrency IS NULL OR global_concurrency BETWEEN 1 AND 1000),
    CONSTRAINT task_limits_rate_check CHECK (rate_limit IS NULL OR rate_limit BETWEEN 1 AND 10000),
    CONSTRAINT task_limits_period_check CHECK ((rate_limit IS NULL) = (rate_period_seconds IS NULL)
                                               AND (rate_period_seconds IS NULL OR rate_period_seconds > 0))
);

-- The slots a claim locks (FOR UPDATE SKIP LOCKED) and rechecks by their own columns, so concurrent claims never
-- hand out one slot twice. A concurrency slot is taken by one run (job_id, attempts, worker) until that run ends;
-- a rate slot allows one start, then rests until free_at (one period later): N rate slots, at most N starts in
-- any window of one period.
CREATE TABLE {schema}.task_slots (
    task     text    NOT NULL,
    kind     text    NOT NULL,
    n        integer NOT NULL,
    job_id   bigint,
    attempts integer,
    worker   text,
    free_at  timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (task, kind, n),
    CONSTRAINT task_slots_kind_check CHECK (kind IN ('concurrency', 'rate'))
) WITH (fillfactor = 70);

CREATE INDEX task_slots_free_idx ON {schema}.task_slots (task, kind, free_at);

-- Every path that ends a run (complete, fail, snooze, release, cancel, lease recovery, a manual UPDATE or DELETE)
-- frees the run's concurrency slot, in its own transaction, by primary key. Matching on (job_id, attempts) leaves
-- a slot already handed to another run (by the same statement) alone. SECURITY DEFINER: the roles that end runs
-- need no rights on the slots table.
CREATE FUNCTION {schema}.jobs_free_slot() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE {schema}.task_slots AS s SET job_id = NULL, attempts = NULL, worker = NULL
    WHERE s.task = OLD.task AND s.kind = 'concurrency' AND s.n = OLD.slot
      AND s.job_id = OLD.id AND s.attempts = OLD.attempts;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_free_slot AFTER UPDATE OF status ON {schema}.jobs
    FOR EACH ROW WHEN (OLD.slot IS NOT NULL AND OLD.status = 'processing' AND NEW.status <> 'processing')
    EXECUTE FUNCTION {schema}.jobs_free_slot();

CREATE TRIGGER jobs_free_slot_on_delete AFTER DELETE ON {schema}.jobs
    FOR EACH ROW WHEN (OLD.slot IS NOT NULL AND OLD.status = 'processing')
    EXECUTE FUNCTION {schema}.jobs_free_slot();
