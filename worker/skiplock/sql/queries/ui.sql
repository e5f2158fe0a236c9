-- name: ui_queue_stats
-- Each queue's (by name after the keyset cursor `after`, at most `limit` of them) waiting (for their parents), ready, delayed, processing, stalled and failed jobs, oldest ready job and next due, and whether it is paused: from index-only scans of the partial indexes of waiting, pending and failed jobs and the few processing rows (queue_stats reads every failed row's heap page).
WITH waiting AS (
    SELECT j.queue, count(*) AS waiting FROM {schema}.jobs AS j
    WHERE j.status = 'waiting' AND j.queue > %(after)s
    GROUP BY j.queue
), pending AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.visible_at <= now()) AS ready,
           count(*) FILTER (WHERE j.visible_at > now()) AS delayed,
           min(j.visible_at) FILTER (WHERE j.visible_at <= now()) AS oldest_ready,
           min(j.visible_at) FILTER (WHERE j.visible_at > now()) AS next_due
    FROM {schema}.jobs AS j WHERE j.status = 'pending' AND j.queue > %(after)s
    GROUP BY j.queue
), processing AS (
    SELECT j.queue, count(*) AS processing,
           count(*) FILTER (WHERE coalesce(j.lease_expires_at, j.locked_at + make_interval(secs => %(lease_seconds)s))
                                  < now()) AS stalled
    FROM {schema}.jobs AS j WHERE j.status = 'processing' AND j.queue > %(after)s
    GROUP BY j.queue
), failed AS (
    SELECT j.queue, count(*) AS failed FROM {schema}.jobs AS j
    WHERE j.status = 'failed' AND j.queue > %(after)s
    GROUP BY j.queue
)
SELECT queue, coalesce(w.waiting, 0) AS waiting, coalesce(p.ready, 0) AS ready, coalesce(p.delayed, 0) AS delayed,
       coalesce(r.processing, 0) AS processing, coalesce(r.stalled, 0) AS stalled, coalesce(f.failed, 0) AS failed,
       coalesce(extract(epoch FROM now() - p.oldest_ready), 0)::float8 AS oldest_ready_age_seconds, p.next_due,
       coalesce(q.paused, false) AS paused
FROM waiting AS w
FULL JOIN pending AS p USING (queue)
FULL JOIN processing AS r USING (queue)
FULL JOIN failed AS f USING (queue)
FULL JOIN (SELECT c.queue, c.paused FROM {schema}.queues AS c WHERE c.queue > %(after)s) AS q USING (queue)
ORDER BY queue
LIMIT %(limit)s;

-- name: ui_done_last_minute
-- Jobs of each given queue finished as done in the last minute, from the done index alone, counted up to `cap` per queue (the UI shows "cap+" past it).
SELECT q.queue, (
    SELECT count(*) FROM (
        SELECT 1 FROM {schema}.jobs AS j
        WHERE j.status = 'done' AND j.queue = q.queue AND j.updated_at > now() - interval '1 minute'
        LIMIT %(cap)s
    ) AS d
) AS done_last_minute
FROM unnest(%(queues)s::text[]) AS q(queue);

-- name: ui_jobs_window
-- One page of jobs, newest id first, below `before`: the filters are applied to a window of at most `scan` rows of the primary key (a sparse filter never reads the whole table; the next page goes on below the window).
SELECT w.id, w.queue, w.task, w.status, w.attempts, w.max_attempts, w.priority, w.visible_at, w.created_at,
       w.updated_at, w.locked_by, left(w.last_error, 300) AS last_error
FROM (
    SELECT * FROM {schema}.jobs AS j WHERE j.id < %(before)s ORDER BY j.id DESC LIMIT %(scan)s
) AS w
WHERE (%(queue)s::text IS NULL OR w.queue = %(queue)s)
  AND (%(task)s::text IS NULL OR w.task = %(task)s)
  AND (%(status)s::text IS NULL OR w.status = %(status)s)
  AND (%(text)s::text IS NULL OR w.last_error ILIKE %(text)s)
  AND (%(since)s::timestamptz IS NULL OR w.created_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR w.created_at < %(until)s)
