-- name: job_lock_parents
-- Lock the parents named by after= (in id order, as job_link will) before anything is inserted (jobs_lock_parents): the ids found.
SELECT id FROM {schema}.jobs_lock_parents(%(parents)s::bigint[]);

-- name: job_link
-- Make the just-inserted jobs `children` wait for `parents` (jobs_link, migration 0016: parents locked in id order and marked as having children, so a parent cannot end unseen meanwhile; a child whose parents are all final already is judged at once). Returns the parents found; when one is missing nothing is changed.
SELECT found, linked, marked
FROM {schema}.jobs_link(%(parents)s::bigint[], %(children)s::bigint[], %(run)s::boolean, %(workflow)s::uuid);

-- name: job_set_workflow
-- Tag the just-inserted jobs without parents (a workflow's first ones) with their workflow id (jobs_tag_workflow).
SELECT {schema}.jobs_tag_workflow(%(ids)s::bigint[], %(workflow)s::uuid);

-- name: job_complete_results
-- Mark claimed jobs done with their handlers' return values, fenced as job_complete (the jobs of a batch that returned something; plain ones ride on the claim).
UPDATE {schema}.jobs AS j
SET status = 'done', result = r.result, locked_at = NULL, lease_expires_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[], %(results)s::jsonb[]) AS r(id, attempts, result)
WHERE j.id = r.id AND j.attempts = r.attempts AND j.status = (SELECT 'processing'::text)
  AND j.locked_by = %(worker)s
RETURNING j.id;

-- name: job_complete_one_result
-- job_complete_one with the handler's return value, in its transaction.
UPDATE {schema}.jobs AS j
SET status = 'done', result = %(result)s::jsonb, locked_at = NULL, lease_expires_at = NULL, updated_at = now()
WHERE j.id = %(id)s AND j.attempts = %(attempts)s AND j.status = (SELECT 'processing'::text)
  AND j.locked_by = %(worker)s
RETURNING j.id;

-- name: job_await
-- Ask for a NOTIFY on the `_done` channel when this job becomes final (jobs_await; nothing when it is final already).
SELECT id FROM {schema}.jobs_await(%(id)s::bigint);

-- name: job_outcome
-- A job's status, result and last error (what a waiter reads: jobs_outcome, which the producer role may call).
SELECT id, status, result, last_error FROM {schema}.jobs_outcome(%(id)s::bigint);

-- name: job_parent_results
-- The results of a job's parents that still exist, by parent id.
SELECT p.id, p.status, p.result FROM {schema}.job_dependencies AS d JOIN {schema}.jobs AS p ON p.id = d.parent
WHERE d.child = %(id)s ORDER BY p.id;

-- name: job_relatives
-- A job's parents and children (as edges: the parent's end status once it ended) and its steps, for skiplock show.
SELECT 'parent' AS kind, d.parent AS id, coalesce(p.status, d.parent_status) AS status, NULL::jsonb AS result
FROM {schema}.job_dependencies AS d LEFT JOIN {schema}.jobs AS p ON p.id = d.parent WHERE d.child = %(id)s
UNION ALL
SELECT 'child', d.child, c.status, NULL FROM {schema}.job_dependencies AS d
JOIN {schema}.jobs AS c ON c.id = d.child WHERE d.parent = %(id)s
UNION ALL
SELECT 'step:' || s.name, NULL, NULL, s.result FROM {schema}.job_steps AS s WHERE s.job_id = %(id)s
ORDER BY 1, 2;

-- name: job_step_get
-- A durable step's stored result (no row: not run yet).
SELECT result FROM {schema}.job_steps WHERE job_id = %(id)s AND name = %(name)s;

-- name: job_step_put
-- Store a durable step's result (its own short transaction) and mark its job as having steps; the first stored value wins, and is returned.
WITH put AS (
    INSERT INTO {schema}.job_steps (job_id, name, result) VALUES (%(id)s, %(name)s, %(result)s::jsonb)
    ON CONFLICT (job_id, name) DO NOTHING
    RETURNING result
), marked AS (
    UPDATE {schema}.jobs SET has_steps = true WHERE id = %(id)s AND has_steps IS NOT TRUE RETURNING id
)
SELECT result FROM put
UNION ALL
SELECT result FROM {schema}.job_steps WHERE job_id = %(id)s AND name = %(name)s AND NOT EXISTS (SELECT 1 FROM put);

-- name: job_workflow_ids
-- The jobs of a workflow that have not ended, in id order (what skiplock cancel --workflow cancels).
SELECT id FROM {schema}.jobs
WHERE workflow_id = %(workflow)s::uuid AND status IN ('waiting', 'pending', 'processing') ORDER BY id;
