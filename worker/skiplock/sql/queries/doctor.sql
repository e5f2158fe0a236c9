-- name: doctor_indexes
-- Every index of the jobs table with its validity (an interrupted CREATE INDEX CONCURRENTLY leaves an invalid one).
SELECT c.relname AS name, i.indisvalid AS valid, i.indisready AS ready
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass(%(table)s)
ORDER BY c.relname;

-- name: doctor_autovacuum
-- Storage options of the jobs table and the server-wide autovacuum settings they override.
SELECT coalesce((SELECT c.reloptions FROM pg_class AS c WHERE c.oid = to_regclass(%(table)s)), '{{}}'::text[])
           AS reloptions,
       current_setting('autovacuum')::boolean AS autovacuum_on,
       current_setting('track_counts')::boolean AS track_counts_on,
       current_setting('autovacuum_vacuum_scale_factor')::float8 AS server_vacuum_scale_factor;

-- name: doctor_table_stats
-- Live and dead tuples and the last (auto)vacuum of the jobs table, from the cumulative statistics.
SELECT n_live_tup AS live, n_dead_tup AS dead, last_autovacuum, last_vacuum, autovacuum_count,
       pg_total_relation_size(relid) AS total_bytes
FROM pg_stat_user_tables
WHERE relid = to_regclass(%(table)s);

-- name: doctor_xmin_holders
-- Sessions, replication slots and prepared transactions that hold back the xmin horizon, worst first.
SELECT holder, kind, age_seconds, xmin_age, detail FROM (
    SELECT 'pid ' || a.pid AS holder, 'session' AS kind,
           extract(epoch FROM clock_timestamp() - a.xact_start)::float8 AS age_seconds,
           age(a.backend_xmin)::bigint AS xmin_age,
           concat_ws(' ', 'user=' || a.usename, 'application=' || nullif(a.application_name, ''),
                     'state=' || a.state) AS detail
    FROM pg_stat_activity AS a
    WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
    UNION ALL
    SELECT 'slot ' || s.slot_name, 'replication_slot', NULL::float8,
           greatest(age(s.xmin), age(s.catalog_xmin))::bigint,
           concat_ws(' ', 'type=' || s.slot_type, 'active=' || s.active)
    FROM pg_replication_slots AS s
    WHERE s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared ' || p.gid, 'prepared_transaction',
           extract(epoch FROM clock_timestamp() - p.prepared)::float8, age(p.transaction)::bigint,
           'owner=' || p.owner
    FROM pg_prepared_xacts AS p
) AS holders
ORDER BY xmin_age DESC NULLS LAST, age_seconds DESC NULLS LAST
LIMIT %(limit)s;

-- name: doctor_backend_pid
-- The server process behind this connection (it changes between transactions behind a transaction pooler).
SELECT pg_backend_pid() AS pid;

-- name: doctor_notify
-- Send one notification on a channel (the LISTEN round-trip check).
SELECT pg_notify(%(channel)s, %(payload)s);

-- name: doctor_vacuum_state
-- The jobs table against what its live rows need (a bloat estimate from the planner's statistics, no pgstattuple: relpages against reltuples times the average row width of pg_stats), and how far autovacuum is behind: its dead tuples against the table's autovacuum trigger (threshold + scale factor * reltuples, table options first), the last (auto)vacuum, a vacuum running now, the server's naptime and cost settings.
WITH t AS (
    SELECT c.oid, c.relname, n.nspname, c.relpages, greatest(c.reltuples, 0)::float8 AS reltuples, c.reloptions
    FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.oid = to_regclass(%(table)s)
), opts AS (
    SELECT t.oid, o.option_name, o.option_value FROM t, pg_options_to_table(t.reloptions) AS o
)
SELECT t.relpages::bigint AS pages, t.reltuples, current_setting('block_size')::int AS block_size,
       coalesce((SELECT option_value::int FROM opts WHERE option_name = 'fillfactor'), 100) AS fillfactor,
       (SELECT sum(s.avg_width)::float8 FROM pg_stats AS s
        WHERE s.schemaname = t.nspname AND s.tablename = t.relname) AS data_width,
       pg_relation_size(t.oid) AS table_bytes, pg_indexes_size(t.oid) AS index_bytes,
       st.n_live_tup AS live, st.n_dead_tup AS dead,
       extract(epoch FROM now() - greatest(st.last_autovacuum, st.last_vacuum))::float8 AS vacuum_age_seconds,
       coalesce((SELECT option_value::float8 FROM opts WHERE option_name = 'autovacuum_vacuum_threshold'),
                current_setting('autovacuum_vacuum_threshold')::float8)
       + coalesce((SELECT option_value::float8 FROM opts WHERE option_name = 'autovacuum_vacuum_scale_factor'),
                  current_setting('autovacuum_vacuum_scale_factor')::float8) * t.reltuples AS vacuum_trigger,
       (SELECT setting::float8 FROM pg_settings WHERE name = 'autovacuum_naptime') AS naptime_seconds,
       (SELECT option_value FROM opts WHERE option_name = 'autovacuum_vacuum_cost_delay') AS table_cost_delay,
       current_setting('autovacuum_vacuum_cost_delay') AS server_cost_delay,
       (SELECT p.phase FROM pg_stat_progress_vacuum AS p WHERE p.relid = t.oid LIMIT 1) AS vacuum_phase
FROM t
JOIN pg_stat_user_tables AS st ON st.relid = t.oid;
