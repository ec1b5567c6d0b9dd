package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/warmer"
)

// TestVersionColumn: the declaration's version column comes back with each
// value, as an integer (bigint, xmin::text::bigint) or a timestamp in
// microseconds; NULL fails the member, a wrong name or type the batch.
func TestVersionColumn(t *testing.T) {
	src, pg := setup(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `
		CREATE TABLE vers (id bigint PRIMARY KEY, name text, version bigint, updated_at timestamptz, label text);
		INSERT INTO vers VALUES (1, 'one', 7, '2026-01-02 03:04:05.123456+00', 'x'), (2, 'two', NULL, NULL, 'y');`); err != nil {
		t.Fatal(err)
	}
	load := func(query, col string, members ...string) (map[string]warmer.Result, error) {
		s := spec(t, "v:{id}", query)
		s.VersionColumn = col
		rs, err := src.Load(ctx, s, members)
		by := map[string]warmer.Result{}
		for _, r := range rs {
			by[r.Member] = r
		}
		return by, err
	}
	t.Run("bigint", func(t *testing.T) {
		by, err := load(`SELECT id::text, name, version FROM vers WHERE id = ANY($1::bigint[])`, "version", "1", "2")
		if err != nil {
			t.Fatal(err)
		}
		if r := by["1"]; r.Err != nil || !r.HasVersion || r.Version != 7 || string(r.Value) != "one" {
			t.Errorf("member 1 = %+v, want one at version 7", r)
		}
		if r := by["2"]; r.Err == nil || !errors.Is(r.Err, warmer.ErrBadPayload) {
			t.Errorf("member 2 (NULL version) = %+v, want a bad payload error", r)
		}
	})
	t.Run("timestamptz", func(t *testing.T) {
		by, err := load(`SELECT id::text, name, updated_at FROM vers WHERE id = ANY($1::bigint[])`, "updated_at", "1")
		if err != nil {
			t.Fatal(err)
		}
		want := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC).UnixMicro()
		if r := by["1"]; r.Err != nil || r.Version != want {
			t.Errorf("member 1 = %+v, want version %d", r, want)
		}
	})
	t.Run("xmin", func(t *testing.T) {
		by, err := load(`SELECT id::text, name, xmin::text::bigint AS xmin FROM vers WHERE id = ANY($1::bigint[])`, "xmin", "1")
		if err != nil {
			t.Fatal(err)
		}
		if r := by["1"]; r.Err != nil || r.Version <= 0 {
			t.Errorf("member 1 = %+v, want a positive xmin", r)
		}
	})
	t.Run("single key", func(t *testing.T) {
		s := spec(t, "v:one", `SELECT name, version FROM vers WHERE id = 1`)
		s.VersionColumn = "version"
		rs, err := src.Load(ctx, s, nil)
		if err != nil || len(rs) != 1 || rs[0].Version != 7 || string(rs[0].Value) != "one" {
			t.Errorf("single key = %+v, %v, want one at version 7", rs, err)
		}
	})
	for name, tc := range map[string]struct{ query, col, want string }{
		"wrong name": {`SELECT id::text, name, version FROM vers WHERE id = ANY($1::bigint[])`, "updated_at", `last column is "version", not "updated_at"`},
		"wrong type": {`SELECT id::text, name, label FROM vers WHERE id = ANY($1::bigint[])`, "label", "must be bigint, integer, timestamptz or timestamp"},
		"missing":    {`SELECT id::text, name FROM vers WHERE id = ANY($1::bigint[])`, "version", "must return 3 column(s) (member, value, version)"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := load(tc.query, tc.col, "1")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
