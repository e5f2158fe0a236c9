-- name: 0002_tasks_and_lease_deadline
-- Named tasks (the job's kind), the lease deadline stored in the row, and database-side bounds on what producers write.

-- The job's kind: the name of a registered task. NULL means "the queue's default handler" (jobs enqueued
-- before tasks existed, or by a producer that names none).
ALTER TABLE {schema}.jobs ADD COLUMN task text;

-- When the current lease ends, set by the claiming worker from its own lease and moved by its heartbeats.
-- Recovery and "stalled" are judged by it, never by the observer's lease setting. Rows claimed before this
-- migration have none: readers fall back to locked_at plus their lease.
ALTER TABLE {schema}.jobs ADD COLUMN lease_expires_at timestamptz;

-- Bounds enforced by the database itself, so a producer writing plain SQL cannot store what a worker cannot
-- handle: payloads up to 1 MiB (the client's limit is smaller by default), attempts up to 1000, names and keys
-- of bounded length. NOT VALID: existing rows are not rescanned; every new or updated row is checked.
ALTER TABLE {schema}.jobs
    ADD CONSTRAINT jobs_payload_size_check CHECK (pg_column_size(payload) <= 1048576) NOT VALID,
    ADD CONSTRAINT jobs_max_attempts_bound_check CHECK (max_attempts <= 1000) NOT VALID,
    ADD CONSTRAINT jobs_task_check CHECK (task IS NULL OR length(task) BETWEEN 1 AND 200) NOT VALID,
    ADD CONSTRAINT jobs_idempotency_key_check
        CHECK (idempotency_key IS NULL OR length(idempotency_key) BETWEEN 1 AND 255) NOT VALID;

-- Lease recovery and the stalled count: processing rows by their deadline.
CREATE INDEX jobs_lease_deadline_idx ON {schema}.jobs (lease_expires_at) WHERE status = 'processing';
