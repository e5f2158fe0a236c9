-- name: 0010_drain
-- Drain requests: before the operator lowers a worker Deployment's replicas, it asks the pods it means to remove to stop claiming (one row per pod), and removes them once they hold nothing.

-- `worker` is the first part of a worker's identity (`worker_id`, which the operator sets to the pod name): every
-- worker process of that pod, a restarted container too, sees the request. A worker looks at its row when it
-- rechecks its paused queues (on a control-channel notification, else every few polls), never per claim.
CREATE TABLE IF NOT EXISTS {schema}.drains (
    worker       text PRIMARY KEY CHECK (length(worker) BETWEEN 1 AND 253),
    reason       text NOT NULL DEFAULT '',
    requested_at timestamptz NOT NULL DEFAULT now()
);
