-- name: 0017_drop_retention_index
-- Drop jobs_retention_idx: it duplicated the done, failed and cancelled indexes, and every completion paid for it (an index entry, its WAL record, a dead entry after the purge). What read it across queues walks each queue's own index instead, through finished_queues().

-- Every job that finished added an entry to jobs_retention_idx (updated_at, done and failed rows) besides its entry
-- in jobs_done_idx or jobs_failed_idx (queue, updated_at): the one index write of a completion that the design
-- source's table does not make. The purge, the UI's recent workers and `skiplock stats`' done-recently count read
-- finished jobs of every queue in updated_at order; they now take each queue's oldest or newest rows from that
-- status's own index, one queue after the other, the queues found by finished_queues(): a skip scan (one index
-- descent per queue) over the three status indexes, so its cost grows with the number of queues, not of rows.
-- Measured: docs/performance.md.
CREATE OR REPLACE FUNCTION {schema}.finished_queues() RETURNS SETOF text LANGUAGE sql STABLE AS $$
    WITH RECURSIVE q(queue) AS (
        SELECT least((SELECT min(j.queue) FROM {schema}.jobs AS j WHERE j.status = 'done'),
                     (SELECT min(j.queue) FROM {schema}.jobs AS j WHERE j.status = 'failed'),
                     (SELECT min(j.queue) FROM {schema}.jobs AS j WHERE j.status = 'cancelled'))
        UNION ALL
        SELECT least((SELECT min(j.queue) FROM {schema}.jobs AS j WHERE j.status = 'done' AND j.queue > q.queue),
                     (SELECT min(j.queue) FROM {schema}.jobs AS j WHERE j.status = 'failed' AND j.queue > q.queue),
                     (SELECT min(j.queue) FROM {schema}.jobs AS j WHERE j.status = 'cancelled' AND j.queue > q.queue))
        FROM q WHERE q.queue IS NOT NULL
    )
    SELECT queue FROM q WHERE queue IS NOT NULL
$$;

-- DROP INDEX takes an exclusive lock on the table: the wait for it is bounded as in 0007 (past 5 s the migration
-- fails, changing nothing, and running it again applies it).
SET LOCAL lock_timeout = '5s';
DROP INDEX IF EXISTS {schema}.jobs_retention_idx;
