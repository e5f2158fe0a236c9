-- name: 0013_jobs_autovacuum
-- Vacuum the jobs table at full speed (no cost delay): each job leaves three dead row versions (claimed, finished, purged), and a throttled vacuum's run grows with the table and its indexes.

-- How often autovacuum visits the table (autovacuum_naptime) is server-wide and no table can change it:
-- `skiplock doctor` says when to lower it. This setting keeps each visit short, so that after a backlog or with a
-- long retention a run over the table and its indexes still ends before the next visit is due
-- (docs/performance.md, "Soak").
-- Storage parameters only: ALTER TABLE ... SET takes a SHARE UPDATE EXCLUSIVE lock, which claims and enqueues
-- (ROW EXCLUSIVE) do not wait for; running it again sets the same value.
ALTER TABLE {schema}.jobs SET (autovacuum_vacuum_cost_delay = 0);
