-- name: job_enqueue
-- Insert one job, or find the live job with the same idempotency key; wake workers when it is visible now.
-- variant: job_enqueue_traced (traced)
-- variant: job_enqueue_by_name (by_name)
-- variant: job_enqueue_by_name_traced (by_name traced)
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, idempotency_key,
                               timeout_seconds,
                               serial_key, serial_skip_on_retry/*[traced*/, trace_context/*traced]*/)
    VALUES (%(queue)s, %(task)s::text, %(payload)s::jsonb,
/*[!by_name*/
            %(priority)s, %(max_attempts)s,
/*!by_name]*/
/*[by_name*/
            coalesce(%(priority)s::smallint, (SELECT t.priority FROM {schema}.tasks AS t WHERE t.name = %(task)s), 0),
            coalesce(%(max_attempts)s::integer, (SELECT t.max_attempts FROM {schema}.tasks AS t WHERE t.name = %(task)s),
                     %(max_attempts_default)s),
/*by_name]*/
            coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), %(idempotency_key)s,
            %(timeout_seconds)s,
            %(serial_key)s,
/*[!by_name*/
            %(serial_skip_on_retry)s
/*!by_name]*/
/*[by_name*/
            coalesce(%(serial_skip_on_retry)s::boolean,
                     (SELECT t.serial_skip_on_retry FROM {schema}.tasks AS t WHERE t.name = %(task)s), false)
/*by_name]*/
/*[traced*/
            , %(trace_context)s::jsonb
/*traced]*/
    )
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

-- name: job_insert_usual
-- The usual single enqueue (no key, no option): insert the job, every other column at its default (visible now), and
-- wake workers; the same row as job_enqueue's (the notify's void value in place of its count).
INSERT INTO {schema}.jobs (queue, payload, max_attempts)
VALUES (%(queue)s, %(payload)s::jsonb, %(max_attempts)s)
RETURNING id, false AS duplicate, pg_notify(%(channel)s, %(queue)s) AS notified;

-- name: job_find_by_key
-- The live job of a queue with an idempotency key (used when a concurrent insert won the race).
SELECT id, task FROM {schema}.jobs
WHERE queue = %(queue)s AND idempotency_key = %(idempotency_key)s AND status <> 'failed';

-- name: job_enqueue_many
-- Insert many jobs of one queue in one statement (payloads as one JSON array; duplicate keys skipped); wake once.
-- variant: job_enqueue_many_traced (traced)
-- variant: job_enqueue_many_by_name (by_name)
-- variant: job_enqueue_many_by_name_traced (by_name traced)
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, idempotency_key,
                               serial_key, serial_skip_on_retry/*[traced*/, trace_context/*traced]*/)
    SELECT %(queue)s, %(task)s::text, p.payload,
/*[!by_name*/
           %(priority)s, %(max_attempts)s,
/*!by_name]*/
/*[by_name*/
           coalesce(%(priority)s::smallint, (SELECT t.priority FROM {schema}.tasks AS t WHERE t.name = %(task)s), 0),
           coalesce(%(max_attempts)s::integer, (SELECT t.max_attempts FROM {schema}.tasks AS t WHERE t.name = %(task)s),
                    %(max_attempts_default)s),
/*by_name]*/
           coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), k.key,
           %(serial_key)s,
/*[!by_name*/
           %(serial_skip_on_retry)s
/*!by_name]*/
/*[by_name*/
           coalesce(%(serial_skip_on_retry)s::boolean,
                    (SELECT t.serial_skip_on_retry FROM {schema}.tasks AS t WHERE t.name = %(task)s), false)
/*by_name]*/
/*[traced*/
           , %(trace_context)s::jsonb
/*traced]*/
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

-- name: job_reserve_ids
-- Reserve `n` new job ids (ascending) and the visible_at of the jobs job_copy_many writes next in this transaction; wake the queue's workers (at commit) when that is now.
WITH seq(s) AS MATERIALIZED (
    SELECT pg_get_serial_sequence('{schema}.jobs', 'id')::regclass
), due(visible_at) AS MATERIALIZED (
    SELECT coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s)
), woke AS (
    SELECT pg_notify(%(channel)s, %(queue)s) FROM due WHERE due.visible_at <= now()
)
SELECT array(SELECT nextval(seq.s) AS id FROM seq, generate_series(1, %(n)s) ORDER BY id) AS ids, due.visible_at,
       (SELECT count(*) FROM woke) AS notified
FROM due;

