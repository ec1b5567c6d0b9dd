-- Bounds on what hearth_access_log holds, enforced by the table itself, so that
-- the documented recording statement (and any older copy of it an application
-- still sends) cannot fail a whole batch, or later the ranking, on one bad row:
--
-- * a key longer than 1024 bytes (accesslog.MaxKeyBytes) is dropped, not
--   inserted: a btree index entry is limited to about 2,700 bytes, and a longer
--   key fails the whole INSERT … ON CONFLICT statement, every key of the batch;
-- * a negative count is dropped (the CHECK would fail the whole batch);
-- * a count above 1,000,000,000,000 per key per bucket (accesslog.MaxBucketHits)
--   is lowered to it: no application reads one key a trillion times in one
--   bucket, and with every row at most that, `hits + EXCLUDED.hits` cannot
--   overflow a bigint.
--
-- Each dropped or lowered row is counted in hearth_access_log_rejects (one row
-- per reason, written only when a bad row arrives) and raised as a WARNING in
-- the server log; Hearth exports the counts as
-- hearth_access_log_recording_rejects{reason}.

-- +goose Up
CREATE TABLE hearth_access_log_rejects (
    reason text   PRIMARY KEY CHECK (reason IN ('too_long', 'bad_count', 'clamped')),
    n      bigint NOT NULL DEFAULT 0 CHECK (n >= 0)
);
INSERT INTO hearth_access_log_rejects (reason) VALUES ('too_long'), ('bad_count'), ('clamped');

-- Counts already stored above the bound are lowered once, so that the first
-- upsert after this migration cannot overflow either.
UPDATE hearth_access_log SET hits = 1000000000000 WHERE hits > 1000000000000;

-- +goose StatementBegin
CREATE FUNCTION hearth_access_log_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' AND octet_length(NEW.key) > 1024 THEN
        UPDATE hearth_access_log_rejects SET n = n + 1 WHERE reason = 'too_long';
        RAISE WARNING 'hearth_access_log: key of % bytes dropped (at most 1024): %',
            octet_length(NEW.key), to_json(left(NEW.key, 64));
        RETURN NULL;
    END IF;
    IF NEW.hits IS NULL OR NEW.hits < 0 THEN
        UPDATE hearth_access_log_rejects SET n = n + 1 WHERE reason = 'bad_count';
        RAISE WARNING 'hearth_access_log: count % of key % dropped (must be >= 0)',
            NEW.hits, to_json(left(NEW.key, 64));
        RETURN NULL;
    END IF;
    IF NEW.hits > 1000000000000 THEN
        UPDATE hearth_access_log_rejects SET n = n + 1 WHERE reason = 'clamped';
        RAISE WARNING 'hearth_access_log: count % of key % lowered to 1000000000000',
            NEW.hits, to_json(left(NEW.key, 64));
        NEW.hits := 1000000000000;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER hearth_access_log_guard BEFORE INSERT OR UPDATE ON hearth_access_log
    FOR EACH ROW EXECUTE FUNCTION hearth_access_log_guard();

-- +goose Down
DROP TRIGGER hearth_access_log_guard ON hearth_access_log;
DROP FUNCTION hearth_access_log_guard();
DROP TABLE hearth_access_log_rejects;