ORDER BY w.id DESC
LIMIT %(limit)s;

-- name: ui_jobs_failed_window
-- ui_jobs_window over the failed jobs only, read through their own indexes (by id, or by one failure group's fingerprint).
SELECT w.id, w.queue, w.task, w.status, w.attempts, w.max_attempts, w.priority, w.visible_at, w.created_at,
       w.updated_at, w.locked_by, left(w.last_error, 300) AS last_error
FROM (
    SELECT * FROM {schema}.jobs AS j
    WHERE j.status = 'failed' AND j.id < %(before)s
      AND (%(fingerprint)s::text IS NULL OR j.failure_fingerprint = %(fingerprint)s)
    ORDER BY j.id DESC LIMIT %(scan)s
) AS w
WHERE (%(queue)s::text IS NULL OR w.queue = %(queue)s)
  AND (%(task)s::text IS NULL OR w.task = %(task)s)
  AND (%(text)s::text IS NULL OR w.last_error ILIKE %(text)s)
  AND (%(since)s::timestamptz IS NULL OR w.created_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR w.created_at < %(until)s)
ORDER BY w.id DESC
LIMIT %(limit)s;

-- name: ui_window_end
-- The lowest id of the window of `scan` rows below `before` and how many rows it has: where the next page starts when a window held too few matches (none when it has fewer than `scan`: it reached the first row).
SELECT min(w.id) AS id, count(*) AS rows FROM (
    SELECT j.id FROM {schema}.jobs AS j WHERE j.id < %(before)s ORDER BY j.id DESC LIMIT %(scan)s
) AS w;

-- name: ui_failed_window_end
-- ui_window_end over the failed jobs (of one group when `fingerprint` is set).
SELECT min(w.id) AS id, count(*) AS rows FROM (
    SELECT j.id FROM {schema}.jobs AS j
    WHERE j.status = 'failed' AND j.id < %(before)s
      AND (%(fingerprint)s::text IS NULL OR j.failure_fingerprint = %(fingerprint)s)
    ORDER BY j.id DESC LIMIT %(scan)s
) AS w;

-- name: ui_job
-- One job by id with every column the job page shows, the payload's size, and its failure group.
SELECT id, queue, task, payload, octet_length(payload::text) AS payload_bytes, status, priority, attempts,
       max_attempts, visible_at, locked_by, locked_at, lease_expires_at, timeout_seconds, last_error, errors,
       idempotency_key, unique_key, serial_key, created_at, updated_at,
       CASE WHEN status = 'failed' THEN failure_fingerprint END AS fingerprint,
       result, waiting_on, workflow_id
FROM {schema}.jobs WHERE id = %(id)s;

-- name: ui_job_relatives
-- The first `limit` parents and children of a job (lowest ids first) with their status (a purged parent: the status it ended with), for the job page.
(SELECT 'parent' AS kind, d.parent AS id, coalesce(p.status, d.parent_status) AS status
 FROM {schema}.job_dependencies AS d LEFT JOIN {schema}.jobs AS p ON p.id = d.parent
 WHERE d.child = %(id)s ORDER BY d.parent LIMIT %(limit)s)
UNION ALL
(SELECT 'child', d.child, c.status
 FROM {schema}.job_dependencies AS d JOIN {schema}.jobs AS c ON c.id = d.child
 WHERE d.parent = %(id)s ORDER BY d.parent, d.child LIMIT %(limit)s);

-- name: ui_failure_groups
-- Failed jobs grouped by fingerprint, largest first (keyset by jobs, fingerprint): count, first and last failure, a sample (the newest job). The distinct fingerprints are walked in the fingerprint index (one probe each), each group counted by an index-only scan of it: no failed row's heap page is read (a plain GROUP BY is planned on the failed jobs' id index, reading one heap page per failed job).
WITH RECURSIVE fps(fp) AS (
    (SELECT j.failure_fingerprint FROM {schema}.jobs AS j
     WHERE j.status = 'failed' AND j.failure_fingerprint IS NOT NULL
     ORDER BY j.failure_fingerprint LIMIT 1)
    UNION ALL
    SELECT (SELECT j.failure_fingerprint FROM {schema}.jobs AS j
            WHERE j.status = 'failed' AND j.failure_fingerprint > fps.fp
            ORDER BY j.failure_fingerprint LIMIT 1)
    FROM fps WHERE fps.fp IS NOT NULL
), g AS (
    SELECT f.fp AS fingerprint, c.jobs, c.first_seen, c.last_seen, c.sample_id
    FROM (SELECT fp FROM fps WHERE fp IS NOT NULL LIMIT %(max_groups)s) AS f
    CROSS JOIN LATERAL (
        SELECT count(*) AS jobs, min(j.updated_at) AS first_seen, max(j.updated_at) AS last_seen,
               max(j.id) AS sample_id
        FROM {schema}.jobs AS j
        WHERE j.status = 'failed' AND j.failure_fingerprint = f.fp
          AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
    ) AS c
    WHERE c.jobs > 0
)
SELECT g.fingerprint, g.jobs, g.first_seen, g.last_seen, g.sample_id, s.task, s.queue,
       {schema}.error_normalised(s.last_error) AS normalised, left(s.last_error, 500) AS sample_error