-- name: job_copy_many
-- Write jobs with the ids job_reserve_ids reserved, as COPY text rows: id, payload, then the enqueue's options (traced: then the trace context of its span, the same for every row).
-- variant: job_copy_many_traced (traced)
COPY {schema}.jobs (id, payload, queue, task, priority, max_attempts, visible_at, serial_key, serial_skip_on_retry/*[traced*/, trace_context/*traced]*/)
FROM STDIN;

-- name: job_copy_many_plain
-- job_copy_many for jobs whose options all keep the table's defaults (no task, priority 0, 5 attempts, due at the transaction's start, no serial key): id, payload and queue only, a third less for PostgreSQL to read.
COPY {schema}.jobs (id, payload, queue) FROM STDIN;

-- name: job_find_by_keys
-- The job holding each of these idempotency keys of a queue (the live one, else the newest): what the duplicates of enqueue_many are.
SELECT DISTINCT ON (idempotency_key) idempotency_key AS key, id FROM {schema}.jobs
WHERE queue = %(queue)s AND idempotency_key = ANY(%(keys)s::text[])
ORDER BY idempotency_key, (status <> 'failed') DESC, id DESC;

-- name: job_enqueue_unique
-- Insert one unique job, or find the job holding its unique key (job_replace_unique may follow); wake workers when it is visible now.
-- variant: job_enqueue_unique_traced (traced)
-- variant: job_enqueue_unique_by_name (by_name)
-- variant: job_enqueue_unique_by_name_traced (by_name traced)
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, timeout_seconds,
                               unique_key, unique_states, serial_key, serial_skip_on_retry/*[traced*/, trace_context/*traced]*/)
    VALUES (%(queue)s, %(task)s::text, %(payload)s::jsonb,
/*[!by_name*/
            %(priority)s, %(max_attempts)s,
/*!by_name]*/
/*[by_name*/
            coalesce(%(priority)s::smallint, (SELECT t.priority FROM {schema}.tasks AS t WHERE t.name = %(task)s), 0),
            coalesce(%(max_attempts)s::integer, (SELECT t.max_attempts FROM {schema}.tasks AS t WHERE t.name = %(task)s),
                     %(max_attempts_default)s),
/*by_name]*/
            coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), %(timeout_seconds)s,
            %(unique_key)s, %(unique_states)s::text[], %(serial_key)s,
/*[!by_name*/
            %(serial_skip_on_retry)s
/*!by_name]*/
/*[by_name*/
            coalesce(%(serial_skip_on_retry)s::boolean,
                     (SELECT t.serial_skip_on_retry FROM {schema}.tasks AS t WHERE t.name = %(task)s), false)
/*by_name]*/
/*[traced*/
            , %(trace_context)s::jsonb
/*traced]*/
    )
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

-- name: job_find_by_unique_key
-- The job holding a unique key (used when a concurrent insert won the race): the one holding it now, else the newest with it.
SELECT id, true AS duplicate FROM {schema}.jobs WHERE unique_key = %(unique_key)s
ORDER BY (status = ANY (unique_states)) DESC, id DESC
LIMIT 1;

-- name: job_enqueue_many_unique
-- Insert many unique jobs of one queue in one statement (distinct keys; a taken key is skipped: job_replace_unique may follow); wake once.
-- variant: job_enqueue_many_unique_traced (traced)
-- variant: job_enqueue_many_unique_by_name (by_name)
-- variant: job_enqueue_many_unique_by_name_traced (by_name traced)
WITH ins AS (
    INSERT INTO {schema}.jobs (queue, task, payload, priority, max_attempts, visible_at, unique_key,
                               unique_states, serial_key, serial_skip_on_retry/*[traced*/, trace_context/*traced]*/)
    SELECT %(queue)s, %(task)s::text, p.payload,
/*[!by_name*/
           %(priority)s, %(max_attempts)s,
/*!by_name]*/
/*[by_name*/
           coalesce(%(priority)s::smallint, (SELECT t.priority FROM {schema}.tasks AS t WHERE t.name = %(task)s), 0),
           coalesce(%(max_attempts)s::integer, (SELECT t.max_attempts FROM {schema}.tasks AS t WHERE t.name = %(task)s),
                    %(max_attempts_default)s),
/*by_name]*/
           coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), k.key,
           %(unique_states)s::text[], %(serial_key)s,
/*[!by_name*/
           %(serial_skip_on_retry)s
/*!by_name]*/
/*[by_name*/
           coalesce(%(serial_skip_on_retry)s::boolean,
                    (SELECT t.serial_skip_on_retry FROM {schema}.tasks AS t WHERE t.name = %(task)s), false)
