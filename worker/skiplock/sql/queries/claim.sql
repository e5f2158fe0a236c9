-- The claim: the worker's hot path (complete the jobs a claim carries, then lease the next ones, in one statement and
-- one commit). One statement, in variants that differ only in how they pick (`one`: a worker of one queue, a plain
-- index scan instead of the per-queue round-robin; `after`: from a position in claim order, the claimer's claim while
-- a backlog drains) and in whether they take flow-limit slots (`unlimited`: a worker none of whose tasks has a limit
-- leaves limited tasks to others and takes no slots). The parts that vary are marked /*[flag*/ ... /*flag]*/ (kept
-- with the flag) and /*[!flag*/ ... /*!flag]*/ (kept without it): skiplock/sql/template.py. Why each part is written
-- the way it is: docs/adr/0007-one-data-access-layer.md.

-- name: job_complete_and_claim
-- Mark claimed jobs done, fenced (rows still processing under this worker and attempt), and lease up to `limit` visible pending jobs of the given queues that are not paused: at most its share (`per_queue[i]`) of each, taken round-robin from the queue after `rotate` on (the claimer moves it every claim), so a busy queue never starves a quiet one; one statement, one commit (claim alone: no ids).
-- variant: job_complete_and_claim_one (one)
-- variant: job_complete_and_claim_unlimited (unlimited)
-- variant: job_complete_and_claim_unlimited_one (unlimited one)
-- variant: job_complete_and_claim_one_after (one after)
-- variant: job_complete_and_claim_unlimited_one_after (unlimited one after)
WITH finishing AS (
    -- the runs this statement completes (their serial key and concurrency slot pass to the next job)
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS f(id, attempts)
), done AS (
    UPDATE {schema}.jobs AS j
    SET status = 'done', locked_at = NULL, lease_expires_at = NULL,
        updated_at = (SELECT coalesce(%(now)s::timestamptz, now()))
    -- each row found by primary key, its attempt looked up in a hash of the runs (IS TRUE keeps the IN a hashed
    -- subplan; array_position walked the ids for every row), hashed from the arrays as a target list of unnests
    -- (read through the finishing CTE or FROM unnest(...), every run was first copied into a store)
    WHERE j.id = ANY((SELECT %(ids)s::bigint[])::bigint[])
      AND ((j.id, j.attempts) IN (SELECT unnest(%(ids)s::bigint[]), unnest(%(attempts)s::integer[]))) IS TRUE
      AND j.status = (SELECT 'processing'::text) AND j.locked_by = %(worker)s
    RETURNING j.id
), done_ids AS (
    -- the ids completed, as one array in a one-row store: read by the claim (which therefore runs after the
    -- completions) and by the last row of the result (counting the done rows and gathering them again read each twice)
    SELECT array(SELECT id FROM done) AS ids
), limit_full AS (
/*[!unlimited*/
    SELECT l.task FROM {schema}.task_limits AS l
    LEFT JOIN LATERAL (
        SELECT true AS free FROM {schema}.task_slots AS s
        WHERE s.task = l.task AND s.kind = 'concurrency'
          AND (s.job_id IS NULL OR (s.worker = %(worker)s AND (s.job_id, s.attempts) IN (SELECT * FROM finishing)))
        LIMIT 1
    ) AS c ON true
    LEFT JOIN LATERAL (
        SELECT true AS free FROM {schema}.task_slots AS s
        WHERE s.task = l.task AND s.kind = 'rate' AND s.free_at <= coalesce(%(now)s::timestamptz, now())
        LIMIT 1
    ) AS r ON true
    WHERE (l.global_concurrency IS NOT NULL AND c.free IS NULL) OR (l.rate_limit IS NOT NULL AND r.free IS NULL)
/*!unlimited]*/
/*[unlimited*/
    SELECT task FROM {schema}.task_limits
/*unlimited]*/
/*[!one*/
), candidates AS (
    SELECT c.id, q.n, row_number() OVER (PARTITION BY q.n ORDER BY c.priority DESC, c.visible_at, c.id) AS turn,
           c.task, c.priority, c.visible_at, c.attempts  -- flow limits
    FROM unnest(%(queues)s::text[], %(per_queue)s::integer[]) WITH ORDINALITY AS q(queue, share, n)
    CROSS JOIN LATERAL (
/*!one]*/
/*[one*/
), picked AS (
/*one]*/
        -- (a drain of one queue without limits reads only the ids of `picked`: every other column it stored was copied
        -- into the CTE's store and out again for nothing)
        SELECT id
/*[!unlimited*/
             , task, priority, visible_at, attempts
/*!unlimited]*/
/*[unlimited*//*[!one*/
             , task, priority, visible_at, attempts
/*!one]*//*unlimited]*/
        FROM {schema}.jobs
        WHERE queue = /*[!one*/q.queue/*!one]*//*[one*/(%(queues)s::text[])[1]/*one]*/ AND status = 'pending'
/*[after*/
          AND priority = %(after_priority)s::smallint
          AND (visible_at, id) > (%(after_at)s::timestamptz, %(after_id)s::bigint)
/*after]*/
          AND visible_at <= coalesce(%(now)s::timestamptz, now())
/*[one*/
          AND NOT EXISTS (SELECT 1 FROM {schema}.queues AS p WHERE p.queue = (%(queues)s::text[])[1] AND p.paused)
/*one]*/
          -- the head of its key: the lowest live id (a done job of this statement and a skip-ahead job waiting for its
          -- retry do not count), while no job of the key runs
          AND (jobs.serial_key IS NULL OR (
              NOT EXISTS (SELECT 1 FROM {schema}.jobs AS k
                          WHERE k.serial_key = jobs.serial_key AND k.status = 'processing'
                            AND NOT (k.locked_by = %(worker)s AND (k.id, k.attempts) IN (SELECT * FROM finishing)))
              AND NOT EXISTS (SELECT 1 FROM {schema}.jobs AS k
                              WHERE k.serial_key = jobs.serial_key AND k.id < jobs.id AND k.status IN ('pending', 'processing')
                                AND NOT (k.status = 'processing' AND k.locked_by = %(worker)s
                                         AND (k.id, k.attempts) IN (SELECT * FROM finishing))
                                AND NOT (k.serial_skip_on_retry AND k.status = 'pending' AND k.attempts > 0
                                         AND k.visible_at > coalesce(%(now)s::timestamptz, now())))))
          -- no job of a task in limit_full (no free slot in this snapshot; for a worker without limits: any limited task)
          AND (jobs.task IS NULL OR jobs.task NOT IN (SELECT task FROM limit_full))
        ORDER BY priority DESC, visible_at, id
        LIMIT /*[!one*/q.share/*!one]*//*[one*/%(limit)s/*one]*/
        FOR UPDATE SKIP LOCKED
/*[!one*/
    ) AS c
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.queues AS p WHERE p.queue = q.queue AND p.paused)
), picked AS (
    SELECT id, task, priority, visible_at, attempts FROM candidates
    ORDER BY turn, (n + cardinality(%(queues)s::text[]) - 1 - %(rotate)s) %% cardinality(%(queues)s::text[])
    LIMIT %(limit)s
/*!one]*/
/*[!unlimited*/
), limited AS (
    -- every picked job with its task's limits (none: is_limited false) and its place k among the picked jobs of
    -- its task in claim order; a limited one takes the k-th slot of each kind it needs
    SELECT p.id, p.attempts, p.task, l.task IS NOT NULL AS is_limited, l.global_concurrency, l.rate_limit,
           l.rate_period_seconds AS period,
           row_number() OVER (PARTITION BY p.task ORDER BY p.priority DESC, p.visible_at, p.id)::integer AS k
    FROM picked AS p LEFT JOIN {schema}.task_limits AS l ON l.task = p.task
), wanted AS (
    SELECT task, count(*) AS n FROM limited WHERE is_limited GROUP BY task
), cslot AS (
    -- per limited task, one row: the free slots of each kind it gets (locked FOR UPDATE SKIP LOCKED and rechecked
    -- by the slot's own columns), as an array in the order they are handed out. A job finds its slot by its place
    -- k, with no join of job rows against slot rows (the planner, which expects one row from a CTE, nested those)
    SELECT w.task, array_agg(s.n ORDER BY s.n) AS ns
    FROM wanted AS w CROSS JOIN LATERAL (
        SELECT s.n FROM {schema}.task_slots AS s
        WHERE s.task = w.task AND s.kind = 'concurrency'
          AND (s.job_id IS NULL OR (s.worker = %(worker)s AND (s.job_id, s.attempts) IN (SELECT * FROM finishing)))
        ORDER BY s.n LIMIT w.n
        FOR UPDATE SKIP LOCKED
    ) AS s
    GROUP BY w.task
), rslot AS (
    SELECT w.task, array_agg(s.n ORDER BY s.free_at, s.n) AS ns
    FROM wanted AS w CROSS JOIN LATERAL (
        SELECT s.n, s.free_at FROM {schema}.task_slots AS s
        WHERE s.task = w.task AND s.kind = 'rate' AND s.free_at <= coalesce(%(now)s::timestamptz, now())
        ORDER BY s.free_at LIMIT w.n
        FOR UPDATE SKIP LOCKED
    ) AS s
    GROUP BY w.task
), go AS (
    -- a job of a limited task without its slots stays pending
    SELECT l.id, l.attempts, l.task, c.ns[l.k] AS cslot, r.ns[l.k] AS rslot, l.period
    FROM limited AS l
    LEFT JOIN cslot AS c ON c.task = l.task
    LEFT JOIN rslot AS r ON r.task = l.task
    WHERE NOT l.is_limited
       OR ((l.global_concurrency IS NULL OR c.ns[l.k] IS NOT NULL) AND (l.rate_limit IS NULL OR r.ns[l.k] IS NOT NULL))
/*!unlimited]*/
), claimed AS (
    UPDATE {schema}.jobs AS j
    SET status = 'processing', attempts = j.attempts + 1, locked_by = %(worker)s,
        -- the time and, when no task has a lease of its own, the lease deadline: init plans, computed once
        locked_at = (SELECT coalesce(%(now)s::timestamptz, now())),
        updated_at = (SELECT coalesce(%(now)s::timestamptz, now())),
        lease_expires_at = CASE WHEN %(leases)s::jsonb IS NULL
            THEN (SELECT coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_seconds)s))
            ELSE coalesce(%(now)s::timestamptz, now())
                + make_interval(secs => coalesce((%(leases)s::jsonb ->> j.task)::float8, %(lease_seconds)s)) END,
        slot = /*[!unlimited*/go.cslot/*!unlimited]*//*[unlimited*/NULL/*unlimited]*/
