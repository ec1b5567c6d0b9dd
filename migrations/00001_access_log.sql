-- The access log: how often the application read each cache key, aggregated per
-- key per time bucket (one row per key per bucket, never one row per read).
-- Pre-warm reads "top N keys by hits over the last W" from it:
--
--   SELECT key, sum(hits) FROM hearth_access_log
--   WHERE bucket >= $1 GROUP BY key ORDER BY sum(hits) DESC LIMIT $2
--
-- The primary key leads with bucket, so the window is one range scan of the
-- index, and old buckets are pruned with a range delete of the same index.

-- +goose Up
CREATE TABLE hearth_access_log (
    bucket timestamptz NOT NULL,
    key    text        NOT NULL,
    hits   bigint      NOT NULL CHECK (hits >= 0),
    PRIMARY KEY (bucket, key)
) WITH (fillfactor = 90);

COMMENT ON TABLE hearth_access_log IS
    'Hearth access log: cache reads per key per time bucket (see the Pre-warming section of the Hearth README).';

-- +goose Down
DROP TABLE IF EXISTS hearth_access_log;
