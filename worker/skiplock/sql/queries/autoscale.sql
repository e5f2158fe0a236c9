-- name: queue_flow
-- Since the previous poll (its cursors): jobs of the given queues enqueued ready (ids above %(after_id)s, visible within a second of their creation) and jobs done (updated after %(since)s); the highest id and the database's clock become the next poll's cursors. The first poll (NULL cursors) counts nothing.
WITH cursor AS (
    SELECT coalesce(%(after_id)s::bigint, (SELECT coalesce(max(id), 0) FROM {schema}.jobs)) AS after_id,
           coalesce(%(since)s::timestamptz, now()) AS since
), new AS (
    SELECT j.id, j.queue, j.visible_at, j.created_at
    FROM {schema}.jobs AS j
    WHERE j.id > (SELECT after_id FROM cursor)
)
SELECT (SELECT count(*) FROM new
        WHERE queue = ANY(%(queues)s::text[]) AND visible_at <= created_at + interval '1 second') AS arrived,
       (SELECT count(*) FROM {schema}.jobs
        WHERE status = 'done' AND queue = ANY(%(queues)s::text[]) AND updated_at > (SELECT since FROM cursor)) AS done,
       coalesce((SELECT max(id) FROM new), (SELECT after_id FROM cursor)) AS last_id,
       now() AS now;

-- name: queue_due_soon
-- Delayed jobs of the given queues and live schedules on them that come due within %(horizon)s seconds, and the seconds until the first of either comes due (NULL when none waits; a time past the range of jobs_visible_at_check, 'infinity' say, counts as its end: the backlog query never fails on a row).
WITH due AS (
    SELECT visible_at AS at FROM {schema}.jobs
    WHERE status = 'pending' AND queue = ANY(%(queues)s::text[]) AND visible_at > now()
    UNION ALL
    SELECT next_run_at FROM {schema}.schedules
    WHERE queue = ANY(%(queues)s::text[])
      AND seen_at >= now() - make_interval(secs => greatest(%(stale_seconds)s, 3 * period_seconds))
)
SELECT count(*) FILTER (WHERE at <= now() + make_interval(secs => %(horizon)s)) AS due_soon,
       greatest(0, extract(epoch FROM least(min(at), TIMESTAMPTZ '3000-01-01 00:00:00+00') - now()))::float8
           AS next_due_in
FROM due;