FROM g JOIN {schema}.jobs AS s ON s.id = g.sample_id
WHERE (%(after_jobs)s::bigint IS NULL OR (g.jobs, g.fingerprint) < (%(after_jobs)s, %(after_fingerprint)s))
  AND (%(task)s::text IS NULL OR s.task = %(task)s)
ORDER BY g.jobs DESC, g.fingerprint DESC
LIMIT %(limit)s;

-- name: ui_failure_group
-- One failure group by fingerprint: its count, first and last failure and the newest job (none when no failed job has it).
WITH g AS (
    SELECT count(*) AS jobs, min(j.updated_at) AS first_seen, max(j.updated_at) AS last_seen, max(j.id) AS sample_id
    FROM {schema}.jobs AS j
    WHERE j.status = 'failed' AND j.failure_fingerprint = %(fingerprint)s
)
SELECT %(fingerprint)s::text AS fingerprint, g.jobs, g.first_seen, g.last_seen, g.sample_id, s.task, s.queue,
       {schema}.error_normalised(s.last_error) AS normalised, left(s.last_error, 500) AS sample_error
FROM g JOIN {schema}.jobs AS s ON s.id = g.sample_id;

-- name: ui_group_ids
-- The next batch of a failure group's failed jobs above the keyset cursor `after`, oldest first (what a bulk action of the group changes in one transaction).
SELECT j.id FROM {schema}.jobs AS j
WHERE j.status = 'failed' AND j.failure_fingerprint = %(fingerprint)s
  AND j.id > %(after)s AND j.id <= %(upto)s
ORDER BY j.id
LIMIT %(limit)s;