/*by_name]*/
/*[traced*/
           , %(trace_context)s::jsonb
/*traced]*/
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

-- name: job_replace_unique
-- Give the pending jobs holding these unique keys the new payload, priority and run time (unique_conflict "replace", after the insert found them); running or finished ones are left as they are; wake workers when one is visible now.
-- variant: job_replace_unique_by_name (by_name)
WITH upd AS (
    UPDATE {schema}.jobs AS j
    SET payload = p.payload,
/*[!by_name*/
        priority = %(priority)s,
/*!by_name]*/
/*[by_name*/
        priority = coalesce(%(priority)s::smallint, (SELECT t.priority FROM {schema}.tasks AS t WHERE t.name = %(task)s), 0),
/*by_name]*/
        visible_at = coalesce(%(run_at)s::timestamptz, now()) + make_interval(secs => %(delay)s), updated_at = now()
    FROM jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, n)
    JOIN unnest(%(keys)s::text[]) WITH ORDINALITY AS k(key, n) USING (n)
    WHERE j.unique_key = k.key AND j.status = 'pending' AND j.status = ANY (j.unique_states)
    RETURNING j.id, j.visible_at
), woke AS (
    SELECT pg_notify(%(channel)s, %(queue)s) WHERE EXISTS (SELECT 1 FROM upd WHERE upd.visible_at <= now())
)
SELECT upd.id, (SELECT count(*) FROM woke) AS notified FROM upd;

-- name: job_find_by_unique_keys
-- The job holding each of these unique keys (what the skipped payloads of a unique enqueue_many are): the one holding it now, else the newest.
SELECT DISTINCT ON (unique_key) unique_key AS key, id FROM {schema}.jobs
WHERE unique_key = ANY(%(keys)s::text[])
ORDER BY unique_key, (status = ANY (unique_states)) DESC, id DESC;

-- name: job_notify
-- Wake the workers of one queue (delivered at commit; repeated notifications in one transaction fold into one).
SELECT pg_notify(%(channel)s, %(queue)s);

-- name: job_complete
-- Mark claimed jobs done, fenced (the UPDATE of job_complete_and_claim, alone: that statement costs a handler's transaction 1.2x).
UPDATE {schema}.jobs AS j
SET status = 'done', locked_at = NULL, lease_expires_at = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE j.id = ANY((SELECT %(ids)s::bigint[])::bigint[])
      AND ((j.id, j.attempts) IN (SELECT unnest(%(ids)s::bigint[]), unnest(%(attempts)s::integer[]))) IS TRUE
      AND j.status = (SELECT 'processing'::text) AND j.locked_by = %(worker)s
RETURNING j.id;

-- name: job_complete_one
-- Mark one claimed job done, fenced, in its handler's transaction: job_complete for one job by primary key, which PostgreSQL plans once per connection (job_complete's unnest made it plan every call afresh, and run longer: ADR 0007).
UPDATE {schema}.jobs AS j
SET status = 'done', locked_at = NULL, lease_expires_at = NULL, updated_at = now()
WHERE j.id = %(id)s AND j.attempts = %(attempts)s AND j.status = (SELECT 'processing'::text)
  AND j.locked_by = %(worker)s
RETURNING j.id;

-- name: job_confirm_done
-- Of these attempts, the ones this worker already completed (a retried completion whose first reply was lost).
SELECT j.id FROM {schema}.jobs AS j
WHERE j.id = ANY((SELECT %(ids)s::bigint[])::bigint[])
      AND j.attempts = (%(attempts)s::integer[])[array_position(%(ids)s::bigint[], j.id)] AND j.status = 'done' AND j.locked_by = %(worker)s;

-- name: job_fail
-- Record failed attempts, fenced: back to pending after a per-job delay, or failed (with its failure fingerprint) when exhausted or final; each appends {{attempt, at, error, worker, traceback}} to the error history (the last 20 kept; no traceback key when none).
UPDATE {schema}.jobs AS j
SET status = CASE WHEN f.retry AND j.attempts < j.max_attempts THEN 'pending' ELSE 'failed' END,
    visible_at = CASE WHEN f.retry AND j.attempts < j.max_attempts
                      THEN coalesce(%(now)s::timestamptz, now()) + make_interval(secs => f.delay)
                      ELSE j.visible_at END,
    last_error = f.error, locked_by = NULL, locked_at = NULL, lease_expires_at = NULL,
    failure_fingerprint = CASE WHEN f.retry AND j.attempts < j.max_attempts THEN j.failure_fingerprint
                               ELSE {schema}.error_fingerprint(j.task, f.error) END,
    errors = jsonb_path_query_array(
        j.errors || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
            'attempt', j.attempts, 'at', coalesce(%(now)s::timestamptz, now()),
            'error', left(f.error, %(history_chars)s), 'worker', %(worker)s, 'traceback', f.traceback))),
        '$[last - 19 to last]'),
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(errors)s::text[], %(delays)s::float8[],
            %(retry)s::boolean[], %(tracebacks)s::text[]) AS f(id, attempts, error, delay, retry, traceback)
