package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/warmer"
)

const bigValue = 50 << 20

// TestValueBound: a 50 MB value next to good rows fails alone as too large, and
// is never fetched: the whole load allocates far less than the value's size.
func TestValueBound(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE blobs (id text PRIMARY KEY, body bytea, note text, doc jsonb);
		INSERT INTO blobs SELECT i::text, ('v' || i)::bytea, 'n' || i, jsonb_build_object('i', i) FROM generate_series(1, 5) i;
		INSERT INTO blobs VALUES ('big', decode(repeat('ab', %[1]d), 'hex'), repeat('x', %[1]d), jsonb_build_object('x', repeat('x', %[1]d)));`, bigValue)); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN, MaxConns: 2, Log: zerolog.New(zerolog.SyncWriter(&logs))})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	members := []string{"1", "2", "big", "3", "4", "5"}
	defer func() {
		if !strings.Contains(logs.String(), `"member":"big","bytes":52428800,"max_value_bytes":1048576`) {
			t.Errorf("oversize value not logged with its member and size:\n%s", logs.String())
		}
	}()
	for _, col := range []string{"body", "note", "doc"} {
		t.Run(col, func(t *testing.T) {
			s := spec(t, "blob:{id}", fmt.Sprintf("SELECT id, %s FROM blobs WHERE id = ANY($1) -- a trailing comment;\n;", col))
			s.MaxValueBytes = 1 << 20
			if _, err := src.Load(ctx, s, []string{"1"}); err != nil { // describe once, outside the measure
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			rs, err := src.Load(ctx, s, members)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 8<<20 {
				t.Errorf("the load allocated %d MB: the oversize value was fetched", got>>20)
			}
			if len(rs) != len(members) {
				t.Fatalf("results %d, want %d", len(rs), len(members))
			}
			for _, r := range rs {
				if r.Member == "big" {
					if !errors.Is(r.Err, warmer.ErrTooLarge) || r.Value != nil || !strings.Contains(r.Err.Error(), "max_value_bytes is 1048576") {
						t.Errorf("big: err %v (value %d bytes), want ErrTooLarge naming the bound", r.Err, len(r.Value))
					}
					continue
				}
				if r.Err != nil || len(r.Value) == 0 {
					t.Errorf("member %s: %q %v", r.Member, r.Value, r.Err)
				}
			}
		})
	}
	t.Run("single key", func(t *testing.T) {
		s := spec(t, "blob", "SELECT body FROM blobs WHERE id = 'big'")
		s.MaxValueBytes = 1 << 20
		rs, err := src.Load(ctx, s, nil)
		if err != nil || len(rs) != 1 || !errors.Is(rs[0].Err, warmer.ErrTooLarge) {
			t.Errorf("single oversize key: %v %v", rs, err)
		}
		s = spec(t, "blob", "SELECT body FROM blobs WHERE id = '1'")
		s.MaxValueBytes = 1 << 20
		if rs, err := src.Load(ctx, s, nil); err != nil || string(rs[0].Value) != "v1" {
			t.Errorf("single key: %v %v", rs, err)
		}
	})
	t.Run("a value of exactly the bound loads", func(t *testing.T) {
		s := spec(t, "blob:{id}", "SELECT id, note FROM blobs WHERE id = ANY($1)")
		s.MaxValueBytes = 2 // 'n1'
		rs, err := src.Load(ctx, s, []string{"1"})
		if err != nil || rs[0].Err != nil || string(rs[0].Value) != "n1" {
			t.Errorf("value of exactly the bound: %v %v", rs, err)
		}
		s.MaxValueBytes = 1
		if rs, err = src.Load(ctx, s, []string{"1"}); err != nil || !errors.Is(rs[0].Err, warmer.ErrTooLarge) {
			t.Errorf("value one over the bound: %v %v", rs, err)
		}
	})
}

// TestBoundedQueryUsesIndex: the wrapper around a declaration query is pulled up
// by the planner, so a batch on 100,000 rows is still an index scan; so is the
// query that reads the sizes of values that came back NULL.
func TestBoundedQueryUsesIndex(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `
		CREATE TABLE products (id bigint PRIMARY KEY, body text NOT NULL);
		INSERT INTO products SELECT i, repeat('p', 200) || i FROM generate_series(1, 100000) i;
		ANALYZE products;`); err != nil {
		t.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	s := spec(t, "p:{id}", "SELECT id::text, body FROM products WHERE id = ANY($1::bigint[])")
	s.MaxValueBytes = 1 << 20
	sql, err := src.BoundedSQL(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	sizes, err := src.SizesSQL(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{sql, []any{[]string{"1", "500", "99999"}, int64(s.MaxValueBytes)}},
		{sizes, []any{[]string{"1", "500", "99999"}}},
	} {
		rows, err := pg.Pool.Query(ctx, "EXPLAIN "+q.sql, q.args...)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		text := strings.Join(plan, "\n")
		if !strings.Contains(text, "Index Scan using products_pkey") || strings.Contains(text, "Seq Scan") {
			t.Errorf("query does not use the primary key:\n%s\n%s", q.sql, text)
		}
	}
	rs, err := src.Load(ctx, s, []string{"1", "500", "99999"})
	if err != nil || len(rs) != 3 {
		t.Fatalf("load: %v %v", rs, err)
	}
}

// TestValueTypeChanged: when a value column changes type under a running
// source, the next load describes the query again instead of failing forever.
func TestValueTypeChanged(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `CREATE TABLE t (id text PRIMARY KEY, v text); INSERT INTO t VALUES ('1', '{"a": 1}');`); err != nil {
		t.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN, MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	s := spec(t, "t:{id}", "SELECT id, v FROM t WHERE id = ANY($1)")
	s.MaxValueBytes = 100
	if rs, err := src.Load(ctx, s, []string{"1"}); err != nil || rs[0].Err != nil {
		t.Fatalf("load: %v %v", rs, err)
	}
	if _, err := pg.Pool.Exec(ctx, `ALTER TABLE t ALTER COLUMN v TYPE jsonb USING v::jsonb`); err != nil {
		t.Fatal(err)
	}
	var last error
	for range 3 {
		rs, err := src.Load(ctx, s, []string{"1"})
		if err == nil && rs[0].Err == nil && string(rs[0].Value) == `{"a": 1}` {
			return
		}
		last = err
	}
	t.Errorf("loads keep failing after the column type changed: %v", last)
}

// TestInt8ArrayMembers: a query whose member parameter is an int8[] gets the
// members bound as int64s. A member the bigint would not give back as written
// (007, " 7", +7, 7.0: the query would answer for 7, under "7") fails alone as
// a bad member, unsent, as does one that is no integer at all; the others load.
func TestInt8ArrayMembers(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `
		CREATE TABLE int8_members (id bigint PRIMARY KEY, body text NOT NULL);
		INSERT INTO int8_members VALUES (1, 'one'), (7, 'seven'), (9223372036854775807, 'max'), (-3, 'minus');`); err != nil {
		t.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	s := spec(t, "p:{id}", "SELECT id::text, body FROM int8_members WHERE id = ANY($1::bigint[])")
	rs, err := src.Load(ctx, s, []string{"1", "9223372036854775807", "-3", "007", " 7", "+7", "7.0", "x", "9223372036854775808", "404"})
	if err != nil {
		t.Fatal(err)
	}
	got, bad := map[string]string{}, map[string]bool{}
	for _, r := range rs {
		switch {
		case errors.Is(r.Err, warmer.ErrBadMember):
			bad[r.Member] = true
		case r.Err != nil:
			t.Errorf("member %q: %v", r.Member, r.Err)
		default:
			got[r.Member] = string(r.Value)
		}
	}
	if want := map[string]string{"1": "one", "9223372036854775807": "max", "-3": "minus"}; !maps.Equal(got, want) {
		t.Errorf("loaded %v, want %v (and nothing under 7, which no member asked for)", got, want)
	}
	if want := map[string]bool{"007": true, " 7": true, "+7": true, "7.0": true, "x": true, "9223372036854775808": true}; !maps.Equal(bad, want) {
		t.Errorf("bad members %v, want %v", bad, want)
	}
}

// TestNullOrOverTheBound: a value over max_value_bytes and a NULL value both
// come back NULL from the bounded query (no row carries its size); the sizes
// of those two alone are read afterwards to tell them apart: too large (named
// with its size) or NULL, in one batch, for text and jsonb values, with and
// without a version column, and for a single key. When the sizes cannot be
// read, both fail with that error; the other members load either way.
func TestNullOrOverTheBound(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `
		CREATE TABLE things (id bigint PRIMARY KEY, note text, doc jsonb, ver bigint NOT NULL DEFAULT 7);
		INSERT INTO things (id, note, doc) VALUES
			(1, 'ok', '{"a": 1}'), (2, repeat('x', 100), jsonb_build_object('x', repeat('x', 100))),
			(3, NULL, NULL), (4, 'fine', '{"b": 2}');`); err != nil {
		t.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN, MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for _, col := range []string{"note", "doc"} {
		for _, versioned := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s versioned %t", col, versioned), func(t *testing.T) {
				q := fmt.Sprintf("SELECT id, %s FROM things WHERE id = ANY($1::bigint[])", col)
				if versioned {
					q = fmt.Sprintf("SELECT id, %s, ver FROM things WHERE id = ANY($1::bigint[])", col)
				}
				s := spec(t, "t:{id}", q)
				if versioned {
					s.VersionColumn = "ver"
				}
				s.MaxValueBytes = 50
				rs, err := src.Load(ctx, s, []string{"1", "2", "3", "4"})
				if err != nil {
					t.Fatal(err)
				}
				got := map[string]warmer.Result{}
				for _, r := range rs {
					got[r.Member] = r
				}
				if len(rs) != 4 || got["1"].Err != nil || got["4"].Err != nil || len(got["1"].Value) == 0 || len(got["4"].Value) == 0 {
					t.Errorf("the members within the bound: %+v", rs)
				}
				if r := got["2"]; !errors.Is(r.Err, warmer.ErrTooLarge) || r.Value != nil || !strings.Contains(r.Err.Error(), "max_value_bytes is 50") {
					t.Errorf("member 2 (over the bound): %q %v, want ErrTooLarge naming the bound", r.Value, r.Err)
				}
				if r := got["3"]; !errors.Is(r.Err, warmer.ErrNullValue) || errors.Is(r.Err, warmer.ErrTooLarge) || !strings.Contains(r.Err.Error(), `member "3"`) {
					t.Errorf("member 3 (NULL): %v, want ErrNullValue naming the member", r.Err)
				}
				if versioned && (!got["1"].HasVersion || got["1"].Version != 7) {
					t.Errorf("member 1's version: %+v", got["1"])
				}
			})
		}
	}
	t.Run("single key", func(t *testing.T) {
		for id, want := range map[int]error{2: warmer.ErrTooLarge, 3: warmer.ErrNullValue} {
			s := spec(t, "one", fmt.Sprintf("SELECT note FROM things WHERE id = %d", id))
			s.MaxValueBytes = 50
			rs, err := src.Load(ctx, s, nil)
			if err != nil || len(rs) != 1 || !errors.Is(rs[0].Err, want) || rs[0].Value != nil {
				t.Errorf("single key of row %d: %+v %v, want %v", id, rs, err, want)
			}
		}
	})
	t.Run("sizes unreadable", func(t *testing.T) {
		// The sizes query reads the column through a function that fails
		// when it is called on a NULL value's row; the bounded query never
		// calls it for that row's value.
		if _, err := pg.Pool.Exec(ctx, `CREATE FUNCTION size_fails(t text) RETURNS text LANGUAGE plpgsql AS $$
			BEGIN IF current_query() NOT LIKE '%CASE WHEN%' THEN RAISE EXCEPTION 'sizes unreadable'; END IF; RETURN t; END $$`); err != nil {
			t.Fatal(err)
		}
		s := spec(t, "u:{id}", "SELECT id, size_fails(note) FROM things WHERE id = ANY($1::bigint[])")
		s.MaxValueBytes = 50
		rs, err := src.Load(ctx, s, []string{"1", "2", "3"})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			switch r.Member {
			case "1":
				if r.Err != nil || string(r.Value) != "ok" {
					t.Errorf("member 1: %q %v", r.Value, r.Err)
				}
			default:
				if r.Err == nil || r.Value != nil || !strings.Contains(r.Err.Error(), "sizes unreadable") {
					t.Errorf("member %s: %q %v, want the sizes query's error", r.Member, r.Value, r.Err)
				}
			}
		}
	})
}
