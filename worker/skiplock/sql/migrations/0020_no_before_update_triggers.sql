-- name: 0020_no_before_update_triggers
-- No BEFORE UPDATE row trigger on jobs: with one, PostgreSQL locked every row an UPDATE changed before looking at the trigger's columns, so each completion took a row lock and wrote a lock record per job for triggers that never fire on it.

-- Why (issue 41): for an UPDATE of a table with any BEFORE UPDATE row trigger, PostgreSQL fetches and locks the old
-- row (a lock record in the WAL for a row the statement had not locked already) before it checks the trigger's
-- UPDATE OF columns and its WHEN. The claim's rows are locked by its FOR UPDATE already; the completion's are not, so
-- every completed job paid a second row lock and about 56 bytes of WAL for jobs_payload_bound (UPDATE OF payload) and
-- jobs_failure_fingerprint (UPDATE OF last_error), which never fire on it. AFTER row triggers take no lock: the two
-- move there, and what they guarantee stays. (Every statement here may run twice.)

-- The payload bound: checked before an INSERT as before; after an UPDATE OF payload the same function raises the same
-- error (an AFTER trigger's error fails the statement just the same; its return value is ignored).
DROP TRIGGER IF EXISTS jobs_payload_bound ON {schema}.jobs;
CREATE TRIGGER jobs_payload_bound BEFORE INSERT ON {schema}.jobs
    FOR EACH ROW WHEN (pg_column_compression(NEW.payload) IS NOT NULL)
    EXECUTE FUNCTION {schema}.jobs_payload_bound();
DROP TRIGGER IF EXISTS jobs_payload_bound_update ON {schema}.jobs;
CREATE TRIGGER jobs_payload_bound_update AFTER UPDATE OF payload ON {schema}.jobs
    FOR EACH ROW WHEN (pg_column_compression(NEW.payload) IS NOT NULL)
    EXECUTE FUNCTION {schema}.jobs_payload_bound();

-- The failure fingerprint: the worker's failure statement (job_fail) stores it with the failure, in the same row
-- version. For any other statement that sets a failed row's last_error and not its fingerprint (the lease recovery,
-- the unique-key repair, an UPDATE by hand), this AFTER trigger stores it by a second update of that row, as the
-- schema's owner (the writer need not be allowed to update the column).
DROP TRIGGER IF EXISTS jobs_failure_fingerprint ON {schema}.jobs;
CREATE OR REPLACE FUNCTION {schema}.jobs_failure_fingerprint() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    fingerprint text := {schema}.error_fingerprint(NEW.task, NEW.last_error);
BEGIN
    UPDATE {schema}.jobs SET failure_fingerprint = fingerprint
    WHERE id = NEW.id AND status = 'failed' AND failure_fingerprint IS DISTINCT FROM fingerprint;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_failure_fingerprint AFTER UPDATE OF last_error ON {schema}.jobs
    FOR EACH ROW WHEN (NEW.status = 'failed' AND NEW.failure_fingerprint IS NOT DISTINCT FROM OLD.failure_fingerprint)
    EXECUTE FUNCTION {schema}.jobs_failure_fingerprint();
