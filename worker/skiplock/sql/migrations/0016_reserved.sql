-- name: 0016_reserved
-- A no-op so the numbering has no gap on the branch that brought 0017: 0016 is the workflows migration's number, which replaces this file when both land (the integrator renumbers).
SELECT 1;
