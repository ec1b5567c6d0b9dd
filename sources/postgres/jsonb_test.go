package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/hearth-dev/hearth/warmer"
)

// TestJSONBValue: a jsonb value is cached as the JSON text the server writes
// for it — the same bytes pgx reads from a binary jsonb, which is what Hearth
// wrote before the wrapper converted it once per row — for a family, a
// versioned family and a single key; one over max_value_bytes fails alone.
func TestJSONBValue(t *testing.T) {
	src, pg := setup(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `
		CREATE TABLE jdocs (id bigint PRIMARY KEY, v jsonb NOT NULL, version bigint NOT NULL);
		INSERT INTO jdocs SELECT i, jsonb_build_object('id', i, 'name', 'n' || i, 'tags', jsonb_build_array('a', 'é', i), 'ok', i % 2 = 0, 'x', 1.50), 10 + i
			FROM generate_series(1, 5) i;
		INSERT INTO jdocs VALUES (6, jsonb_build_object('big', repeat('x', 300)), 16);`); err != nil {
		t.Fatal(err)
	}
	// What pgx gives for the column read in binary, as the ceiling reads it.
	want := map[string][]byte{}
	rows, err := pg.Pool.Query(ctx, `SELECT id::text, v FROM jdocs`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var (
			id string
			v  []byte
		)
		if err := rows.Scan(&id, &v); err != nil {
			t.Fatal(err)
		}
		want[id] = v
	}
	if rows.Close(); rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	members := []string{"1", "2", "3", "4", "5", "6", "404"}
	for _, versioned := range []bool{false, true} {
		s := spec(t, "j:{id}", `SELECT id::text, v FROM jdocs WHERE id = ANY($1::bigint[])`)
		if versioned {
			s = spec(t, "jv:{id}", `SELECT id::text, v, version FROM jdocs WHERE id = ANY($1::bigint[])`)
			s.VersionColumn = "version"
		}
		s.MaxValueBytes = 200
		rs, err := src.Load(ctx, s, members)
		if err != nil {
			t.Fatalf("versioned %t: %v", versioned, err)
		}
		got := map[string]warmer.Result{}
		for _, r := range rs {
			got[r.Member] = r
		}
		for _, m := range members[:5] {
			r := got[m]
			if r.Err != nil || string(r.Value) != string(want[m]) {
				t.Errorf("versioned %t, member %s: %q %v, want %q", versioned, m, r.Value, r.Err, want[m])
			}
			if versioned && (!r.HasVersion || r.Version != 10+int64(m[0]-'0')) {
				t.Errorf("member %s: version %d (has %t), want %d", m, r.Version, r.HasVersion, 10+int64(m[0]-'0'))
			}
		}
		if r := got["6"]; !errors.Is(r.Err, warmer.ErrTooLarge) || r.Value != nil {
			t.Errorf("versioned %t, member 6: %q %v, want ErrTooLarge", versioned, r.Value, r.Err)
		}
		if _, ok := got["404"]; ok {
			t.Errorf("versioned %t: a result for member 404, which has no row", versioned)
		}
	}
	one := spec(t, "j:one", `SELECT v FROM jdocs WHERE id = 3`)
	rs, err := src.Load(ctx, one, nil)
	if err != nil || len(rs) != 1 || rs[0].Err != nil || string(rs[0].Value) != string(want["3"]) {
		t.Errorf("single key = %+v, %v, want %q", rs, err, want["3"])
	}
}
