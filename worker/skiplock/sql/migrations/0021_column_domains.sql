-- name: 0021_column_domains
-- The bounds on columns that a claim and a completion never write move from table CHECK constraints to domains (same names, same bounds): PostgreSQL checks a table's constraints on every row version it writes, a domain's only when a value of the column is written.

-- Why (issue 41): PostgreSQL evaluates every CHECK constraint of a table on each new row version, whatever columns
-- the statement set: the claim and the completion, which write status and the lease columns only, re-checked the
-- lengths of queue, task and keys, the size of payload and result, the range of both times, every time. A domain's
-- constraints run when a value is coerced to it: an INSERT or a COPY, or an UPDATE that sets that column; a column
-- the UPDATE does not set is copied as it is. So each such column gets a domain over its type, carrying its bounds
-- under the constraint names it had (the errors name them as before, as "value for domain ..."), and the table keeps
-- the checks that span columns or guard a column the hot path writes: jobs_status_check, jobs_lease_check,
-- jobs_attempts_check (attempts only now; max_attempts is bound by its domain) and jobs_unique_key_states_check (a
-- key needs its states; the key's length is its domain's). jobs_timeout_check (> 0) was inside
-- jobs_timeout_bound_check and is not carried over; jobs_max_attempts_bound_check now holds 1 to 1000.
--
-- How: the columns take bare domains first (a type whose values are the same bytes: no table rewrite, every index
-- kept as it is), the constraints are added to the domains NOT VALID and then validated against the stored rows,
-- one scan each. A constraint that was NOT VALID on the table (added by 0002 to 0016 without a scan) may meet an
-- older row outside it: that one stays NOT VALID, with a WARNING naming it, and the row stays as it was. The table
-- is locked (ACCESS EXCLUSIVE: reads wait too) until the migration commits; the wait for the lock is bounded as in
-- 0007. Views on jobs are dropped and created again around the type change (ALTER COLUMN TYPE refuses while one uses
-- the column), with their owner, options, privileges and comment; the two payload triggers, which name payload,
-- likewise. Every statement here may run twice.
SET LOCAL lock_timeout = '5s';
LOCK TABLE {schema}.jobs IN ACCESS EXCLUSIVE MODE;

DO $$
BEGIN
    IF to_regtype('{schema}.job_queue') IS NULL THEN
        CREATE DOMAIN {schema}.job_queue AS text;
        CREATE DOMAIN {schema}.job_payload AS jsonb;
        CREATE DOMAIN {schema}.job_result AS jsonb;
        CREATE DOMAIN {schema}.job_task AS text;
        CREATE DOMAIN {schema}.job_idempotency_key AS text;
        CREATE DOMAIN {schema}.job_unique_key AS text;
        CREATE DOMAIN {schema}.job_unique_states AS text[];
        CREATE DOMAIN {schema}.job_serial_key AS text;
        CREATE DOMAIN {schema}.job_max_attempts AS integer;
        CREATE DOMAIN {schema}.job_timeout_seconds AS double precision;
        CREATE DOMAIN {schema}.job_visible_at AS timestamptz;
        CREATE DOMAIN {schema}.job_created_at AS timestamptz;
    END IF;
END
$$;

-- The type change, with the views on jobs dropped and created again around it (ALTER COLUMN TYPE refuses while a
-- view uses the column; a view on a view after it), and the two triggers that name payload likewise.
DO $$
DECLARE
    saved jsonb;
    v jsonb;
    kind text;
    privilege record;