WHERE j.id = f.id AND j.attempts = f.attempts AND j.status = (SELECT 'processing'::text)
  AND j.locked_by = %(worker)s
RETURNING j.id, j.status, j.visible_at;

-- name: job_snooze
-- Reschedule claimed jobs whose handlers snoozed them, fenced, after a per-job delay and without using an attempt (nothing is added to the error history).
UPDATE {schema}.jobs AS j
SET status = 'pending', attempts = j.attempts - 1,
    visible_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => s.delay),
    locked_by = NULL, locked_at = NULL, lease_expires_at = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(delays)s::float8[]) AS s(id, attempts, delay)
WHERE j.id = s.id AND j.attempts = s.attempts AND j.status = (SELECT 'processing'::text)
  AND j.locked_by = %(worker)s
RETURNING j.id;

-- name: job_release
-- Hand back claimed jobs unfinished (graceful shutdown) without burning an attempt, fenced.
UPDATE {schema}.jobs AS j
SET status = 'pending', attempts = j.attempts - 1, visible_at = coalesce(%(now)s::timestamptz, now()),
    locked_by = NULL, locked_at = NULL, lease_expires_at = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE j.id = ANY((SELECT %(ids)s::bigint[])::bigint[])
      AND j.attempts = (%(attempts)s::integer[])[array_position(%(ids)s::bigint[], j.id)] AND j.status = (SELECT 'processing'::text) AND j.locked_by = %(worker)s
RETURNING j.id;

-- name: job_release_orphans
-- Hand back, without burning an attempt, jobs leased to this worker that it does not know it runs (a claim committed but its reply was lost with the connection).
UPDATE {schema}.jobs AS j
SET status = 'pending', attempts = greatest(j.attempts - 1, 0), visible_at = coalesce(%(now)s::timestamptz, now()),
    locked_by = NULL, locked_at = NULL, lease_expires_at = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE j.status = 'processing' AND j.locked_by = %(worker)s AND j.queue = ANY(%(queues)s::text[])
  AND NOT (j.id = ANY(%(known)s::bigint[]))
RETURNING j.id, j.queue;

-- name: job_fail_unique_blocked
-- Fail the pending jobs of these queues that no claim can start: their unique_states hold processing but not pending, and another job holds their unique key (or an earlier such job will), so the claim that took one broke jobs_unique_idx and every claim after it too. Only rows stored outside jobs_unique_states_check (a dropped constraint, a restored dump) can be such; a job whose unique_states also hold failed is cancelled instead, so that it stays outside the index.
WITH entering AS (
    SELECT id, unique_key FROM {schema}.jobs
    WHERE status = 'pending' AND queue = ANY(%(queues)s::text[]) AND unique_key IS NOT NULL
      AND NOT coalesce('pending' = ANY (unique_states), false) AND coalesce('processing' = ANY (unique_states), false)
), blocked AS (
    SELECT e.id FROM entering AS e
    WHERE EXISTS (SELECT 1 FROM {schema}.jobs AS k
                  WHERE k.unique_key = e.unique_key AND k.id <> e.id AND coalesce(k.status = ANY (k.unique_states), false))
       OR EXISTS (SELECT 1 FROM entering AS k WHERE k.unique_key = e.unique_key AND k.id < e.id)
)
UPDATE {schema}.jobs AS j
SET status = CASE WHEN 'failed' = ANY (j.unique_states) THEN 'cancelled' ELSE 'failed' END, updated_at = now(),
    last_error = 'UniqueViolation: another job holds this job''s unique key, and its unique_states ('
                 || j.unique_states::text || ') lack pending: it could never run'
FROM blocked WHERE j.id = blocked.id AND j.status = 'pending'
  AND NOT ('failed' = ANY (j.unique_states) AND 'cancelled' = ANY (j.unique_states))
RETURNING j.id;