-- name: ui_filter_batch
-- The next batch of a bulk action by filter. Its window: at most `scan` jobs above the keyset cursor `after` and at most `upto` (the newest id when the action started) in the statuses the action changes (`retry`: failed and cancelled, else waiting, pending and processing), each status read in id order through its own partial index (a status list would read the primary key through every done job). Of the window, the first `limit` jobs matching the filter (`ids`), the cursor after this batch (`after`), and whether no job is left above it (`finished`).
WITH w AS (
    SELECT * FROM (
        (SELECT j.id, j.queue, j.task, j.last_error, j.created_at FROM {schema}.jobs AS j
         WHERE %(retry)s AND j.status = 'failed' AND j.id > %(after)s AND j.id <= %(upto)s ORDER BY j.id LIMIT %(scan)s)
        UNION ALL
        (SELECT j.id, j.queue, j.task, j.last_error, j.created_at FROM {schema}.jobs AS j
         WHERE %(retry)s AND j.status = 'cancelled' AND j.id > %(after)s AND j.id <= %(upto)s ORDER BY j.id LIMIT %(scan)s)
        UNION ALL
        (SELECT j.id, j.queue, j.task, j.last_error, j.created_at FROM {schema}.jobs AS j
         WHERE NOT %(retry)s AND j.status = 'pending' AND j.id > %(after)s AND j.id <= %(upto)s ORDER BY j.id LIMIT %(scan)s)
        UNION ALL
        (SELECT j.id, j.queue, j.task, j.last_error, j.created_at FROM {schema}.jobs AS j
         WHERE NOT %(retry)s AND j.status = 'processing' AND j.id > %(after)s AND j.id <= %(upto)s ORDER BY j.id LIMIT %(scan)s)
        UNION ALL
        (SELECT j.id, j.queue, j.task, j.last_error, j.created_at FROM {schema}.jobs AS j
         WHERE NOT %(retry)s AND j.status = 'waiting' AND j.id > %(after)s AND j.id <= %(upto)s ORDER BY j.id LIMIT %(scan)s)
    ) AS u
    ORDER BY u.id
    LIMIT %(scan)s
), hits AS (
    SELECT w.id FROM w
    WHERE (%(queue)s::text IS NULL OR w.queue = %(queue)s)
      AND (%(task)s::text IS NULL OR w.task = %(task)s)
      AND (%(text)s::text IS NULL OR w.last_error ILIKE %(text)s)
      AND (%(since)s::timestamptz IS NULL OR w.created_at >= %(since)s)
      AND (%(until)s::timestamptz IS NULL OR w.created_at < %(until)s)
    ORDER BY w.id
    LIMIT %(limit)s
)
SELECT coalesce((SELECT array_agg(h.id ORDER BY h.id) FROM hits AS h), '{{}}'::bigint[]) AS ids,
       CASE WHEN (SELECT count(*) FROM hits) >= %(limit)s THEN (SELECT max(h.id) FROM hits AS h)
            ELSE coalesce((SELECT max(w.id) FROM w), %(after)s) END AS after,
       (SELECT count(*) FROM w) < %(scan)s AND (SELECT count(*) FROM hits) < %(limit)s AS finished;

-- name: ui_newest_id
-- The newest job id (a bulk action never reaches past it: jobs enqueued while it runs are left alone).
SELECT coalesce(max(id), 0) AS id FROM {schema}.jobs;

-- name: ui_discard_failed
-- Cancel failed jobs (they leave their failure group and are never retried unless asked), recording why; returns the ids changed.
UPDATE {schema}.jobs AS j
SET status = 'cancelled', last_error = 'Cancelled: ' || %(reason)s || ' (was ' || coalesce(j.last_error, '') || ')',
    updated_at = now()
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'failed'
RETURNING j.id;

