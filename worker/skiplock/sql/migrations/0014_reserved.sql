-- name: 0014_reserved
-- Placeholder for another branch's migration (0014), so 0015 can be numbered before it lands; it changes nothing and is replaced by the real 0014 at merge.
SELECT 1;
