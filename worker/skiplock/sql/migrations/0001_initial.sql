-- name: 0001_initial
-- The jobs table of the seed, plus priority and idempotency keys, partial indexes for every hot path.
CREATE TABLE {schema}.jobs (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue           text        NOT NULL DEFAULT 'default',
    payload         jsonb       NOT NULL,
    status          text        NOT NULL DEFAULT 'pending',
    priority        smallint    NOT NULL DEFAULT 0,
    attempts        integer     NOT NULL DEFAULT 0,
    max_attempts    integer     NOT NULL DEFAULT 5,
    visible_at      timestamptz NOT NULL DEFAULT now(),
    locked_by       text,
    locked_at       timestamptz,
    last_error      text,
    idempotency_key text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT jobs_status_check CHECK (status IN ('pending', 'processing', 'done', 'failed')),
    CONSTRAINT jobs_attempts_check CHECK (attempts >= 0 AND max_attempts >= 1),
    CONSTRAINT jobs_queue_check CHECK (length(queue) BETWEEN 1 AND 128),
    CONSTRAINT jobs_lease_check CHECK (status <> 'processing' OR (locked_by IS NOT NULL AND locked_at IS NOT NULL))
) WITH (
    -- A queue table is updated constantly: vacuum it early (the seed's advice) and leave room for HOT updates.
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    fillfactor = 85
);

-- Claim: only pending rows, in claim order (priority, then visible_at, then id).
CREATE INDEX jobs_claim_idx ON {schema}.jobs (queue, priority DESC, visible_at, id) WHERE status = 'pending';

-- Lease recovery and stalled-job checks: only processing rows.
CREATE INDEX jobs_recover_idx ON {schema}.jobs (queue, locked_at) WHERE status = 'processing';

-- Failed jobs (listing, retry, stats).
CREATE INDEX jobs_failed_idx ON {schema}.jobs (queue, updated_at) WHERE status = 'failed';

-- Retention: purge finished rows in batches.
CREATE INDEX jobs_retention_idx ON {schema}.jobs (updated_at) WHERE status IN ('done', 'failed');

-- One live job per (queue, idempotency key); a failed job frees its key (the seed's rule).
CREATE UNIQUE INDEX jobs_idempotency_idx ON {schema}.jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND status <> 'failed';