-- name: job_heartbeat
-- Extend the leases of in-flight jobs (each by its own lease, never past its timeout counted from the claim, which set updated_at, a timeout over 31536000 s, the bound of jobs_timeout_bound_check, taken as that bound, so no value overflows; locking in id order and skipping rows being completed, so it never waits or deadlocks); returns the ids whose lease is lost.
WITH h AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(leases)s::float8[], %(timeouts)s::float8[])
        AS h(id, attempts, lease, timeout)
), mine AS (
    SELECT j.id, h.lease,
           j.updated_at + make_interval(secs => CASE WHEN h.timeout > 0 THEN least(h.timeout, 31536000) END)
               AS timeout_at
    FROM {schema}.jobs AS j JOIN h ON j.id = h.id AND j.attempts = h.attempts
    WHERE j.status = (SELECT 'processing'::text) AND j.locked_by = %(worker)s
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
), renewed AS (
    UPDATE {schema}.jobs AS j
    SET locked_at = coalesce(%(now)s::timestamptz, now()),
        lease_expires_at = least(coalesce(%(now)s::timestamptz, now()) + make_interval(secs => mine.lease),
                                 greatest(coalesce(mine.timeout_at, 'infinity'), j.lease_expires_at))
    FROM mine WHERE j.id = mine.id
    RETURNING j.id
)
SELECT h.id FROM h
WHERE NOT EXISTS (
    SELECT 1 FROM {schema}.jobs AS j
    WHERE j.id = h.id AND j.attempts = h.attempts AND j.status = (SELECT 'processing'::text)
      AND j.locked_by = %(worker)s);

-- name: job_recover_expired
-- Put processing jobs whose stored lease deadline passed back to pending (failed when exhausted), skipping locked rows; rows without a deadline (claimed before it was stored) use locked_at plus `lease_seconds`.
WITH expired AS (
    SELECT id FROM {schema}.jobs
    WHERE status = 'processing' AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND (lease_expires_at < coalesce(%(now)s::timestamptz, now())
           OR (lease_expires_at IS NULL
               AND locked_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(lease_seconds)s)))
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS j
SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'failed' ELSE 'pending' END,
    visible_at = coalesce(%(now)s::timestamptz, now()), locked_by = NULL, locked_at = NULL, lease_expires_at = NULL,
    last_error = format('LeaseExpired: lease expired, recovered (worker %%s stopped heartbeating; attempt %%s of %%s)',
                        j.locked_by, j.attempts, j.max_attempts),
    errors = jsonb_path_query_array(
        j.errors || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempts, 'at', coalesce(%(now)s::timestamptz, now()),
            'error', 'LeaseExpired: lease expired, recovered', 'worker', j.locked_by)),
        '$[last - 19 to last]'),
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM expired
WHERE j.id = expired.id
RETURNING j.id, j.queue, j.status, j.attempts;

-- name: job_get
-- One job by id, every column (CLI show and tests); the payload as text, decoded in Python (one nested too deep to read is shown, not raised).
SELECT id, queue, task, payload::text AS payload, status, priority, attempts, max_attempts, visible_at, locked_by,
       locked_at, lease_expires_at, timeout_seconds, last_error, errors, idempotency_key, created_at, updated_at,
       result, waiting_on, workflow_id
FROM {schema}.jobs WHERE id = %(id)s;

-- name: job_get_many
-- Jobs by id with their status (what cancel and retry report for the ids they did not change).
SELECT id, queue, status FROM {schema}.jobs WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id;

-- name: job_list_enqueued
-- Jobs by task, queue and status (any when NULL), oldest first (skiplock.testing).
SELECT id, queue, task, payload, status, priority, attempts, max_attempts, visible_at, idempotency_key, created_at
FROM {schema}.jobs
WHERE (%(task)s::text IS NULL OR task = %(task)s) AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
ORDER BY id;

-- name: job_list_failed
-- The most recently failed jobs, newest first.
SELECT id, queue, attempts, max_attempts, last_error, created_at, updated_at
FROM {schema}.jobs
WHERE status = 'failed' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY updated_at DESC, id DESC
LIMIT %(limit)s;

-- name: job_list_stalled
-- Processing jobs past their stored lease deadline (rows without one: locked_at plus `lease_seconds`), oldest deadline first: their worker stopped heartbeating.
SELECT id, queue, task, locked_by, locked_at, lease_expires_at, attempts, max_attempts, last_error, updated_at
FROM {schema}.jobs
WHERE status = 'processing' AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND coalesce(lease_expires_at, locked_at + make_interval(secs => %(lease_seconds)s))
      < coalesce(%(now)s::timestamptz, now())
ORDER BY coalesce(lease_expires_at, locked_at + make_interval(secs => %(lease_seconds)s)), id
LIMIT %(limit)s;

