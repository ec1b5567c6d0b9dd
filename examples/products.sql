-- A small catalogue for trying Hearth with config.yaml:
--   psql -h 127.0.0.1 -U postgres -d test -f examples/products.sql
CREATE TABLE IF NOT EXISTS products (
    id         bigint PRIMARY KEY,
    name       text   NOT NULL,
    price_cents integer NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO products (id, name, price_cents)
SELECT i, 'product ' || i, 100 + i
FROM generate_series(1, 200) AS i
ON CONFLICT (id) DO NOTHING;
