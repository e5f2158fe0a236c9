-- name: 0013_reserved
-- Placeholder for another branch's migration (0013), so 0014 can be numbered before it lands; it changes nothing and is replaced by the real 0013 at merge.
SELECT 1;
