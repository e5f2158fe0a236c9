-- The shop's own tables (not skiplock's). {schema} is the shop's schema, quoted by examples.app.db.
CREATE SCHEMA IF NOT EXISTS {schema};

CREATE TABLE IF NOT EXISTS {schema}.products (
    sku         text PRIMARY KEY,
    name        text NOT NULL,
    price_cents integer NOT NULL CHECK (price_cents >= 0)
);

CREATE TABLE IF NOT EXISTS {schema}.orders (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email       text NOT NULL,
    total_cents integer NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS {schema}.order_items (
    order_id bigint NOT NULL REFERENCES {schema}.orders (id),
    sku      text NOT NULL REFERENCES {schema}.products (sku),
    quantity integer NOT NULL CHECK (quantity > 0),
    PRIMARY KEY (order_id, sku)
);

-- The mail relay drains this outbox; a receipt is written here through job.conn, so exactly once per order.
CREATE TABLE IF NOT EXISTS {schema}.outbox (
    order_id  bigint PRIMARY KEY REFERENCES {schema}.orders (id),
    recipient text NOT NULL,
    subject   text NOT NULL,
    body      text NOT NULL
);

CREATE TABLE IF NOT EXISTS {schema}.daily_reports (
    day         date PRIMARY KEY,
    orders      integer NOT NULL,
    total_cents bigint NOT NULL,
    computed_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO {schema}.products (sku, name, price_cents) VALUES
    ('mug', 'Mug', 1200), ('tee', 'T-shirt', 2500), ('sticker', 'Sticker', 300)
ON CONFLICT (sku) DO NOTHING;
