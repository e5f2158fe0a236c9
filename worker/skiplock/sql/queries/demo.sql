-- name: demo_reset
-- The demo starts afresh: its schema (skiplock_demo) and everything in it goes.
DROP SCHEMA IF EXISTS {schema} CASCADE;

-- name: demo_receipts_create
-- The demo's own table, which its handler writes through job.conn (one receipt per done job).
CREATE TABLE {schema}.receipts (job_id bigint PRIMARY KEY, order_id int NOT NULL);

-- name: demo_receipt_insert
-- The demo handler's effect (run on job.conn: it commits with the job's completion, exactly once).
INSERT INTO {schema}.receipts (job_id, order_id) VALUES (%(job_id)s, %(order_id)s);

-- name: demo_receipts_count
-- The receipts written and the orders they are for.
SELECT count(*) AS receipts, count(DISTINCT order_id) AS orders FROM {schema}.receipts;

-- name: job_status_counts
-- Jobs by status (every job of the schema: the demo's progress bar).
SELECT status, count(*) AS n FROM {schema}.jobs GROUP BY status;
