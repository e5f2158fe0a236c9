-- name: 0011_reserved
-- Placeholder for another branch's migration (0011), so 0014 can be numbered before it lands; it changes nothing and is replaced by the real 0011 at merge.
SELECT 1;
