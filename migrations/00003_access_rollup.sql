-- The roll-ups of Redis access-log buckets already committed to hearth_access_log.
--
-- A roll-up renames a closed bucket to a private key and writes a random token
-- next to it, then adds the counts to the table and records the token in the
-- same transaction, and only then deletes the private key. A run that crashed
-- after the commit leaves the private key behind: the next run finds its token
-- here and deletes the key instead of adding its counts a second time. Rows are
-- pruned once their bucket is older than the roll-up's lookback.

-- +goose Up
CREATE TABLE hearth_access_rollup (
    bucket    timestamptz NOT NULL,
    token     text        NOT NULL CHECK (octet_length(token) BETWEEN 1 AND 64),
    rolled_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (bucket, token)
);

-- +goose Down
DROP TABLE hearth_access_rollup;