-- name: job_retry_failed
-- Re-drive failed jobs (cancelled ones too only when asked: `statuses`) by ids, or a whole queue, with a fresh set of attempts; keys taken meanwhile are skipped; wakes the workers of their queues at commit.
WITH retried AS (
UPDATE {schema}.jobs AS j
SET status = 'pending', attempts = 0, visible_at = coalesce(%(now)s::timestamptz, now()),
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE j.status = ANY(%(statuses)s::text[])
  AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
  AND (j.idempotency_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {schema}.jobs AS o
        WHERE o.queue = j.queue AND o.idempotency_key = j.idempotency_key AND o.status <> 'failed'
          AND o.id <> j.id))
  AND (j.unique_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {schema}.jobs AS o
        WHERE o.unique_key = j.unique_key AND o.status = ANY (o.unique_states) AND o.id <> j.id))
RETURNING j.id, j.queue
), woke AS (
    SELECT pg_notify(%(channel)s, q.queue) FROM (SELECT DISTINCT queue FROM retried) AS q
)
SELECT r.id, r.queue, (SELECT count(*) FROM woke) AS notified FROM retried AS r;

-- name: job_cancel
-- Cancel waiting, pending and running jobs (by ids, or a queue, optionally one task) at once, locking in id order: a running handler's completion is then refused by the fence, and the workers are told on the control channel.
WITH picked AS (
    SELECT id, status FROM {schema}.jobs
    WHERE status IN ('pending', 'processing', 'waiting')
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
      AND (%(task)s::text IS NULL OR task = %(task)s)
    ORDER BY id
    FOR UPDATE
), cancelled AS (
    UPDATE {schema}.jobs AS j
    SET status = 'cancelled', lease_expires_at = NULL, last_error = 'Cancelled: ' || %(reason)s,
        updated_at = coalesce(%(now)s::timestamptz, now())
    FROM picked
    WHERE j.id = picked.id
    RETURNING j.id, j.queue, picked.status AS was
), told AS (
    SELECT pg_notify((SELECT name FROM {schema}.control_channel), 'cancel') WHERE EXISTS (SELECT 1 FROM cancelled WHERE was = 'processing')
)
SELECT c.id, c.queue, c.was, (SELECT count(*) FROM told) AS told FROM cancelled AS c ORDER BY c.id;

-- name: job_cancelled_among
-- Of these attempts held by this worker, the ids cancelled meanwhile (checked on a control notification and by the heartbeat).
SELECT j.id FROM {schema}.jobs AS j
WHERE j.id = ANY((SELECT %(ids)s::bigint[])::bigint[])
      AND j.attempts = (%(attempts)s::integer[])[array_position(%(ids)s::bigint[], j.id)] AND j.status = 'cancelled' AND j.locked_by = %(worker)s;

-- name: queue_set_paused
-- Pause or resume a queue (stored in the queues table); tells the workers on the control channel and, on resume, wakes those serving it.
WITH upsert AS (
    INSERT INTO {schema}.queues AS q (queue, paused, updated_at)
    VALUES (%(queue)s, %(paused)s, coalesce(%(now)s::timestamptz, now()))
    ON CONFLICT (queue) DO UPDATE SET paused = excluded.paused, updated_at = excluded.updated_at
    RETURNING q.queue, q.paused
), told AS (
    SELECT pg_notify((SELECT name FROM {schema}.control_channel), 'pause') UNION ALL
    SELECT pg_notify(%(channel)s, %(queue)s) WHERE NOT %(paused)s
)
SELECT u.queue, u.paused, (SELECT count(*) FROM told) AS told FROM upsert AS u;

-- name: control_channel_read
-- The name of this schema's control channel (random, readable by the schema's roles only: the control_channel migration); each worker's listener reads it when it connects.
SELECT name FROM {schema}.control_channel;

-- name: session_generic_plans
-- The claimer's connection keeps one generic plan per claim statement (a custom plan is planned again at each claim, and PostgreSQL keeps choosing custom ones once the table has statistics: ADR 0007).
SELECT set_config('plan_cache_mode', 'force_generic_plan', false);

-- name: session_reset_plans
-- Back to the session's default before the claimer's connection returns to the pool.
SELECT set_config('plan_cache_mode', reset_val, false) FROM pg_settings WHERE name = 'plan_cache_mode';

