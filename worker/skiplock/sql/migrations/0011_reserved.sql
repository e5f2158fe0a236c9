-- name: 0011_reserved
-- A no-op kept so the numbering has no gap: the workflows migration it was reserved for did not land with 0012-0015 and takes the next free number.
SELECT 1;
