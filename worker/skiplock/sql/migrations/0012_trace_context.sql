-- name: 0012_trace_context
-- The W3C trace context of the span that enqueued a job (traceparent, tracestate), so its execution continues that trace: NULL unless the producer traced the enqueue.

-- A nullable column without a default: adding it rewrites nothing and costs untraced jobs nothing (a NULL is a bit
-- in the row's null bitmap). Written only by the traced enqueue statements (sql/queries/traced.sql), read by the
-- claim (docs/tracing.md).
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS trace_context jsonb;
