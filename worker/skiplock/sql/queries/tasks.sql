-- The task registry's statements. The enqueue of a job by task name with some of priority, max_attempts and
-- serial_skip_on_retry not given is the `by_name` variant of its jobs.sql statement.

-- name: task_register
-- Register the queue and enqueue defaults of an app's tasks (a worker at start; the latest registration wins); rows are written in name order, so concurrent registrations lock them in one order.
INSERT INTO {schema}.tasks AS t (name, queue, priority, max_attempts, serial_skip_on_retry, app, registered_by,
                                 updated_at)
SELECT g.name, g.queue, g.priority, g.max_attempts, g.serial_skip_on_retry, %(app)s, %(worker)s, now()
FROM unnest(%(names)s::text[], %(queues)s::text[], %(priorities)s::smallint[], %(max_attempts)s::integer[],
            %(serial_skip_on_retry)s::boolean[]) AS g(name, queue, priority, max_attempts, serial_skip_on_retry)
ORDER BY g.name
ON CONFLICT (name) DO UPDATE
SET queue = excluded.queue, priority = excluded.priority, max_attempts = excluded.max_attempts,
    serial_skip_on_retry = excluded.serial_skip_on_retry, app = excluded.app,
    registered_by = excluded.registered_by, updated_at = excluded.updated_at
RETURNING t.name;

-- name: task_find
-- One registered task: its queue and enqueue defaults (no row: no worker registered it).
SELECT name, queue, priority, max_attempts, serial_skip_on_retry, app, registered_by, updated_at
FROM {schema}.tasks
WHERE name = %(name)s;

-- name: task_names
-- The registered task names, in order (to suggest one for a misspelt name).
SELECT name FROM {schema}.tasks ORDER BY name LIMIT 10000;
