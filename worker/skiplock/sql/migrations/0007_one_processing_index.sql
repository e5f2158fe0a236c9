-- name: 0007_one_processing_index
-- Drop jobs_recover_idx: jobs_lease_deadline_idx already covers the processing rows, and every claim paid for the second index twice (an entry, then a dead one).

-- Every claimed job added an entry to both processing partial indexes (jobs_recover_idx on (queue, locked_at),
-- jobs_lease_deadline_idx on lease_expires_at), and each entry is dead once the job ends. Lease recovery, the
-- stalled list and queue stats read the processing rows through jobs_lease_deadline_idx alone (there are only as
-- many as jobs run), serial keys through jobs_serial_running_idx. Dropping it saves about 7 % of the WAL a job
-- writes.
-- DROP INDEX takes an exclusive lock on the table. Waiting for it behind a long transaction that enqueued jobs
-- would hold up every claim and enqueue queued behind the wait, so the wait is bounded: past 5 s the migration
-- fails (nothing changed), and running it again later applies it.
SET LOCAL lock_timeout = '5s';
DROP INDEX IF EXISTS {schema}.jobs_recover_idx;