-- name: session_forget_plans
-- Drop the plans of every statement this session prepared, keeping the statements (psycopg's names stay valid): a control connection planned for a much smaller jobs table plans each statement again at its next execution, for the table as it is, and keeps its server session (a new one costs a backend start and plans made with cold caches).
DISCARD PLANS;

-- name: session_control
-- Every control connection of a worker works in UTC: the timestamps of a claim's rows then load without a time zone conversion (converting two timestamps a row to the server's zone was a measurable share of a worker's work: ADR 0007), so `job.created_at` and `job.visible_at` are UTC. And without JIT: a plan whose LIMIT the planner cannot see (a generic plan, or the per-queue shares of a claim of several queues, which it guesses at a tenth of the table) passes jit_above_cost on a large table, and compiling it cost far more than the claim itself (ADR 0007); no statement of a worker is large enough to gain from it.
SELECT set_config('TimeZone', 'UTC', false), set_config('jit', 'off', false);

-- name: jobs_table_bytes
-- The size of the jobs table's file (no row is read): a worker compares it with the size its prepared plans were made for.
SELECT pg_relation_size(%(table)s::regclass) AS bytes;

-- name: queue_paused
-- The paused queues among the given ones (all when NULL).
SELECT queue, updated_at FROM {schema}.queues
WHERE paused AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
ORDER BY queue;

-- name: job_purge
-- One batch of a purge: up to `limit` done, failed and cancelled jobs each, older than that status's age in seconds (NULL: none of that status), of one queue or all (each queue's oldest from that status's own index, the queues from finished_queues()); run in the transaction that took the schema's purge lock; returns the status of each row deleted.
WITH q AS MATERIALIZED (
    SELECT %(queue)s::text AS queue WHERE %(queue)s::text IS NOT NULL
    UNION ALL
    SELECT f.queue FROM {schema}.finished_queues() AS f(queue) WHERE %(queue)s::text IS NULL
), done AS (
    SELECT d.id FROM q CROSS JOIN LATERAL (
        SELECT id FROM {schema}.jobs
        WHERE status = 'done' AND queue = q.queue AND %(done_seconds)s::float8 IS NOT NULL
          AND updated_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(done_seconds)s::float8)
        ORDER BY updated_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
    ) AS d
    LIMIT %(limit)s
), failed AS (
    SELECT d.id FROM q CROSS JOIN LATERAL (
        SELECT id FROM {schema}.jobs
        WHERE status = 'failed' AND queue = q.queue AND %(failed_seconds)s::float8 IS NOT NULL
          AND updated_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(failed_seconds)s::float8)
        ORDER BY updated_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
    ) AS d
    LIMIT %(limit)s
), cancelled AS (
    SELECT d.id FROM q CROSS JOIN LATERAL (
        SELECT id FROM {schema}.jobs
        WHERE status = 'cancelled' AND queue = q.queue AND %(cancelled_seconds)s::float8 IS NOT NULL
          AND updated_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(cancelled_seconds)s::float8)
        ORDER BY updated_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
    ) AS d
    LIMIT %(limit)s
)
DELETE FROM {schema}.jobs AS j
USING (SELECT id FROM done UNION ALL SELECT id FROM failed UNION ALL SELECT id FROM cancelled) AS doomed
WHERE j.id = doomed.id
RETURNING j.status;

-- name: retention_xact_lock
-- Wait for the purge lock of this schema, held until the current transaction ends (an explicit purge: `skiplock purge`, Queue.purge); a row lock, so only a role allowed to update the locks table (the owner) can take or hold it.
SELECT true AS locked FROM {schema}.locks WHERE name = 'purge' FOR UPDATE;

-- name: retention_try_xact_lock
-- Take the purge lock of this schema for the current transaction if free (the scheduled retention of a worker or of the operator: a round that finds it taken ends, someone else purges).
SELECT count(*) > 0 AS locked FROM (SELECT FROM {schema}.locks WHERE name = 'purge' FOR UPDATE SKIP LOCKED) AS l;

