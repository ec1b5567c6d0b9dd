-- The stored ranking: the top-N keys of the access log over the pre-warm window,
-- recomputed by the leader every access_log.rank_interval. A pre-warm reads it
-- with one index scan that streams at once, instead of aggregating and sorting
-- the whole window at the worst moment (a restart, a failover, a cutover); when
-- it is missing or stale, the pre-warm ranks the log live.

-- +goose Up
-- The keys in rank order, a chunk of up to 1000 per row: a few rows to write
-- and to read instead of one per key.
CREATE TABLE hearth_access_rank (
    chunk integer PRIMARY KEY CHECK (chunk >= 0),
    keys  text[]  NOT NULL
);

-- One row: when the ranking was computed (by the database clock), over which
-- window, for how many keys, and how many it found.
CREATE TABLE hearth_access_rank_info (
    singleton   boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    computed_at timestamptz NOT NULL,
    window_ms   bigint      NOT NULL,
    top_n       integer     NOT NULL,
    keys        integer     NOT NULL
);

-- +goose Down
DROP TABLE hearth_access_rank_info;
DROP TABLE hearth_access_rank;
