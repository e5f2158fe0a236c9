-- name: 0005_schedules_and_unique
-- Periodic tasks (one row per schedule, fired by whoever finds it due) and unique jobs (a key kept only in the states the task names).

-- A unique job carries its key and the statuses in which the key is held. A row holds its key only while its
-- status is one of them: a job unique "while pending or processing" frees its key when it is done. Jobs without
-- a key are not in the index (NULL columns cost nothing).
ALTER TABLE {schema}.jobs ADD COLUMN unique_key text;
ALTER TABLE {schema}.jobs ADD COLUMN unique_states text[];
ALTER TABLE {schema}.jobs
    ADD CONSTRAINT jobs_unique_key_check
        CHECK (unique_key IS NULL OR (length(unique_key) BETWEEN 1 AND 512 AND unique_states IS NOT NULL)) NOT VALID;
CREATE UNIQUE INDEX jobs_unique_idx ON {schema}.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND status = ANY (unique_states);

-- Periodic tasks. Workers register their app's schedules at start (and every hour), `skiplock schedules sync`
-- at deploy; workers and the operator fire them. Firing a tick is one statement: a compare-and-set of
-- next_run_at plus the job INSERT (whose unique key, task and tick time, is a second guard), so each tick is
-- enqueued once however many firers run.
CREATE TABLE {schema}.schedules (
    name          text PRIMARY KEY,
    app           text             NOT NULL,
    queue         text             NOT NULL,
    task          text             NOT NULL,
    cron          text,
    every_seconds double precision,
    timezone      text             NOT NULL DEFAULT 'UTC',
    priority      smallint         NOT NULL DEFAULT 0,
    max_attempts  integer          NOT NULL DEFAULT 5,
    next_run_at   timestamptz      NOT NULL,
    last_run_at   timestamptz,
    period_seconds double precision NOT NULL,  -- about one period: how long a schedule may go unregistered
    seen_at       timestamptz      NOT NULL DEFAULT now(),
    created_at    timestamptz      NOT NULL DEFAULT now(),
    updated_at    timestamptz      NOT NULL DEFAULT now(),
    CONSTRAINT schedules_spec_check CHECK ((cron IS NULL) <> (every_seconds IS NULL)),
    CONSTRAINT schedules_every_check CHECK (every_seconds IS NULL OR every_seconds > 0),
    CONSTRAINT schedules_period_check CHECK (period_seconds > 0),
    CONSTRAINT schedules_queue_check CHECK (length(queue) BETWEEN 1 AND 128),
    CONSTRAINT schedules_task_check CHECK (length(task) BETWEEN 1 AND 200)
);
CREATE INDEX schedules_due_idx ON {schema}.schedules (next_run_at);
