-- name: job_enqueue
-- Insert one job, or find the live job with the same idempotency key; wake workers when it is visible now.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, idempotency_key)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s,
            coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), %(idempotency_key)s)
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

-- name: job_find_by_key
-- The live job of a queue with an idempotency key (used when a concurrent insert won the race).
SELECT id, task FROM {schema}.jobs
WHERE queue = %(queue)s AND idempotency_key = %(idempotency_key)s AND status <> 'failed';

-- name: job_enqueue_many
-- Insert many jobs of one queue in one statement (payloads as one JSON array; duplicate keys skipped); wake once.
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, idempotency_key)
    SELECT %(queue)s, %(task)s, p.payload, %(priority)s, %(max_attempts)s,
           coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), k.key
    FROM jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, n)
    LEFT JOIN unnest(%(keys)s::text[]) WITH ORDINALITY AS k(key, n) USING (n)
    ORDER BY p.n
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL AND status <> 'failed' DO NOTHING
    RETURNING id, visible_at
), woke AS (
    SELECT pg_notify(%(channel)s, %(queue)s)
    WHERE EXISTS (SELECT 1 FROM ins WHERE ins.visible_at <= now())
)
SELECT ins.id, (SELECT count(*) FROM woke) AS notified FROM ins ORDER BY ins.id;

-- name: job_notify
-- Wake the workers of one queue (delivered at commit; repeated notifications in one transaction fold into one).
SELECT pg_notify(%(channel)s, %(queue)s);

-- name: job_complete_and_claim
-- Mark claimed jobs done, fenced (only rows still processing under this worker and attempt), and lease up to `limit` visible pending jobs of one queue: one statement, one commit (claim alone: no ids).
WITH done AS (
    UPDATE {schema}.jobs AS j
    SET status = 'done', locked_at = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
    FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS c(id, attempts)
    WHERE j.id = c.id AND j.attempts = c.attempts AND j.status = 'processing' AND j.locked_by = %(worker)s
    RETURNING j.id
), picked AS (
    SELECT id FROM {schema}.jobs
    WHERE queue = %(queue)s AND status = 'pending'
      AND visible_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY priority DESC, visible_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {schema}.jobs AS j
    SET status = 'processing', attempts = j.attempts + 1, locked_by = %(worker)s,
        locked_at = coalesce(%(now)s::timestamptz, now()), updated_at = coalesce(%(now)s::timestamptz, now())
    FROM picked
    WHERE j.id = picked.id
    RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.priority, j.created_at, j.visible_at,
              j.idempotency_key
)
SELECT false AS completed, c.* FROM claimed AS c
UNION ALL
SELECT true, d.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM done AS d;

-- name: job_complete
-- Mark claimed jobs done, fenced (the UPDATE of job_complete_and_claim, alone: that statement costs a handler's transaction 1.2x).
UPDATE {schema}.jobs AS j
SET status = 'done', locked_at = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS c(id, attempts)
WHERE j.id = c.id AND j.attempts = c.attempts AND j.status = 'processing' AND j.locked_by = %(worker)s
RETURNING j.id;

-- name: job_fail
-- Record failed attempts, fenced: back to pending after a per-job delay, or failed when exhausted or final.
UPDATE {schema}.jobs AS j
SET status = CASE WHEN f.retry AND j.attempts < j.max_attempts THEN 'pending' ELSE 'failed' END,
    visible_at = CASE WHEN f.retry AND j.attempts < j.max_attempts
                      THEN coalesce(%(now)s::timestamptz, now()) + make_interval(secs => f.delay)
                      ELSE j.visible_at END,
    last_error = f.error, locked_by = NULL, locked_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(errors)s::text[], %(delays)s::float8[],
            %(retry)s::boolean[]) AS f(id, attempts, error, delay, retry)
WHERE j.id = f.id AND j.attempts = f.attempts AND j.status = 'processing' AND j.locked_by = %(worker)s
RETURNING j.id, j.status, j.visible_at;

-- name: job_release
-- Hand back claimed jobs unfinished (graceful shutdown) without burning an attempt, fenced.
UPDATE {schema}.jobs AS j
SET status = 'pending', attempts = j.attempts - 1, visible_at = coalesce(%(now)s::timestamptz, now()),
    locked_by = NULL, locked_at = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS r(id, attempts)
WHERE j.id = r.id AND j.attempts = r.attempts AND j.status = 'processing' AND j.locked_by = %(worker)s
RETURNING j.id;

-- name: job_heartbeat
-- Extend the lease of in-flight jobs; the ids not returned have lost their lease.
UPDATE {schema}.jobs AS j
SET locked_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS h(id, attempts)
WHERE j.id = h.id AND j.attempts = h.attempts AND j.status = 'processing' AND j.locked_by = %(worker)s
RETURNING j.id;

-- name: job_recover_expired
-- Put processing jobs whose lease expired back to pending (failed when exhausted), skipping locked rows.
WITH expired AS (
    SELECT id FROM {schema}.jobs
    WHERE status = 'processing' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
      AND locked_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(lease_seconds)s)
    ORDER BY locked_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS j
SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'failed' ELSE 'pending' END,
    visible_at = coalesce(%(now)s::timestamptz, now()), locked_by = NULL, locked_at = NULL,
    last_error = format('LeaseExpired: lease expired, recovered (worker %%s stopped heartbeating; attempt %%s of %%s)',
                        j.locked_by, j.attempts, j.max_attempts),
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM expired
WHERE j.id = expired.id
RETURNING j.id, j.queue, j.status, j.attempts;

-- name: job_get
-- One job by id, every column (CLI and tests).
SELECT id, queue, task, payload, status, priority, attempts, max_attempts, visible_at, locked_by, locked_at,
       lease_expires_at, last_error, idempotency_key, created_at, updated_at
FROM {schema}.jobs WHERE id = %(id)s;

-- name: job_list_failed
-- The most recently failed jobs, newest first.
SELECT id, queue, attempts, max_attempts, last_error, created_at, updated_at
FROM {schema}.jobs
WHERE status = 'failed' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY updated_at DESC, id DESC
LIMIT %(limit)s;

-- name: job_retry_failed
-- Re-drive failed jobs (by ids, or a whole queue) with a fresh set of attempts; keys taken meanwhile are skipped.
UPDATE {schema}.jobs AS j
SET status = 'pending', attempts = 0, visible_at = coalesce(%(now)s::timestamptz, now()),
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE j.status = 'failed'
  AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
  AND (j.idempotency_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {schema}.jobs AS o
        WHERE o.queue = j.queue AND o.idempotency_key = j.idempotency_key AND o.status <> 'failed'))
RETURNING j.id, j.queue;

-- name: job_cancel
-- Cancel pending or processing jobs: they become failed with last_error 'Cancelled'; a running handler's completion is refused.
UPDATE {schema}.jobs AS j
SET status = 'failed', locked_by = NULL, locked_at = NULL,
    last_error = 'Cancelled: ' || %(reason)s, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE j.status IN ('pending', 'processing')
  AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
RETURNING j.id, j.queue;

-- name: job_purge_batch
-- Delete up to `limit` finished jobs last updated before a cutoff (one batch, its own transaction).
WITH doomed AS (
    SELECT id FROM {schema}.jobs
    WHERE status IN ('done', 'failed') AND updated_at < %(before)s
      AND status = ANY(%(statuses)s::text[])
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
    ORDER BY updated_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {schema}.jobs AS j USING doomed WHERE j.id = doomed.id;
