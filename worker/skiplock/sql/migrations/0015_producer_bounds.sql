-- name: 0015_producer_bounds
-- Bounds for every value a producer writes that a worker, the stats or the operator compute with: a finite timeout of at most a year, visible_at and created_at between 1970 and 3000, unique_states a set of statuses that holds the key while pending and processing. Rows stored before are brought inside the bounds first, each saying so in last_error.

-- Why each bound (issue 37): timeout_seconds 'NaN' passed `> 0` (NaN sorts above every number) and killed the worker
-- process that armed a timer with it; past about 1e13 seconds the heartbeat's `updated_at + timeout` overflowed and
-- every lease of that worker expired. A visible_at of 'infinity' made `now() - visible_at` fail in the stats and the
-- operator's backlog query; '-infinity' and dates before year 1 cannot be read by Python, so the claim that returned
-- one failed. Two pending rows with one unique key and unique_states '{{processing}}' both inserted (a pending row was
-- outside the unique index) and the claim that took both failed on it, again and again. The bounds here are the
-- client's too (skiplock.store.validation: TIMEOUT_SECONDS_MAX, VISIBLE_AT_RANGE; skiplock.unique: REQUIRED_STATES).

-- The constraints are added validated, not NOT VALID: a NOT VALID check still refuses the UPDATE that claims an old
-- row outside it, which would stop the queue behind that row. So rows already stored are repaired first, with writes
-- held off (SHARE ROW EXCLUSIVE: reads go on, enqueues and claims wait) for two scans of the table. The wait for the
-- lock is bounded as in 0007: past 5 s the migration fails, changing nothing, and running it again applies it.
SET LOCAL lock_timeout = '5s';
LOCK TABLE {schema}.jobs IN SHARE ROW EXCLUSIVE MODE;

