-- name: queue_stats
-- Health of each queue (ready, delayed, processing, stalled = past the stored lease deadline, failed, waiting on parents, oldest ready age, next due, paused, average attempts of the last 1000 done jobs) from partial indexes only; times outside the range of jobs_visible_at_check count as its ends.
WITH live AS (
    -- visible_at within the range the database allows (jobs_visible_at_check), so that no row stored outside it (a
    -- dropped constraint, a restored dump) makes the arithmetic below fail or a time Python cannot read
    SELECT queue, status,
           least(greatest(visible_at, TIMESTAMPTZ '1970-01-01 00:00:00+00'), TIMESTAMPTZ '3000-01-01 00:00:00+00')
               AS visible_at,
           locked_at, lease_expires_at FROM {schema}.jobs
    WHERE status = 'pending' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
    UNION ALL
    SELECT queue, status, visible_at, locked_at, lease_expires_at FROM {schema}.jobs
    WHERE status = 'processing' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
    UNION ALL
    SELECT queue, status, visible_at, locked_at, lease_expires_at FROM {schema}.jobs
    WHERE status = 'failed' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
    UNION ALL
    SELECT queue, status, visible_at, locked_at, lease_expires_at FROM {schema}.jobs
    WHERE status = 'waiting' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
), counts AS (
SELECT queue,
       count(*) FILTER (WHERE status = 'pending' AND visible_at <= coalesce(%(now)s::timestamptz, now())) AS ready,
       count(*) FILTER (WHERE status = 'pending' AND visible_at > coalesce(%(now)s::timestamptz, now())) AS delayed,
       count(*) FILTER (WHERE status = 'processing') AS processing,
       count(*) FILTER (WHERE status = 'processing'
                          AND coalesce(lease_expires_at, locked_at + make_interval(secs => %(lease_seconds)s))
                              < coalesce(%(now)s::timestamptz, now())) AS stalled,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'waiting') AS waiting,
       coalesce(extract(epoch FROM coalesce(%(now)s::timestamptz, now())
                - min(visible_at) FILTER (WHERE status = 'pending'
                                          AND visible_at <= coalesce(%(now)s::timestamptz, now()))), 0)::float8
           AS oldest_ready_age_seconds,
       min(visible_at) FILTER (WHERE status = 'pending' AND visible_at > coalesce(%(now)s::timestamptz, now()))
           AS next_due
FROM live
GROUP BY queue
), paused AS (
    SELECT queue FROM {schema}.queues WHERE paused AND (%(queue)s::text IS NULL OR queue = %(queue)s)
)
SELECT queue, coalesce(c.ready, 0) AS ready, coalesce(c.delayed, 0) AS delayed,
       coalesce(c.processing, 0) AS processing, coalesce(c.stalled, 0) AS stalled, coalesce(c.failed, 0) AS failed,
       coalesce(c.oldest_ready_age_seconds, 0)::float8 AS oldest_ready_age_seconds, c.next_due,
       p.queue IS NOT NULL AS paused,
       (SELECT avg(d.attempts)::float8 FROM (
            SELECT attempts FROM {schema}.jobs
            WHERE status = 'done' AND queue = coalesce(c.queue, p.queue)
            ORDER BY updated_at DESC LIMIT 1000) AS d) AS avg_attempts_done,
       coalesce(c.waiting, 0) AS waiting
FROM counts AS c
FULL JOIN paused AS p USING (queue)
ORDER BY queue;

-- name: queue_next_due
-- Seconds until the earliest delayed pending job of the given queues becomes visible (NULL when none waits; a time past the range of jobs_visible_at_check counts as its end).
SELECT extract(epoch FROM least(min(visible_at), TIMESTAMPTZ '3000-01-01 00:00:00+00')
                          - coalesce(%(now)s::timestamptz, now()))::float8 AS due_in_seconds
FROM {schema}.jobs
WHERE status = 'pending' AND queue = ANY(%(queues)s::text[])
  AND visible_at > coalesce(%(now)s::timestamptz, now());

-- name: server_connection_limits
-- The server's max_connections and superuser_reserved_connections (the operator's default connection budget).
SELECT current_setting('max_connections')::int AS max_connections,
       current_setting('superuser_reserved_connections')::int AS reserved_connections;

-- name: session_statement_timeout
-- Bound every statement of this session (milliseconds as text), so the server stops work nobody waits for.
SELECT set_config('statement_timeout', %(ms)s, false);

-- name: queue_waiting
-- Due pending jobs held back by flow control, per queue (by name after the keyset cursor `after`, at most `limit` queues; NULL: all) and reason: serial_key (an earlier job of the key is live, or one runs), concurrency (every slot of the task's global concurrency is taken), rate (the task's rate limit allows no start now).
WITH full_tasks AS (
    SELECT l.task,
           l.global_concurrency IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM {schema}.task_slots AS s
               WHERE s.task = l.task AND s.kind = 'concurrency' AND s.job_id IS NULL) AS concurrency,
           l.rate_limit IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM {schema}.task_slots AS s
               WHERE s.task = l.task AND s.kind = 'rate' AND s.free_at <= coalesce(%(now)s::timestamptz, now())) AS rate
    FROM {schema}.task_limits AS l
), due AS (
    SELECT j.queue, j.task, j.serial_key, j.id FROM {schema}.jobs AS j
    WHERE j.status = 'pending' AND j.visible_at <= coalesce(%(now)s::timestamptz, now())
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s) AND j.queue > %(after)s
      AND (j.serial_key IS NOT NULL OR j.task IN (SELECT task FROM full_tasks WHERE concurrency OR rate))
), reasons AS (
    SELECT d.queue,
           d.serial_key IS NOT NULL AND EXISTS (
               SELECT 1 FROM {schema}.jobs AS k
               WHERE k.serial_key = d.serial_key AND k.status IN ('pending', 'processing')
                 AND (k.id < d.id OR k.status = 'processing')) AS serial_key,
           coalesce(f.concurrency, false) AS concurrency, coalesce(f.rate, false) AS rate
    FROM due AS d LEFT JOIN full_tasks AS f ON f.task = d.task
)
SELECT queue, count(*) FILTER (WHERE serial_key) AS serial_key, count(*) FILTER (WHERE concurrency) AS concurrency,
       count(*) FILTER (WHERE rate) AS rate
FROM reasons
GROUP BY queue
ORDER BY queue
LIMIT %(limit)s;

-- name: queue_done_recently
-- Jobs finished as done in the last `seconds`, per queue, from the done index alone (each queue's newest; the queues from finished_queues()), counted up to `cap` in all (the positive confirmation of `skiplock stats`).
SELECT d.queue, count(*) AS done FROM (
    SELECT j.queue FROM (
        SELECT %(queue)s::text AS queue WHERE %(queue)s::text IS NOT NULL
        UNION ALL
        SELECT f.queue FROM {schema}.finished_queues() AS f(queue) WHERE %(queue)s::text IS NULL
    ) AS q CROSS JOIN LATERAL (
        SELECT queue FROM {schema}.jobs
        WHERE status = 'done' AND queue = q.queue AND updated_at > now() - make_interval(secs => %(seconds)s)
        LIMIT %(cap)s
    ) AS j
    LIMIT %(cap)s
) AS d
GROUP BY d.queue
ORDER BY d.queue;