-- name: task_limits_register
-- Register the limits of an app's tasks (a worker at start; the latest registration wins): upsert or remove each task's limits and bring its slot rows to the new counts (slots above a lowered limit go at once, held or not: their runs go on without one); returns what each task had before.
WITH given AS (
    SELECT * FROM unnest(%(tasks)s::text[], %(concurrency)s::integer[], %(rate)s::integer[], %(period)s::float8[])
        AS g(task, concurrency, rate, period)
), upserted AS (
    INSERT INTO {schema}.task_limits AS l (task, global_concurrency, rate_limit, rate_period_seconds, registered_by,
                                          updated_at)
    SELECT task, concurrency, rate, period, %(worker)s, now() FROM given
    WHERE concurrency IS NOT NULL OR rate IS NOT NULL
    ORDER BY task
    ON CONFLICT (task) DO UPDATE
    SET global_concurrency = excluded.global_concurrency, rate_limit = excluded.rate_limit,
        rate_period_seconds = excluded.rate_period_seconds, registered_by = excluded.registered_by,
        updated_at = excluded.updated_at
    RETURNING l.task
), removed AS (
    DELETE FROM {schema}.task_limits AS l USING given AS g
    WHERE l.task = g.task AND g.concurrency IS NULL AND g.rate IS NULL
    RETURNING l.task
), added AS (
    INSERT INTO {schema}.task_slots (task, kind, n)
    SELECT g.task, 'concurrency', n FROM given AS g, generate_series(1, g.concurrency) AS n
    UNION ALL
    SELECT g.task, 'rate', n FROM given AS g, generate_series(1, g.rate) AS n
    ORDER BY 1, 2, 3
    ON CONFLICT DO NOTHING
    RETURNING task
), dropped AS (
    DELETE FROM {schema}.task_slots AS s USING given AS g
    WHERE s.task = g.task
      AND ((s.kind = 'concurrency' AND s.n > coalesce(g.concurrency, 0))
           OR (s.kind = 'rate' AND s.n > coalesce(g.rate, 0)))
    RETURNING s.task
)
SELECT g.task, g.concurrency, g.rate, g.period, l.task IS NOT NULL AS was_present,
       l.global_concurrency AS was_concurrency, l.rate_limit AS was_rate, l.rate_period_seconds AS was_period,
       l.registered_by AS was_registered_by,
       (SELECT count(*) FROM upserted) + (SELECT count(*) FROM removed) + (SELECT count(*) FROM added)
           + (SELECT count(*) FROM dropped) AS writes
FROM given AS g LEFT JOIN {schema}.task_limits AS l USING (task)
ORDER BY g.task;

-- name: task_limits_list
-- Every registered task limit (by task name after the keyset cursor `after`, at most `limit` of them; NULL: all) with its slots in use now: running (concurrency slots held) and recent starts (rate slots resting).
SELECT l.task, l.global_concurrency, l.rate_limit, l.rate_period_seconds, l.registered_by, l.updated_at,
       count(*) FILTER (WHERE s.kind = 'concurrency' AND s.job_id IS NOT NULL) AS running,
       count(*) FILTER (WHERE s.kind = 'rate' AND s.free_at > coalesce(%(now)s::timestamptz, now())) AS recent_starts
FROM {schema}.task_limits AS l
LEFT JOIN {schema}.task_slots AS s ON s.task = l.task
WHERE l.task > %(after)s
GROUP BY l.task
ORDER BY l.task
LIMIT %(limit)s;

-- name: task_limits_next_start
-- Seconds until the next start a rate limit allows, over the given tasks that have due pending jobs in the given queues (NULL when none waits: the claimer then waits as usual). A slot that came free within the last second counts (zero or less: claim again now; it may have come free between the claim and this query); a task with a slot free for longer is held back by something else (a concurrency limit, a serial key), so it gives no hint and is not spun on.
-- Per task, one probe of the rate index for its earliest slot (the whole answer: every other slot comes free later).
-- Joined slot against slot and against the jobs instead, the statement read every slot of a task once for each of
-- its busy ones, after every claim that came back short (ADR 0007 gives the figures).
SELECT extract(epoch FROM min(e.free_at) - coalesce(%(now)s::timestamptz, now()))::float8 AS due_in_seconds
FROM unnest(%(tasks)s::text[]) AS t(task)
CROSS JOIN LATERAL (
    SELECT s.free_at FROM {schema}.task_slots AS s
    WHERE s.task = t.task AND s.kind = 'rate'
    ORDER BY s.free_at
    LIMIT 1
) AS e
CROSS JOIN LATERAL (
    -- a due job of the task waits: per queue, the claim index in claim order up to the first (no scan of the table,
    -- whose done rows may be millions, whatever statistics the planner has)
    SELECT 1 FROM unnest(%(queues)s::text[]) AS q(queue)
    CROSS JOIN LATERAL (
        SELECT 1 FROM {schema}.jobs AS j
        WHERE j.queue = q.queue AND j.status = 'pending' AND j.task = t.task
          AND j.visible_at <= coalesce(%(now)s::timestamptz, now())
        ORDER BY j.priority DESC, j.visible_at, j.id
        LIMIT 1
    ) AS j
    LIMIT 1
) AS d
WHERE e.free_at > coalesce(%(now)s::timestamptz, now()) - interval '1 second';
