-- name: 0007_drop_recover_index
-- Drop jobs_recover_idx: every claim paid an insert into it, and nothing needs it since the lease deadline has its own index.

-- (queue, locked_at) of processing jobs served recovery by claim time before migration 0002 stored each lease's
-- deadline; recovery, the stalled list, orphan release and the queue stats now read processing jobs through
-- jobs_lease_deadline_idx (a worker fleet holds few of them at a time). The drop takes the table's lock for a moment.
DROP INDEX IF EXISTS {schema}.jobs_recover_idx;
