-- name: 0004_lifecycle
-- Job lifecycle controls: a cancelled status, the error history, per-job timeouts and paused queues.

-- A cancelled job is neither failed nor retried: it is its own final state. The status check is replaced in
-- place (NOT VALID: existing rows all hold one of the older statuses; every new or updated row is checked).
ALTER TABLE {schema}.jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE {schema}.jobs
    ADD CONSTRAINT jobs_status_check
        CHECK (status IN ('pending', 'processing', 'done', 'failed', 'cancelled')) NOT VALID;

-- One entry per failed attempt, {{attempt, at, error, worker}}, the newest last; the worker keeps the last 20
-- (bounded text) in the same statement that records the failure. last_error stays the newest error.
ALTER TABLE {schema}.jobs ADD COLUMN errors jsonb NOT NULL DEFAULT '[]'::jsonb;

-- How long one attempt may run (NULL: the task's setting, else no limit). The worker enforces it and no
-- heartbeat renews a lease past it.
ALTER TABLE {schema}.jobs ADD COLUMN timeout_seconds double precision;
ALTER TABLE {schema}.jobs
    ADD CONSTRAINT jobs_timeout_check CHECK (timeout_seconds IS NULL OR timeout_seconds > 0) NOT VALID;

-- Cancelled jobs: listing, retry --include-cancelled and retention.
CREATE INDEX jobs_cancelled_idx ON {schema}.jobs (queue, updated_at) WHERE status = 'cancelled';

-- Done jobs: retention by age (with the existing retention index) and the attempts they took (stats reads
-- them from this index alone).
CREATE INDEX jobs_done_idx ON {schema}.jobs (queue, updated_at) INCLUDE (attempts) WHERE status = 'done';

-- Per-queue controls set by operators (skiplock pause / resume). A queue without a row is not paused.
CREATE TABLE {schema}.queues (
    queue      text PRIMARY KEY,
    paused     boolean     NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT queues_queue_check CHECK (length(queue) BETWEEN 1 AND 128)
);