BEGIN
    WITH RECURSIVE dependent(oid, depth) AS (
        SELECT r.ev_class, 1
        FROM pg_depend AS d JOIN pg_rewrite AS r ON r.oid = d.objid
        WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
          AND d.refobjid = (SELECT typrelid FROM pg_type WHERE oid = pg_typeof(NULL::{schema}.jobs))
          AND r.ev_class <> d.refobjid
        UNION
        SELECT r.ev_class, v.depth + 1
        FROM dependent AS v
        JOIN pg_depend AS d
          ON d.refobjid = v.oid AND d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
        JOIN pg_rewrite AS r ON r.oid = d.objid
        WHERE r.ev_class <> v.oid
    ), views AS (
        SELECT c.oid::regclass::text AS name, CASE c.relkind WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'VIEW' END AS kind,
               max(v.depth) AS depth, pg_get_viewdef(c.oid) AS definition, c.reloptions,
               pg_get_userbyid(c.relowner) AS owner, c.relacl::text AS acl, obj_description(c.oid, 'pg_class') AS comment,
               ARRAY(SELECT pg_get_indexdef(i.indexrelid) FROM pg_index AS i WHERE i.indrelid = c.oid) AS indexes,
               EXISTS (SELECT 1 FROM pg_trigger AS t WHERE t.tgrelid = c.oid)
               OR EXISTS (SELECT 1 FROM pg_rewrite AS r WHERE r.ev_class = c.oid AND r.rulename <> '_RETURN')
               OR EXISTS (SELECT 1 FROM pg_attribute AS a WHERE a.attrelid = c.oid AND a.attacl IS NOT NULL)
                   AS unmovable
        FROM dependent AS v JOIN pg_class AS c ON c.oid = v.oid
        GROUP BY c.oid
    )
    SELECT coalesce(jsonb_agg(to_jsonb(views) ORDER BY depth), '[]') INTO saved FROM views;

    FOR v IN SELECT * FROM jsonb_array_elements(saved) LOOP
        IF (v ->> 'unmovable')::boolean THEN
            RAISE EXCEPTION 'skiplock migration column_domains: view % uses the jobs table and has triggers, rules or '
                            'column privileges this migration does not carry over: drop it, migrate, and create it '
                            'again', v ->> 'name';
        END IF;
    END LOOP;
    FOR v IN SELECT e.view FROM jsonb_array_elements(saved) WITH ORDINALITY AS e(view, n) ORDER BY e.n DESC LOOP
        EXECUTE format('DROP %s %s', v ->> 'kind', v ->> 'name');
    END LOOP;

    DROP TRIGGER IF EXISTS jobs_payload_bound ON {schema}.jobs;
    DROP TRIGGER IF EXISTS jobs_payload_bound_update ON {schema}.jobs;
    ALTER TABLE {schema}.jobs
        ALTER COLUMN queue TYPE {schema}.job_queue,
        ALTER COLUMN payload TYPE {schema}.job_payload,
        ALTER COLUMN result TYPE {schema}.job_result,
        ALTER COLUMN task TYPE {schema}.job_task,
        ALTER COLUMN idempotency_key TYPE {schema}.job_idempotency_key,
        ALTER COLUMN unique_key TYPE {schema}.job_unique_key,
        ALTER COLUMN unique_states TYPE {schema}.job_unique_states,
        ALTER COLUMN serial_key TYPE {schema}.job_serial_key,
        ALTER COLUMN max_attempts TYPE {schema}.job_max_attempts,
        ALTER COLUMN timeout_seconds TYPE {schema}.job_timeout_seconds,
        ALTER COLUMN visible_at TYPE {schema}.job_visible_at,
        ALTER COLUMN created_at TYPE {schema}.job_created_at;
    CREATE TRIGGER jobs_payload_bound BEFORE INSERT ON {schema}.jobs
        FOR EACH ROW WHEN (pg_column_compression(NEW.payload) IS NOT NULL)
        EXECUTE FUNCTION {schema}.jobs_payload_bound();
    CREATE TRIGGER jobs_payload_bound_update AFTER UPDATE OF payload ON {schema}.jobs
        FOR EACH ROW WHEN (pg_column_compression(NEW.payload) IS NOT NULL)
        EXECUTE FUNCTION {schema}.jobs_payload_bound();

    FOR v IN SELECT * FROM jsonb_array_elements(saved) LOOP
        kind := v ->> 'kind';
        EXECUTE format('CREATE %s %s%s AS %s', kind, v ->> 'name',
                       CASE jsonb_typeof(v -> 'reloptions') WHEN 'array' THEN format(' WITH (%s)', array_to_string(
                           ARRAY(SELECT jsonb_array_elements_text(v -> 'reloptions')), ', ')) ELSE '' END,
                       rtrim(v ->> 'definition', ';'));
        EXECUTE format('ALTER %s %s OWNER TO %I', kind, v ->> 'name', v ->> 'owner');
        EXECUTE format('COMMENT ON %s %s IS %L', kind, v ->> 'name', v ->> 'comment');
        IF v ->> 'acl' IS NOT NULL THEN
            EXECUTE format('REVOKE ALL ON %s FROM %I', v ->> 'name', v ->> 'owner');
            FOR privilege IN SELECT * FROM aclexplode((v ->> 'acl')::aclitem[]) LOOP
                EXECUTE format('GRANT %s ON %s TO %s%s', privilege.privilege_type, v ->> 'name',
                               CASE privilege.grantee WHEN 0 THEN 'PUBLIC'
                                    ELSE quote_ident(pg_get_userbyid(privilege.grantee)) END,
                               CASE WHEN privilege.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
            END LOOP;
        END IF;
        FOR i IN 1 .. jsonb_array_length(v -> 'indexes') LOOP
            EXECUTE v -> 'indexes' ->> (i - 1);
        END LOOP;
    END LOOP;
END
$$;

-- The bounds, as declarative as they were; NOT VALID here, validated against the stored rows below.
ALTER DOMAIN {schema}.job_queue DROP CONSTRAINT IF EXISTS jobs_queue_check;
ALTER DOMAIN {schema}.job_queue ADD CONSTRAINT jobs_queue_check CHECK (length(VALUE) BETWEEN 1 AND 128) NOT VALID;
ALTER DOMAIN {schema}.job_payload DROP CONSTRAINT IF EXISTS jobs_payload_size_check;
ALTER DOMAIN {schema}.job_payload
    ADD CONSTRAINT jobs_payload_size_check CHECK (pg_column_size(VALUE) <= 1048576) NOT VALID;
ALTER DOMAIN {schema}.job_result DROP CONSTRAINT IF EXISTS jobs_result_size_check;
ALTER DOMAIN {schema}.job_result
    ADD CONSTRAINT jobs_result_size_check CHECK (pg_column_size(VALUE) <= 1048576) NOT VALID;
ALTER DOMAIN {schema}.job_task DROP CONSTRAINT IF EXISTS jobs_task_check;
ALTER DOMAIN {schema}.job_task ADD CONSTRAINT jobs_task_check CHECK (length(VALUE) BETWEEN 1 AND 200) NOT VALID;
ALTER DOMAIN {schema}.job_idempotency_key DROP CONSTRAINT IF EXISTS jobs_idempotency_key_check;
ALTER DOMAIN {schema}.job_idempotency_key
    ADD CONSTRAINT jobs_idempotency_key_check CHECK (length(VALUE) BETWEEN 1 AND 255) NOT VALID;
ALTER DOMAIN {schema}.job_unique_key DROP CONSTRAINT IF EXISTS jobs_unique_key_check;
ALTER DOMAIN {schema}.job_unique_key
    ADD CONSTRAINT jobs_unique_key_check CHECK (length(VALUE) BETWEEN 1 AND 512) NOT VALID;
ALTER DOMAIN {schema}.job_unique_states DROP CONSTRAINT IF EXISTS jobs_unique_states_check;
ALTER DOMAIN {schema}.job_unique_states
    ADD CONSTRAINT jobs_unique_states_check
        CHECK (array_ndims(VALUE) = 1 AND cardinality(VALUE) <= 5
               AND VALUE <@ '{{pending,processing,done,failed,cancelled}}'::text[]
               AND VALUE @> '{{pending,processing}}'::text[]) NOT VALID;
ALTER DOMAIN {schema}.job_serial_key DROP CONSTRAINT IF EXISTS jobs_serial_key_check;
ALTER DOMAIN {schema}.job_serial_key
    ADD CONSTRAINT jobs_serial_key_check CHECK (length(VALUE) BETWEEN 1 AND 255) NOT VALID;
ALTER DOMAIN {schema}.job_max_attempts DROP CONSTRAINT IF EXISTS jobs_max_attempts_bound_check;
ALTER DOMAIN {schema}.job_max_attempts
    ADD CONSTRAINT jobs_max_attempts_bound_check CHECK (VALUE BETWEEN 1 AND 1000) NOT VALID;
ALTER DOMAIN {schema}.job_timeout_seconds DROP CONSTRAINT IF EXISTS jobs_timeout_bound_check;
ALTER DOMAIN {schema}.job_timeout_seconds
    ADD CONSTRAINT jobs_timeout_bound_check CHECK (VALUE > 0 AND VALUE <= 31536000) NOT VALID;
ALTER DOMAIN {schema}.job_visible_at DROP CONSTRAINT IF EXISTS jobs_visible_at_check;
ALTER DOMAIN {schema}.job_visible_at
    ADD CONSTRAINT jobs_visible_at_check
        CHECK (VALUE >= TIMESTAMPTZ '1970-01-01 00:00:00+00' AND VALUE < TIMESTAMPTZ '3000-01-01 00:00:00+00') NOT VALID;
ALTER DOMAIN {schema}.job_created_at DROP CONSTRAINT IF EXISTS jobs_created_at_check;
ALTER DOMAIN {schema}.job_created_at
    ADD CONSTRAINT jobs_created_at_check
        CHECK (VALUE >= TIMESTAMPTZ '1970-01-01 00:00:00+00' AND VALUE < TIMESTAMPTZ '3000-01-01 00:00:00+00') NOT VALID;

-- What stays on the table: checks across columns, and the one of a column the claim writes.
ALTER TABLE {schema}.jobs
    DROP CONSTRAINT IF EXISTS jobs_queue_check,
    DROP CONSTRAINT IF EXISTS jobs_payload_size_check,
    DROP CONSTRAINT IF EXISTS jobs_result_size_check,
    DROP CONSTRAINT IF EXISTS jobs_task_check,
    DROP CONSTRAINT IF EXISTS jobs_idempotency_key_check,
    DROP CONSTRAINT IF EXISTS jobs_unique_key_check,
    DROP CONSTRAINT IF EXISTS jobs_unique_states_check,
    DROP CONSTRAINT IF EXISTS jobs_serial_key_check,
    DROP CONSTRAINT IF EXISTS jobs_max_attempts_bound_check,
    DROP CONSTRAINT IF EXISTS jobs_timeout_check,
    DROP CONSTRAINT IF EXISTS jobs_timeout_bound_check,
    DROP CONSTRAINT IF EXISTS jobs_visible_at_check,
    DROP CONSTRAINT IF EXISTS jobs_created_at_check,
    DROP CONSTRAINT IF EXISTS jobs_attempts_check,
    DROP CONSTRAINT IF EXISTS jobs_unique_key_states_check,
    ADD CONSTRAINT jobs_attempts_check CHECK (attempts >= 0),
    ADD CONSTRAINT jobs_unique_key_states_check CHECK (unique_key IS NULL OR unique_states IS NOT NULL) NOT VALID;

-- The stored rows, checked against each bound (one scan each); one outside a bound keeps that bound NOT VALID.
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN
        SELECT con.conname, con.contypid::regtype AS domain
        FROM pg_constraint AS con JOIN pg_type AS t ON t.oid = con.contypid
        WHERE t.typnamespace = (SELECT typnamespace FROM pg_type WHERE oid = pg_typeof(NULL::{schema}.jobs))
          AND t.typname LIKE 'job\_%' AND NOT con.convalidated
    LOOP
        BEGIN
            EXECUTE format('ALTER DOMAIN %s VALIDATE CONSTRAINT %I', c.domain, c.conname);
        EXCEPTION WHEN check_violation THEN
            RAISE WARNING 'skiplock migration column_domains: a stored job is outside % (%); the constraint stays NOT VALID '
                          'and the row as it was', c.conname, SQLERRM;
        END;
    END LOOP;
END
$$;
DO $$
BEGIN
    ALTER TABLE {schema}.jobs VALIDATE CONSTRAINT jobs_unique_key_states_check;
EXCEPTION WHEN check_violation THEN
    RAISE WARNING 'skiplock migration column_domains: a stored job has a unique key without unique_states; '
                  'jobs_unique_key_states_check stays NOT VALID and the row as it was';
END
$$;

-- The type change dropped the columns' statistics: gather them again, so the claim's plans do not change. A table
-- never analyzed (reltuples -1: a new install) stays so, as the planner's guesses for it are what it had.
DO $$
BEGIN
    IF (SELECT reltuples >= 0 FROM pg_class
        WHERE oid = (SELECT typrelid FROM pg_type WHERE oid = pg_typeof(NULL::{schema}.jobs))) THEN
        ANALYZE {schema}.jobs;
    END IF;
END
$$;