-- A timeout past the bound becomes the bound (a year is as good as no limit); 'NaN' means nothing and becomes NULL
-- (the task's own timeout, else none).
UPDATE {schema}.jobs
SET timeout_seconds = CASE WHEN timeout_seconds = 'NaN' THEN NULL ELSE 31536000 END,
    last_error = format('skiplock migration producer_bounds: timeout_seconds %s was outside 0 < t <= 31536000, now %s',
                        timeout_seconds, coalesce((CASE WHEN timeout_seconds = 'NaN' THEN NULL ELSE 31536000 END)::text,
                                                  'NULL')) || coalesce(E'\n' || last_error, '')
WHERE timeout_seconds > 31536000;  -- 'NaN' and 'Infinity' included; jobs_timeout_check (0004) refused those <= 0

-- A time outside the range becomes its nearest end: a job due since '-infinity' is due now (and first), one due at
-- 'infinity' stays out of reach (year 2999).
UPDATE {schema}.jobs
SET visible_at = least(greatest(visible_at, TIMESTAMPTZ '1970-01-01 00:00:00+00'),
                       TIMESTAMPTZ '2999-12-31 23:59:59+00'),
    created_at = least(greatest(created_at, TIMESTAMPTZ '1970-01-01 00:00:00+00'),
                       TIMESTAMPTZ '2999-12-31 23:59:59+00'),
    last_error = format('skiplock migration producer_bounds: visible_at %s / created_at %s were outside 1970-01-01 .. 3000-01-01',
                        visible_at, created_at) || coalesce(E'\n' || last_error, '')
WHERE NOT (visible_at >= TIMESTAMPTZ '1970-01-01 00:00:00+00' AND visible_at < TIMESTAMPTZ '3000-01-01 00:00:00+00')
   OR NOT (created_at >= TIMESTAMPTZ '1970-01-01 00:00:00+00' AND created_at < TIMESTAMPTZ '3000-01-01 00:00:00+00');

-- unique_states: a live row whose states lack its own status is outside the unique index and enters it when it moves
-- to the status it lacks. Where another row holds its key already (or an earlier such row will), it could never
-- move: it fails, without its key (so it holds none), saying why. Each remaining row gets the states it named, as a
-- set of valid statuses, plus pending and processing; that never moves a row into or out of the index except the
-- one entering row of a key no one holds, so no two rows meet there.
WITH bad AS (
    SELECT id, unique_key, status, unique_states FROM {schema}.jobs
    WHERE unique_key IS NOT NULL
      AND NOT coalesce(array_ndims(unique_states) = 1 AND cardinality(unique_states) <= 5
                       AND unique_states <@ '{{pending,processing,done,failed,cancelled}}'::text[]
                       AND unique_states @> '{{pending,processing}}'::text[], false)
), entering AS (
    SELECT id, unique_key FROM bad
    WHERE status IN ('pending', 'processing') AND NOT coalesce(status = ANY (unique_states), false)
), blocked AS (
    SELECT e.id FROM entering AS e
    WHERE EXISTS (SELECT 1 FROM {schema}.jobs AS k
                  WHERE k.unique_key = e.unique_key AND k.id <> e.id AND coalesce(k.status = ANY (k.unique_states), false))
       OR EXISTS (SELECT 1 FROM entering AS k WHERE k.unique_key = e.unique_key AND k.id < e.id)
)
UPDATE {schema}.jobs AS j
SET status = 'failed', unique_key = NULL, unique_states = NULL, locked_by = NULL, locked_at = NULL,
    lease_expires_at = NULL, updated_at = now(),
    last_error = 'UniqueViolation: skiplock migration producer_bounds: another job holds this job''s unique key, and its '
                 || 'unique_states (' || coalesce(j.unique_states::text, 'NULL') || ') lacked pending or processing: '
                 || 'it could never run' || coalesce(E'\n' || j.last_error, '')
FROM blocked WHERE j.id = blocked.id;

UPDATE {schema}.jobs
SET unique_states = CASE WHEN unique_key IS NULL THEN NULL ELSE ARRAY(
        SELECT s FROM unnest('{{pending,processing,done,failed,cancelled}}'::text[]) WITH ORDINALITY AS a(s, n)
        WHERE s IN ('pending', 'processing') OR s = ANY (unique_states) ORDER BY n) END,
    last_error = format('skiplock migration producer_bounds: unique_states %s were not a set of statuses with pending and '
                        'processing', unique_states) || coalesce(E'\n' || last_error, '')
WHERE unique_states IS NOT NULL
  AND NOT coalesce(array_ndims(unique_states) = 1 AND cardinality(unique_states) <= 5
                   AND unique_states <@ '{{pending,processing,done,failed,cancelled}}'::text[]
                   AND unique_states @> '{{pending,processing}}'::text[], false);

-- One ALTER TABLE: the new checks are verified in one scan. Dropped first if present, so that running this again
-- (a schema_migrations row removed by hand) replaces them rather than fails.
ALTER TABLE {schema}.jobs
    DROP CONSTRAINT IF EXISTS jobs_timeout_bound_check,
    DROP CONSTRAINT IF EXISTS jobs_visible_at_check,
    DROP CONSTRAINT IF EXISTS jobs_created_at_check,
    DROP CONSTRAINT IF EXISTS jobs_unique_states_check,
    ADD CONSTRAINT jobs_timeout_bound_check
        CHECK (timeout_seconds IS NULL OR (timeout_seconds > 0 AND timeout_seconds <= 31536000)),
    ADD CONSTRAINT jobs_visible_at_check
        CHECK (visible_at >= TIMESTAMPTZ '1970-01-01 00:00:00+00' AND visible_at < TIMESTAMPTZ '3000-01-01 00:00:00+00'),
    ADD CONSTRAINT jobs_created_at_check
        CHECK (created_at >= TIMESTAMPTZ '1970-01-01 00:00:00+00' AND created_at < TIMESTAMPTZ '3000-01-01 00:00:00+00'),
    ADD CONSTRAINT jobs_unique_states_check
        CHECK (unique_states IS NULL
               OR (array_ndims(unique_states) = 1 AND cardinality(unique_states) <= 5
                   AND unique_states <@ '{{pending,processing,done,failed,cancelled}}'::text[]
                   AND unique_states @> '{{pending,processing}}'::text[]));
