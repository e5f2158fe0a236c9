-- name: 0008_rate_slot_index
-- Replace task_slots_free_idx (task, kind, free_at) with a partial index of the rate slots: a concurrency slot found by its primary key could be read through the old index instead, every slot of its task (1,000 rows for a global concurrency of 1,000) for each run started or ended.

-- Every concurrency slot has free_at '-infinity', so on (task, kind, free_at) a look-up of one concurrency slot by
-- (task, kind, n) matched as many leading columns as on the primary key. Without statistics on task_slots (a new
-- limit, before autovacuum's first ANALYZE), the planner took either, and the claim and the trigger that frees a
-- slot at the end of each run walked all the task's slots. Only rate slots are ever picked by free_at.
-- Dropping the index takes an exclusive lock on task_slots, which every claim of a limited task locks rows of: the
-- wait is bounded as in 0007 (past 5 s the migration fails, changing nothing; running it again applies it).
SET LOCAL lock_timeout = '5s';
DROP INDEX IF EXISTS {schema}.task_slots_free_idx;
CREATE INDEX IF NOT EXISTS task_slots_rate_free_idx ON {schema}.task_slots (task, free_at) WHERE kind = 'rate';
