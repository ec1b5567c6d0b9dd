-- hearth_notify(): the trigger function behind change-driven refresh (see
-- docs/freshness.md). Attach it to a table with the three statement-level
-- triggers `hearth notify-sql` prints; its two arguments are the LISTEN
-- channel of the declaration (notify.channel) and the column that holds the
-- member (the {param} of the key template).
--
-- Once per statement it sends the distinct changed members (old and new rows
-- of an UPDATE, the new rows of an INSERT, the old rows of a DELETE), as JSON:
--
--   {"hearth":1,"ts":<clock_timestamp() in µs since 1970>,"ids":["1","2",…]}
--
-- chunked so that no payload reaches PostgreSQL's 8000-byte limit. A statement
-- that changes more than 10,000 members, or a member longer than 1024 bytes,
-- sends {"hearth":1,"ts":…,"all":true} instead: re-read the declaration in
-- full. Notifications are delivered at commit, and not at all on rollback.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION hearth_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  channel text := TG_ARGV[0];
  col     text := TG_ARGV[1];
  ts      bigint := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
  ids     text[];
  head    text;
  chunk   text := '';
  item    text;
  id      text;
  has     boolean;
BEGIN
  IF TG_NARGS <> 2 THEN
    RAISE EXCEPTION 'hearth_notify(channel, member_column): got % arguments', TG_NARGS;
  END IF;
  -- Static queries (planned once per session, unlike EXECUTE): the member is
  -- read as the row's JSON field, which for integers and text is the same
  -- string as column::text.
  IF TG_OP = 'INSERT' THEN
    SELECT bool_and(r.j ? col), array_agg(DISTINCT r.j ->> col) INTO has, ids
    FROM (SELECT to_jsonb(n) AS j FROM hearth_new AS n) AS r;
  ELSIF TG_OP = 'DELETE' THEN
    SELECT bool_and(r.j ? col), array_agg(DISTINCT r.j ->> col) INTO has, ids
    FROM (SELECT to_jsonb(o) AS j FROM hearth_old AS o) AS r;
  ELSE
    SELECT bool_and(r.j ? col), array_agg(DISTINCT r.j ->> col) INTO has, ids
    FROM (SELECT to_jsonb(n) AS j FROM hearth_new AS n UNION ALL SELECT to_jsonb(o) FROM hearth_old AS o) AS r;
  END IF;
  IF ids IS NULL THEN
    RETURN NULL;
  END IF;
  head := '{"hearth":1,"ts":' || ts || ',';
  IF NOT has THEN
    -- A wrongly attached trigger must not fail the application's write:
    -- warn, and have Hearth re-read the declaration.
    RAISE WARNING 'hearth_notify: table %.% has no column %; notifying "all"', TG_TABLE_SCHEMA, TG_TABLE_NAME, col;
    PERFORM pg_notify(channel, head || '"all":true}');
    RETURN NULL;
  END IF;
  IF cardinality(ids) > 10000 THEN
    PERFORM pg_notify(channel, head || '"all":true}');
    RETURN NULL;
  END IF;
  FOREACH id IN ARRAY ids LOOP
    CONTINUE WHEN id IS NULL;
    IF octet_length(id) > 1024 THEN
      PERFORM pg_notify(channel, head || '"all":true}');
      RETURN NULL;
    END IF;
    item := to_json(id)::text;
    IF chunk <> '' AND octet_length(head) + octet_length(chunk) + octet_length(item) + 12 > 7900 THEN
      PERFORM pg_notify(channel, head || '"ids":[' || chunk || ']}');
      chunk := '';
    END IF;
    IF chunk = '' THEN
      chunk := item;
    ELSE
      chunk := chunk || ',' || item;
    END IF;
  END LOOP;
  IF chunk <> '' THEN
    PERFORM pg_notify(channel, head || '"ids":[' || chunk || ']}');
  END IF;
  RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS hearth_notify();
