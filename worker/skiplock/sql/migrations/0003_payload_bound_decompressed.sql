-- name: 0003_payload_bound_decompressed
-- The payload bound also holds for a payload that arrives already compressed (copied from another table).

-- jobs_payload_size_check measures the value as it reaches the table. A payload written by a client, or built
-- in the statement, is not compressed yet, so that is its full size. A payload copied from a stored column
-- (INSERT ... SELECT from a temporary table, say) arrives compressed, and 6 MB of repetitive JSON measure
-- about 70 kB: it would pass. For such values only (pg_column_compression is NULL for every value a client
-- sends), this trigger measures the JSON text, the same measure as the client-side max_payload_bytes, and
-- rejects it with the check constraint's own name and SQLSTATE. Lease updates never fire it (UPDATE OF payload).
-- A fixed search_path: the inserting role cannot shadow octet_length or format with functions of its own.
CREATE FUNCTION {schema}.jobs_payload_bound() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    size bigint := octet_length(NEW.payload::text);
BEGIN
    IF size > 1048576 THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "jobs_payload_size_check"', TG_TABLE_NAME
            USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_payload_size_check',
                  SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
                  DETAIL = format('The payload is %s bytes of JSON once decompressed, over 1048576.', size);
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_payload_bound BEFORE INSERT OR UPDATE OF payload ON {schema}.jobs
    FOR EACH ROW WHEN (pg_column_compression(NEW.payload) IS NOT NULL)
    EXECUTE FUNCTION {schema}.jobs_payload_bound();
