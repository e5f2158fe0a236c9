-- name: 0012_reserved
-- Placeholder for another branch's migration (0012), so 0014 can be numbered before it lands; it changes nothing and is replaced by the real 0012 at merge.
SELECT 1;
