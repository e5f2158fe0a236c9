-- name: drain_requested
-- Whether the operator asked the workers of one pod (the first part of their worker id) to stop claiming.
SELECT EXISTS (SELECT 1 FROM {schema}.drains WHERE worker = %(worker)s);

-- name: drain_request
-- Ask the workers of the given pods to stop claiming (rows already there keep their time), and tell every worker on the control channel, so they look now.
WITH added AS (
    INSERT INTO {schema}.drains (worker, reason, requested_at)
    SELECT w, %(reason)s, coalesce(%(now)s::timestamptz, now()) FROM unnest(%(workers)s::text[]) AS w
    ON CONFLICT (worker) DO NOTHING
    RETURNING worker)
SELECT (SELECT count(*) FROM added) AS added, pg_notify((SELECT name FROM {schema}.control_channel), 'pause');

-- name: drain_cancel
-- Withdraw the drain requests of the given pods (they claim again) and tell the workers on the control channel.
WITH gone AS (
    DELETE FROM {schema}.drains WHERE worker = ANY(%(workers)s::text[]) RETURNING worker)
SELECT (SELECT count(*) FROM gone) AS removed, pg_notify((SELECT name FROM {schema}.control_channel), 'pause');

-- name: drain_list
-- Every pod asked to drain, with when.
SELECT worker, reason, requested_at FROM {schema}.drains ORDER BY worker;

-- name: drain_holdings
-- What the workers of each pod hold in the given queues: jobs processing under a worker id starting with the pod's name, and the seconds since the oldest was claimed.
SELECT split_part(locked_by, ':', 1) AS worker,
       count(*) AS jobs,
       extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - min(locked_at))::float8 AS oldest_seconds
FROM {schema}.jobs
WHERE status = 'processing' AND queue = ANY(%(queues)s::text[])
GROUP BY 1
ORDER BY 1;