/*[!unlimited*/
    FROM go
    -- completions first (a serial key passes on): an init plan, run once before the first row (joined as a
    -- subquery, the planner re-read the completed rows once for every claimed one). The ids again as an array
    -- (an init plan): a generic plan, which cannot know the LIMIT, expected a tenth of the table in `go` and
    -- hash-joined it with a scan of the whole table; with the array the rows are found by primary key.
    WHERE j.id = go.id AND j.id = ANY(ARRAY(SELECT id FROM go)) AND (SELECT ids FROM done_ids) IS NOT NULL
/*!unlimited]*/
/*[unlimited*/
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) AND (SELECT ids FROM done_ids) IS NOT NULL
/*unlimited]*/
    -- the row as the worker reads it, `completed` (NULL here) first: selected as it is below, with no projection
    RETURNING NULL::bigint[] AS completed, j.id, j.queue, j.task, j.payload::text AS payload, j.attempts,
                  j.max_attempts, j.priority,
                  least(greatest(j.created_at, TIMESTAMPTZ '1970-01-01 00:00:00+00'), TIMESTAMPTZ '3000-01-01 00:00:00+00')
                      AS created_at,  -- within jobs_created_at_check / jobs_visible_at_check: a row stored outside
                  greatest(j.visible_at, TIMESTAMPTZ '1970-01-01 00:00:00+00') AS visible_at,  -- them still loads
                  j.idempotency_key, j.timeout_seconds, j.serial_key, j.trace_context
/*[!unlimited*/
), taken AS MATERIALIZED (
    -- flow limits: the slots taken by the runs just claimed (written by primary key below). Every job of `go` is
    -- claimed (its row is locked), with its attempts plus one.
    SELECT id, attempts + 1 AS attempts, task, cslot, rslot, period FROM go
    WHERE cslot IS NOT NULL OR rslot IS NOT NULL
), took_cslot AS (
    UPDATE {schema}.task_slots AS s SET job_id = t.id, attempts = t.attempts, worker = %(worker)s
    FROM taken AS t
    WHERE s.task = t.task AND s.kind = 'concurrency' AND s.n = t.cslot
), took_rslot AS (
    UPDATE {schema}.task_slots AS s
    SET free_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => t.period)
    FROM taken AS t
    -- by primary key: the kind is an init plan, not a constant, so the rate index (task, free_at), whose predicate
    -- needs the constant, cannot serve it (read through that index, each slot walked hundreds of others: ADR 0007)
    WHERE s.task = t.task AND s.kind = (SELECT 'rate'::text) AND s.n = t.rslot
/*!unlimited]*/
)
SELECT * FROM claimed
UNION ALL
SELECT (SELECT ids FROM done_ids), NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
