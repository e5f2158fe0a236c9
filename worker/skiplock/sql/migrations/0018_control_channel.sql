-- name: 0018_control_channel
-- The control channel's name (cancel, pause, drain notifications): random per schema and readable only by the schema's roles, so another tenant of the database cannot guess it to flood the workers.

-- Any role may NOTIFY or LISTEN on any channel of a database: a name derived from the schema (`<schema>_control`
-- before this migration) let anyone send the workers "cancel" and "pause" at will. The name is drawn once here
-- (gen_random_uuid() uses the server's strong random source) and read by the senders inside their statements and
-- by each worker's listener when it connects. Rotate it with
-- `UPDATE <schema>.control_channel SET name = 'skiplock_control_' || replace(gen_random_uuid()::text, '-', '')`:
-- a worker follows at its listener's next connection.
CREATE TABLE IF NOT EXISTS {schema}.control_channel (
    one  boolean PRIMARY KEY DEFAULT true CHECK (one),
    name text NOT NULL CHECK (name ~ '^skiplock_control_[0-9a-f]+$' AND length(name) BETWEEN 40 AND 63)
);
REVOKE ALL ON {schema}.control_channel FROM PUBLIC;
INSERT INTO {schema}.control_channel (name)
VALUES ('skiplock_control_' || replace(gen_random_uuid()::text, '-', ''))
ON CONFLICT (one) DO NOTHING;
