-- name: 0017_reserved
-- A no-op so the numbering has no gap on the branch that brought 0018: 0017 is another branch's migration, which replaces this file when both land (the integrator renumbers).
SELECT 1;
