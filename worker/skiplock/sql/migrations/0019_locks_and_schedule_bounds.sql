-- name: 0019_locks_and_schedule_bounds
-- A purge lock only the schema's owner can take (a row of a new locks table, not an advisory key any role could take); bounds on every column of schedules, and a parked state for a schedule that cannot be fired.

-- Why (issue 37, item 8): the purge serialized on pg_advisory_xact_lock of a public hash of the schema name, which
-- any role of the database could take and hold, stopping every purge of this schema. A row lock needs the UPDATE
-- privilege on its table, which only the owner has (skiplock grant gives no other role any right on it); migrations
-- lock schema_migrations itself for the same reason (skiplock.migrate).
-- (Every statement here may run twice: a schema whose recorded versions were rolled back by hand migrates again.)
CREATE TABLE IF NOT EXISTS {schema}.locks (
    name text PRIMARY KEY CHECK (name IN ('purge'))
);
INSERT INTO {schema}.locks (name) VALUES ('purge') ON CONFLICT DO NOTHING;
REVOKE ALL ON {schema}.locks FROM PUBLIC;

-- Why the schedule bounds (issue 37, item 3): a worker role writes schedule rows, and every firer (the workers, and
-- the operator shared by the tenants) reads them. A row with every_seconds 'NaN' (NaN > 0 holds), 1e300 or a next_run_at
-- of 'infinity' made the firing round fail as a whole, every round: one bad row stopped every schedule of the
-- schema. Each value is now bounded as the client bounds it (skiplock.schedule.timing_problem): every_seconds and
-- period_seconds finite, 0.001 s to 10 years; times between 1970 and 3000 (as jobs.visible_at, 0015); texts short;
-- max_attempts what a job takes. A row that passes the checks and still cannot be fired (an unknown time zone, a cron
-- that never fires, a job the jobs table refuses) is parked: `parked` holds why, it is not fired any more, and it is
-- unparked when its app registers it again (skiplock.store.schedules).
ALTER TABLE {schema}.schedules ADD COLUMN IF NOT EXISTS parked text;

-- Rows outside the bounds are dropped, not repaired: a schedule is its app's declaration, registered again by its
-- workers within the hour (and by `skiplock schedules sync`), which brings it back from the code.
DELETE FROM {schema}.schedules
WHERE (length(name) BETWEEN 1 AND 200
       AND length(app) BETWEEN 1 AND 200
       AND (cron IS NULL OR length(cron) BETWEEN 1 AND 200)
       AND (every_seconds IS NULL OR every_seconds BETWEEN 0.001 AND 315360000)
       AND period_seconds BETWEEN 0.001 AND 315360000
       AND length(timezone) BETWEEN 1 AND 64
       AND max_attempts BETWEEN 1 AND 1000
       AND next_run_at >= TIMESTAMPTZ '1970-01-01 00:00:00+00' AND next_run_at < TIMESTAMPTZ '3000-01-01 00:00:00+00'
       AND seen_at >= TIMESTAMPTZ '1970-01-01 00:00:00+00' AND seen_at < TIMESTAMPTZ '3000-01-01 00:00:00+00'
       AND (last_run_at IS NULL OR (last_run_at >= TIMESTAMPTZ '1970-01-01 00:00:00+00'
                                    AND last_run_at < TIMESTAMPTZ '3000-01-01 00:00:00+00'))) IS NOT TRUE;

ALTER TABLE {schema}.schedules
    DROP CONSTRAINT IF EXISTS schedules_name_bound_check,
    DROP CONSTRAINT IF EXISTS schedules_app_check,
    DROP CONSTRAINT IF EXISTS schedules_cron_check,
    DROP CONSTRAINT IF EXISTS schedules_every_bound_check,
    DROP CONSTRAINT IF EXISTS schedules_period_bound_check,
    DROP CONSTRAINT IF EXISTS schedules_timezone_check,
    DROP CONSTRAINT IF EXISTS schedules_max_attempts_check,
    DROP CONSTRAINT IF EXISTS schedules_times_check,
    DROP CONSTRAINT IF EXISTS schedules_parked_check,
    ADD CONSTRAINT schedules_name_bound_check CHECK (length(name) BETWEEN 1 AND 200),
    ADD CONSTRAINT schedules_app_check CHECK (length(app) BETWEEN 1 AND 200),
    ADD CONSTRAINT schedules_cron_check CHECK (cron IS NULL OR length(cron) BETWEEN 1 AND 200),
    ADD CONSTRAINT schedules_every_bound_check CHECK (every_seconds IS NULL OR every_seconds BETWEEN 0.001 AND 315360000),
    ADD CONSTRAINT schedules_period_bound_check CHECK (period_seconds BETWEEN 0.001 AND 315360000),
    ADD CONSTRAINT schedules_timezone_check CHECK (length(timezone) BETWEEN 1 AND 64),
    ADD CONSTRAINT schedules_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 1000),
    ADD CONSTRAINT schedules_times_check CHECK (
        next_run_at >= TIMESTAMPTZ '1970-01-01 00:00:00+00' AND next_run_at < TIMESTAMPTZ '3000-01-01 00:00:00+00'
        AND seen_at >= TIMESTAMPTZ '1970-01-01 00:00:00+00' AND seen_at < TIMESTAMPTZ '3000-01-01 00:00:00+00'
        AND (last_run_at IS NULL OR (last_run_at >= TIMESTAMPTZ '1970-01-01 00:00:00+00'
                                     AND last_run_at < TIMESTAMPTZ '3000-01-01 00:00:00+00'))),
    ADD CONSTRAINT schedules_parked_check CHECK (parked IS NULL OR length(parked) BETWEEN 1 AND 1000);
