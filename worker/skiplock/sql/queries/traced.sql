-- name: job_enqueue_traced
-- job_enqueue of a traced enqueue: the same statement, plus the W3C trace context of its span in trace_context (docs/tracing.md).
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, idempotency_key,
                               timeout_seconds,
                               serial_key, serial_skip_on_retry, trace_context)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s,
            coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), %(idempotency_key)s,
            %(timeout_seconds)s,
            %(serial_key)s, %(serial_skip_on_retry)s, %(trace_context)s::jsonb)
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

-- name: job_enqueue_many_traced
-- job_enqueue_many of a traced enqueue: the same statement, plus the trace context of its span for every job.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, idempotency_key,
                               serial_key, serial_skip_on_retry, trace_context)
    SELECT %(queue)s, %(task)s, p.payload, %(priority)s, %(max_attempts)s,
           coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), k.key,
           %(serial_key)s, %(serial_skip_on_retry)s, %(trace_context)s::jsonb
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

-- name: job_copy_many_traced
-- job_copy_many of a traced enqueue: the same columns, then the trace context of its span (the same for every row).
COPY {schema}.jobs (id, payload, queue, task, priority, max_attempts, visible_at, serial_key, serial_skip_on_retry, trace_context)
FROM STDIN;

-- name: job_enqueue_unique_traced
-- job_enqueue_unique of a traced enqueue: the same statement, plus the trace context of its span.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, timeout_seconds,
                               unique_key, unique_states, serial_key, serial_skip_on_retry, trace_context)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s,
            coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), %(timeout_seconds)s,
            %(unique_key)s, %(unique_states)s::text[], %(serial_key)s, %(serial_skip_on_retry)s,
            %(trace_context)s::jsonb)
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

-- name: job_enqueue_many_unique_traced
-- job_enqueue_many_unique of a traced enqueue: the same statement, plus the trace context of its span for every job.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, unique_key,
                               unique_states, serial_key, serial_skip_on_retry, trace_context)
    SELECT %(queue)s, %(task)s, p.payload, %(priority)s, %(max_attempts)s,
           coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), k.key,
           %(unique_states)s::text[], %(serial_key)s, %(serial_skip_on_retry)s, %(trace_context)s::jsonb
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

-- name: job_enqueue_by_name_traced
-- job_enqueue_by_name of a traced enqueue: the same statement, plus the trace context of its span.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, idempotency_key,
                               timeout_seconds,
                               serial_key, serial_skip_on_retry, trace_context)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb,
            coalesce(%(priority)s::smallint, (SELECT t.priority FROM {schema}.tasks AS t WHERE t.name = %(task)s), 0),
            coalesce(%(max_attempts)s::integer, (SELECT t.max_attempts FROM {schema}.tasks AS t WHERE t.name = %(task)s),
                     %(max_attempts_default)s),
            coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), %(idempotency_key)s,
            %(timeout_seconds)s,
            %(serial_key)s,
            coalesce(%(serial_skip_on_retry)s::boolean,
                     (SELECT t.serial_skip_on_retry FROM {schema}.tasks AS t WHERE t.name = %(task)s), false),
            %(trace_context)s::jsonb)
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

-- name: job_enqueue_unique_by_name_traced
-- job_enqueue_unique_by_name of a traced enqueue: the same statement, plus the trace context of its span.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, timeout_seconds,
                               unique_key, unique_states, serial_key, serial_skip_on_retry, trace_context)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb,
            coalesce(%(priority)s::smallint, (SELECT t.priority FROM {schema}.tasks AS t WHERE t.name = %(task)s), 0),
            coalesce(%(max_attempts)s::integer, (SELECT t.max_attempts FROM {schema}.tasks AS t WHERE t.name = %(task)s),
                     %(max_attempts_default)s),
            coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), %(timeout_seconds)s,
            %(unique_key)s, %(unique_states)s::text[], %(serial_key)s,
            coalesce(%(serial_skip_on_retry)s::boolean,
                     (SELECT t.serial_skip_on_retry FROM {schema}.tasks AS t WHERE t.name = %(task)s), false),
            %(trace_context)s::jsonb)
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

-- name: job_enqueue_many_by_name_traced
-- job_enqueue_many_by_name of a traced enqueue: the same statement, plus the trace context of its span for every job.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, idempotency_key,
                               serial_key, serial_skip_on_retry, trace_context)
    SELECT %(queue)s, %(task)s, p.payload,
           coalesce(%(priority)s::smallint, (SELECT t.priority FROM {schema}.tasks AS t WHERE t.name = %(task)s), 0),
           coalesce(%(max_attempts)s::integer, (SELECT t.max_attempts FROM {schema}.tasks AS t WHERE t.name = %(task)s),
                    %(max_attempts_default)s),
           coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), k.key,
           %(serial_key)s,
           coalesce(%(serial_skip_on_retry)s::boolean,
                    (SELECT t.serial_skip_on_retry FROM {schema}.tasks AS t WHERE t.name = %(task)s), false),
           %(trace_context)s::jsonb
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

-- name: job_enqueue_many_unique_by_name_traced
-- job_enqueue_many_unique_by_name of a traced enqueue: the same statement, plus the trace context of its span for every job.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, unique_key,
                               unique_states, serial_key, serial_skip_on_retry, trace_context)
    SELECT %(queue)s, %(task)s, p.payload,
           coalesce(%(priority)s::smallint, (SELECT t.priority FROM {schema}.tasks AS t WHERE t.name = %(task)s), 0),
           coalesce(%(max_attempts)s::integer, (SELECT t.max_attempts FROM {schema}.tasks AS t WHERE t.name = %(task)s),
                    %(max_attempts_default)s),
           coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), k.key,
           %(unique_states)s::text[], %(serial_key)s,
           coalesce(%(serial_skip_on_retry)s::boolean,
                    (SELECT t.serial_skip_on_retry FROM {schema}.tasks AS t WHERE t.name = %(task)s), false),
           %(trace_context)s::jsonb
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
