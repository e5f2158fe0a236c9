-- name: 0014_task_registry
-- The task registry: each task's queue and enqueue defaults, registered by the workers that run it (at start; the latest registration wins), so `skiplock enqueue --task` and producers enqueueing by name use them.

-- One row per task name (the `task` of its jobs). `app` and `registered_by` say which app and worker wrote it.
-- A NULL default means "the producer's setting" (SKIPLOCK_MAX_ATTEMPTS, priority 0), as on the task itself.
CREATE TABLE IF NOT EXISTS {schema}.tasks (
    name                 text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    queue                text NOT NULL CHECK (length(queue) BETWEEN 1 AND 128),
    priority             smallint,
    max_attempts         integer CHECK (max_attempts IS NULL OR max_attempts BETWEEN 1 AND 1000),
    serial_skip_on_retry boolean,
    app                  text NOT NULL DEFAULT '',
    registered_by        text NOT NULL DEFAULT '',
    updated_at           timestamptz NOT NULL DEFAULT now()
);
