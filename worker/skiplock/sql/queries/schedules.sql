-- name: schedule_register
-- Register (or refresh) one schedule; its next run is kept unless its timing changed or it had gone stale (then it starts from the next tick); a parked schedule is unparked.
INSERT INTO {schema}.schedules AS s (name, app, queue, task, cron, every_seconds, timezone, priority, max_attempts,
                                     next_run_at, period_seconds)
VALUES (%(name)s, %(app)s, %(queue)s, %(task)s, %(cron)s, %(every_seconds)s, %(timezone)s, %(priority)s,
        %(max_attempts)s, %(next_run_at)s, %(period_seconds)s)
ON CONFLICT (name) DO UPDATE
SET app = EXCLUDED.app, queue = EXCLUDED.queue, task = EXCLUDED.task, cron = EXCLUDED.cron,
    every_seconds = EXCLUDED.every_seconds, timezone = EXCLUDED.timezone, priority = EXCLUDED.priority,
    max_attempts = EXCLUDED.max_attempts, period_seconds = EXCLUDED.period_seconds,
    next_run_at = CASE
        WHEN (s.cron, s.every_seconds, s.timezone) IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.every_seconds,
                                                                     EXCLUDED.timezone)
          OR s.seen_at < now() - make_interval(secs => greatest(%(stale_seconds)s, 3 * s.period_seconds))
        THEN EXCLUDED.next_run_at ELSE s.next_run_at END,
    seen_at = now(), updated_at = now(), parked = NULL
RETURNING name, next_run_at;

-- name: schedule_due
-- The schedules due now (of some names, some queues, or all), skipping stale and parked ones and those the firer set aside, with the database's clock.
SELECT name, queue, task, cron, every_seconds, timezone, next_run_at, now() AS now
FROM {schema}.schedules
WHERE next_run_at <= now() AND parked IS NULL AND name <> ALL(%(skip)s::text[])
  AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND seen_at >= now() - make_interval(secs => greatest(%(stale_seconds)s, 3 * period_seconds))
ORDER BY next_run_at
LIMIT 100;

-- name: schedule_next_due
-- Seconds until the next run of these schedules (of some names, some queues, or all; stale and parked ones and those the firer set aside left out), or NULL.
SELECT extract(epoch FROM min(next_run_at) - now())::float8 AS seconds
FROM {schema}.schedules
WHERE parked IS NULL AND name <> ALL(%(skip)s::text[])
  AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND seen_at >= now() - make_interval(secs => greatest(%(stale_seconds)s, 3 * period_seconds));

-- name: schedule_fire
-- Fire one tick: move next_run_at on only if it is still the one read (compare-and-set), insert the tick's job (unique by schedule and tick time), wake the queue; one statement.
WITH due AS (
    UPDATE {schema}.schedules
    SET next_run_at = %(following)s, last_run_at = %(tick)s, updated_at = now()
    WHERE name = %(name)s AND next_run_at = %(expected)s
    RETURNING queue, task, priority, max_attempts
), ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, unique_key, unique_states)
    SELECT due.queue, due.task, %(payload)s::jsonb, due.priority, due.max_attempts, %(unique_key)s,
           %(unique_states)s::text[]
    FROM due
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status = ANY (unique_states) DO NOTHING
    RETURNING id, queue
), woke AS (
    SELECT pg_notify(%(channel)s, ins.queue) FROM ins
)
SELECT (SELECT count(*) FROM due) AS advanced, (SELECT id FROM ins) AS id, (SELECT count(*) FROM woke) AS notified;

-- name: schedule_park
-- Stop firing one schedule that cannot be fired, saying why (its app's next registration unparks it).
UPDATE {schema}.schedules SET parked = %(reason)s, updated_at = now() WHERE name = %(name)s;

-- name: schedule_list
-- Every schedule with its next run, whether it went stale (not registered for a long time: not fired) and why it is parked (not fired either).
SELECT name, app, queue, task, cron, every_seconds, timezone, next_run_at, last_run_at, seen_at, parked,
       seen_at < now() - make_interval(secs => greatest(%(stale_seconds)s, 3 * period_seconds)) AS stale
FROM {schema}.schedules
ORDER BY name;

-- name: schedule_delete
-- Remove schedules by name.
DELETE FROM {schema}.schedules WHERE name = ANY(%(names)s::text[]) RETURNING name;

-- name: schedule_prune
-- Remove the schedules of one app that it no longer defines.
DELETE FROM {schema}.schedules WHERE app = %(app)s AND NOT (name = ANY(%(names)s::text[])) RETURNING name;

-- name: schedule_now
-- The database's clock (ticks are computed against it, never against a host's).
SELECT now() AS now;
