-- name: 0022_jobs_fillfactor
-- The jobs table's fillfactor from 85 to 60 and its primary key's from 90 to 50: each job writes two new row versions after its insert (claimed, finished), and with room left they stay on its heap page instead of going to the table's end, and its primary key entries on their leaf page without a deletion pass or a split.

-- Why (issue 41): a status change is never a HOT update (status is in the partial indexes' predicates), but
-- PostgreSQL still places the new version on the old one's page when it fits, which costs less than a version on
-- another page: one page pinned and locked instead of two, a smaller WAL record (same-page updates log only what
-- changed), and the page's dead versions pruned where the next claim reads. At 85, a page filled by an enqueue had
-- room for few of its jobs' new versions, so most went to the end of the table, every worker's to the same last page.
-- Measured (bench/HISTORY.md, issue 41 round 6): the server's instructions a job of the claim-and-complete loop
-- fall with the fillfactor (154,374 at 100, 152,682 at 85, 151,152 at 70, 150,302 at 60, 149,316 at 50), and a
-- drained table is no larger than at 85. Rows already stored keep their place; only pages filled from now on leave
-- the room.
-- The primary key is the one index of a plain job whose key a new version does not change: every claim and every
-- completion adds an entry for the same id beside the old one. A leaf page filled to 90 % by the enqueues has no
-- room for them, so PostgreSQL runs a bottom-up deletion (visiting heap pages to find the dead versions) or splits
-- the page; at 50 % a page takes its jobs' new entries (deduplicated) until VACUUM removes the dead ones, and after a
-- drain the index is no larger than at 90 % (pages split by the churn were half empty). Measured: 149,733 ->
-- 142,763 instructions a job at 50 (60: 150,592, 45: 142,844, 35: 143,196).
-- Storage parameters only (no rewrite): ALTER TABLE ... SET takes a SHARE UPDATE EXCLUSIVE lock, which claims and
-- enqueues (ROW EXCLUSIVE) do not wait for, but a VACUUM or ANALYZE of the table holds it: the wait is bounded as in
-- 0007 (past 5 s the migration fails, nothing changed, and running it again later applies it). Running it again sets
-- the same value.
SET LOCAL lock_timeout = '5s';
ALTER TABLE {schema}.jobs SET (fillfactor = 60);
ALTER INDEX {schema}.jobs_pkey SET (fillfactor = 50);
