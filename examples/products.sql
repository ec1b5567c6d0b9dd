-- A small catalogue for trying Hearth with config.yaml (README "Quick start"):
--   psql "$CATALOG_DSN" -f examples/products.sql
CREATE TABLE IF NOT EXISTS products (
    id         bigint PRIMARY KEY,
    name       text   NOT NULL,
    price_cents integer NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- For the top-products declaration (ORDER BY price_cents DESC LIMIT 10): an
-- index scan instead of a scan and sort of the whole table.
CREATE INDEX IF NOT EXISTS products_price_cents ON products (price_cents);
INSERT INTO products (id, name, price_cents)
SELECT i, 'product ' || i, 100 + i
FROM generate_series(1, 200) AS i
ON CONFLICT (id) DO NOTHING;
