-- name: 0009_reserved
-- Placeholder for the 0009 migration of another branch (kept only so 0010 has no gap here); removed when it lands.

SELECT 1;
