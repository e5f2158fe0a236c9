-- The task registry's statements, and (the `*_by_name` ones, at the end) the enqueue statements for a job enqueued
-- by task name with some of priority, max_attempts and serial_skip_on_retry not given: each is the jobs.sql
-- statement of the same name without `_by_name`, word for
-- word, except that those three values are read from the registry in the statement itself (no extra round trip):
-- the value given, else the task's registered default, else the producer's default. tests/unit/test_sql.py checks
-- that each matches its plain statement; a plain enqueue keeps the plain statement.

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

-- name: job_enqueue_by_name
-- job_enqueue for a job enqueued by task name: priority, max_attempts and serial_skip_on_retry not given come from the task registry, else the producer's defaults.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, idempotency_key,
                               timeout_seconds,
                               serial_key, serial_skip_on_retry)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb,
            coalesce(%(priority)s::smallint, (SELECT t.priority FROM {schema}.tasks AS t WHERE t.name = %(task)s), 0),
            coalesce(%(max_attempts)s::integer, (SELECT t.max_attempts FROM {schema}.tasks AS t WHERE t.name = %(task)s),
                     %(max_attempts_default)s),
            coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), %(idempotency_key)s,
            %(timeout_seconds)s,
            %(serial_key)s,
            coalesce(%(serial_skip_on_retry)s::boolean,
                     (SELECT t.serial_skip_on_retry FROM {schema}.tasks AS t WHERE t.name = %(task)s), false))
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL AND status <> 'failed' DO NOTHING
    RETURNING id, visible_at
), woke AS (
    SELECT pg_notify(%(channel)s, %(queue)s) FROM ins WHERE ins.visible_at <= now()
)
SELECT ins.id, false AS duplicate, (SELECT count(*) FROM woke) AS notified FROM ins
UNION ALL
SELECT j.id, true AS duplicate, 0 AS notified FROM {schema}.jobs AS j
WHERE NOT EXISTS (SELECT 1 FROM ins)
  AND j.queue = %(queue)s AND j.idempotency_key = %(idempotency_key)s AND j.status <> 'failed';

-- name: job_enqueue_unique_by_name
-- job_enqueue_unique for a job enqueued by task name: priority, max_attempts and serial_skip_on_retry not given come from the task registry, else the producer's defaults.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, timeout_seconds,
                               unique_key, unique_states, serial_key, serial_skip_on_retry)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb,
            coalesce(%(priority)s::smallint, (SELECT t.priority FROM {schema}.tasks AS t WHERE t.name = %(task)s), 0),
            coalesce(%(max_attempts)s::integer, (SELECT t.max_attempts FROM {schema}.tasks AS t WHERE t.name = %(task)s),
                     %(max_attempts_default)s),
            coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), %(timeout_seconds)s,
            %(unique_key)s, %(unique_states)s::text[], %(serial_key)s,
            coalesce(%(serial_skip_on_retry)s::boolean,
                     (SELECT t.serial_skip_on_retry FROM {schema}.tasks AS t WHERE t.name = %(task)s), false))
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status = ANY (unique_states)
    DO NOTHING
    RETURNING id, visible_at
), woke AS (
    SELECT pg_notify(%(channel)s, %(queue)s) FROM ins WHERE ins.visible_at <= now()
)
SELECT ins.id, false AS duplicate, (SELECT count(*) FROM woke) AS notified FROM ins
UNION ALL
SELECT j.id, true AS duplicate, 0 AS notified FROM {schema}.jobs AS j
WHERE NOT EXISTS (SELECT 1 FROM ins) AND j.unique_key = %(unique_key)s AND j.status = ANY (j.unique_states);

-- name: job_enqueue_many_by_name
-- job_enqueue_many for jobs enqueued by task name (with or without keys): priority, max_attempts and serial_skip_on_retry not given come from the task registry, else the producer's defaults.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, idempotency_key,
                               serial_key, serial_skip_on_retry)
    SELECT %(queue)s, %(task)s, p.payload,
           coalesce(%(priority)s::smallint, (SELECT t.priority FROM {schema}.tasks AS t WHERE t.name = %(task)s), 0),
           coalesce(%(max_attempts)s::integer, (SELECT t.max_attempts FROM {schema}.tasks AS t WHERE t.name = %(task)s),
                    %(max_attempts_default)s),
           coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), k.key,
           %(serial_key)s,
           coalesce(%(serial_skip_on_retry)s::boolean,
                    (SELECT t.serial_skip_on_retry FROM {schema}.tasks AS t WHERE t.name = %(task)s), false)
    FROM jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, n)
    LEFT JOIN unnest(%(keys)s::text[]) WITH ORDINALITY AS k(key, n) USING (n)
    ORDER BY p.n
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL AND status <> 'failed' DO NOTHING
    RETURNING id, visible_at, idempotency_key
), woke AS (
    SELECT pg_notify(%(channel)s, %(queue)s)
    WHERE EXISTS (SELECT 1 FROM ins WHERE ins.visible_at <= now())
)
SELECT ins.id, ins.idempotency_key AS key, (SELECT count(*) FROM woke) AS notified FROM ins ORDER BY ins.id;

-- name: job_enqueue_many_unique_by_name
-- job_enqueue_many_unique for jobs enqueued by task name: priority, max_attempts and serial_skip_on_retry not given come from the task registry, else the producer's defaults.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, unique_key,
                               unique_states, serial_key, serial_skip_on_retry)
    SELECT %(queue)s, %(task)s, p.payload,
           coalesce(%(priority)s::smallint, (SELECT t.priority FROM {schema}.tasks AS t WHERE t.name = %(task)s), 0),
           coalesce(%(max_attempts)s::integer, (SELECT t.max_attempts FROM {schema}.tasks AS t WHERE t.name = %(task)s),
                    %(max_attempts_default)s),
           coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), k.key,
           %(unique_states)s::text[], %(serial_key)s,
           coalesce(%(serial_skip_on_retry)s::boolean,
                    (SELECT t.serial_skip_on_retry FROM {schema}.tasks AS t WHERE t.name = %(task)s), false)
    FROM jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, n)
    JOIN unnest(%(keys)s::text[]) WITH ORDINALITY AS k(key, n) USING (n)
    ORDER BY p.n
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status = ANY (unique_states)
    DO NOTHING
    RETURNING id, visible_at, unique_key
), woke AS (
    SELECT pg_notify(%(channel)s, %(queue)s)
    WHERE EXISTS (SELECT 1 FROM ins WHERE ins.visible_at <= now())
)
SELECT ins.id, ins.unique_key AS key, (SELECT count(*) FROM woke) AS notified FROM ins ORDER BY ins.id;

-- name: job_replace_unique_by_name
-- job_replace_unique for jobs enqueued by task name: the priority not given comes from the task registry, else 0.
WITH upd AS (
    UPDATE {schema}.jobs AS j
    SET payload = p.payload,
        priority = coalesce(%(priority)s::smallint, (SELECT t.priority FROM {schema}.tasks AS t WHERE t.name = %(task)s), 0),
        visible_at = coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), updated_at = now()
    FROM jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, n)
    JOIN unnest(%(keys)s::text[]) WITH ORDINALITY AS k(key, n) USING (n)
    WHERE j.unique_key = k.key AND j.status = 'pending' AND j.status = ANY (j.unique_states)
    RETURNING j.id, j.visible_at
), woke AS (
    SELECT pg_notify(%(channel)s, %(queue)s) WHERE EXISTS (SELECT 1 FROM upd WHERE upd.visible_at <= now())
)
SELECT upd.id, (SELECT count(*) FROM woke) AS notified FROM upd;
