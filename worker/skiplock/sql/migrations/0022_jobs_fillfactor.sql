-- name: 0022_jobs_fillfactor
-- The jobs table's fillfactor from 85 to 60: each job writes two new row versions after its insert (claimed, finished), and with room left on its page they stay there instead of going to the table's end.

-- Why (issue 41): a status change is never a HOT update (status is in the partial indexes' predicates), but
-- PostgreSQL still places the new version on the old one's page when it fits, which costs less than a version on
-- another page: one page pinned and locked instead of two, a smaller WAL record (same-page updates log only what
-- changed), and the page's dead versions pruned where the next claim reads. At 85, a page filled by an enqueue had
-- room for few of its jobs' new versions, so most went to the end of the table, every worker's to the same last page.
-- Measured (docs/performance.md, bench/HISTORY.md): the server's instructions a job of the claim-and-complete loop
-- fall with the fillfactor (154,374 at 100, 152,682 at 85, 151,152 at 70, 150,302 at 60, 149,316 at 50), and a
-- drained table is no larger than at 85. Rows already stored keep their place; only pages filled from now on leave
-- the room.
-- Storage parameters only (no rewrite): ALTER TABLE ... SET takes a SHARE UPDATE EXCLUSIVE lock, which claims and
-- enqueues (ROW EXCLUSIVE) do not wait for, but a VACUUM or ANALYZE of the table holds it: the wait is bounded as in
-- 0007 (past 5 s the migration fails, nothing changed, and running it again later applies it). Running it again sets
-- the same value.
SET LOCAL lock_timeout = '5s';
ALTER TABLE {schema}.jobs SET (fillfactor = 60);