-- name: ui_workers
-- Workers seen in the rows: those holding jobs now (identity, queues, jobs in flight, last heartbeat), then those that finished one of the last `recent` done jobs; a page of `limit` after the keyset cursor (`after_idle`: 0 holding jobs, 1 not; `after_worker`; NULL: from the first).
WITH running AS (
    SELECT j.locked_by AS worker, array_agg(DISTINCT j.queue ORDER BY j.queue) AS queues, count(*) AS in_flight,
           max(j.locked_at) AS last_heartbeat, min(j.lease_expires_at) AS next_lease_end
    FROM {schema}.jobs AS j
    WHERE j.status = 'processing' AND j.locked_by IS NOT NULL
    GROUP BY j.locked_by
), finished AS (
    SELECT d.locked_by AS worker, array_agg(DISTINCT d.queue ORDER BY d.queue) AS queues, max(d.updated_at) AS last_done
    FROM (
        -- each queue's newest done and failed jobs from their own indexes (the queues from finished_queues())
        SELECT f.locked_by, f.queue, f.updated_at FROM {schema}.finished_queues() AS q(queue) CROSS JOIN LATERAL (
            (SELECT j.locked_by, j.queue, j.updated_at FROM {schema}.jobs AS j
             WHERE j.status = 'done' AND j.queue = q.queue AND j.locked_by IS NOT NULL
             ORDER BY j.updated_at DESC LIMIT %(recent)s)
            UNION ALL
            (SELECT j.locked_by, j.queue, j.updated_at FROM {schema}.jobs AS j
             WHERE j.status = 'failed' AND j.queue = q.queue AND j.locked_by IS NOT NULL
             ORDER BY j.updated_at DESC LIMIT %(recent)s)
        ) AS f
        ORDER BY f.updated_at DESC LIMIT %(recent)s
    ) AS d
    WHERE d.locked_by IS NOT NULL
    GROUP BY d.locked_by
)
SELECT w.* FROM (
    SELECT coalesce(r.worker, f.worker) AS worker, coalesce(r.queues, f.queues) AS queues,
           coalesce(r.in_flight, 0) AS in_flight, r.last_heartbeat, r.next_lease_end, f.last_done,
           (r.worker IS NULL)::int AS idle
    FROM running AS r FULL JOIN finished AS f USING (worker)
) AS w
WHERE %(after_worker)s::text IS NULL OR (w.idle, w.worker) > (%(after_idle)s::int, %(after_worker)s::text)
ORDER BY w.idle, w.worker
LIMIT %(limit)s;

-- name: ui_schedules
-- One page of schedules by name after `after`, with their next run and whether they went stale.
SELECT name, app, queue, task, cron, every_seconds, timezone, next_run_at, last_run_at, seen_at,
       seen_at < now() - make_interval(secs => greatest(%(stale_seconds)s, 3 * period_seconds)) AS stale
FROM {schema}.schedules
WHERE name > %(after)s
ORDER BY name
LIMIT %(limit)s;

-- name: ui_table_estimate
-- The planner's estimate of the jobs table's rows (no row is read; shown labelled as an estimate).
SELECT greatest(c.reltuples, 0)::bigint AS rows FROM pg_catalog.pg_class AS c WHERE c.oid = %(table)s::regclass;

-- name: ui_audit_page
-- One page of the audit table, newest first, below the keyset cursor `before`.
SELECT id, at, actor, action, target, job_count, detail FROM {schema}.ui_audit
WHERE id < %(before)s
ORDER BY id DESC
LIMIT %(limit)s;

-- name: ui_audit_begin
-- Record an action under its idempotency key; returns nothing when the key was used already (a second click).
INSERT INTO {schema}.ui_audit (actor, action, target, action_key, detail)
VALUES (%(actor)s, %(action)s, %(target)s, %(action_key)s, %(detail)s::jsonb)
ON CONFLICT (action_key) DO NOTHING
RETURNING id, at, actor, action, target, job_count, action_key, detail;

-- name: ui_audit_lock
-- The action recorded under this key, locked until the end of the transaction (one batch of it runs at a time).
SELECT id, at, actor, action, target, job_count, action_key, detail FROM {schema}.ui_audit
WHERE action_key = %(action_key)s
FOR UPDATE;

-- name: ui_audit_get
-- One audit row by id.
SELECT id, at, actor, action, target, job_count, action_key, detail FROM {schema}.ui_audit WHERE id = %(id)s;

-- name: ui_audit_progress
-- Add what a batch changed to an action's count and merge `detail` into its detail (its keyset cursor, whether it finished).
UPDATE {schema}.ui_audit SET job_count = job_count + %(changed)s, detail = detail || %(detail)s::jsonb
WHERE id = %(id)s
RETURNING id, at, actor, action, target, job_count, action_key, detail;

-- name: ui_session
-- A UI connection's settings: its statement timeout (milliseconds as text), no JIT and no parallel workers (its statements read bounded parts of indexes).
SELECT set_config('statement_timeout', %(ms)s, false), set_config('jit', 'off', false),
       set_config('max_parallel_workers_per_gather', '0', false);
