package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/warmer"
)

// TestExplainFlagsTheCast explains family queries against 100,000 products
// (bigint id, 512-byte payload), bound as loads bind them: the cast form the
// README once taught seq-scans and is flagged, naming the declaration and
// the typed form; the typed array uses the primary key and is not flagged;
// a small table is not flagged whatever its plan. Each query also loads, so
// the typed form is known to work with members bound as text[].
func TestExplainFlagsTheCast(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `
		CREATE TABLE products (id bigint PRIMARY KEY, payload text NOT NULL);
		INSERT INTO products SELECT i, repeat(md5(i::text), 16) FROM generate_series(1, 100000) i;
		CREATE TABLE tiny (id bigint PRIMARY KEY, payload text NOT NULL);
		INSERT INTO tiny SELECT i, 'x' FROM generate_series(1, 50) i;
		ANALYZE products; ANALYZE tiny;`); err != nil {
		t.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN, MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)

	for _, tc := range []struct {
		name, query string
		flagged     bool
	}{
		{"cast", "SELECT id::text, payload FROM products WHERE id::text = ANY($1)", true},
		{"typed", "SELECT id::text, payload FROM products WHERE id = ANY($1::bigint[])", false},
		{"tiny cast", "SELECT id::text, payload FROM tiny WHERE id::text = ANY($1)", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp, err := keytmpl.Parse("p:{id}")
			if err != nil {
				t.Fatal(err)
			}
			s := &warmer.Spec{Name: "product", Template: tp, Query: tc.query, BatchSize: 1000, MaxMembers: 100000}
			sample := postgres.ExplainSample(s)
			if len(sample) != 1000 {
				t.Fatalf("sample of %d members, want a batch of 1000", len(sample))
			}
			fs, err := src.Explain(ctx, s, sample, 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(fs) > 0; got != tc.flagged {
				t.Fatalf("flagged = %v (%v), want %v", got, fs, tc.flagged)
			}
			if tc.flagged {
				f := fs[0]
				if f.Declaration != "product" || f.Relation != "public.products" && !strings.HasSuffix(f.Relation, ".products") {
					t.Errorf("finding names %q / %q, want product / products", f.Declaration, f.Relation)
				}
				if f.Rows < 90000 {
					t.Errorf("rows %d, want about 100000", f.Rows)
				}
				for _, want := range []string{"keys[product].query", "Seq Scan on", "id = ANY($1::bigint[])", "cast on the column"} {
					if !strings.Contains(f.String(), want) {
						t.Errorf("finding %q lacks %q", f.String(), want)
					}
				}
			}
			rs, err := src.Load(ctx, s, []string{"7", "49"})
			if err != nil || len(rs) != 2 {
				t.Fatalf("load: %v, %d results", err, len(rs))
			}
		})
	}

	t.Run("never analysed", func(t *testing.T) {
		if _, err := pg.Pool.Exec(ctx, `CREATE TABLE fresh (id text, payload text);
			INSERT INTO fresh SELECT i::text, repeat('y', 200) FROM generate_series(1, 60000) i`); err != nil {
			t.Fatal(err)
		}
		tp, _ := keytmpl.Parse("f:{id}")
		s := &warmer.Spec{Name: "fresh", Template: tp, Query: "SELECT id, payload FROM fresh WHERE id = ANY($1)", BatchSize: 10, Members: []string{"1", "2"}}
		fs, err := src.Explain(ctx, s, postgres.ExplainSample(s), 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(fs) != 1 {
			t.Fatalf("findings %v, want the seq scan of an unindexed 60,000-row table", fs)
		}
		if !strings.Contains(fs[0].Advice, "no index") {
			t.Errorf("advice %q, want the no-index advice", fs[0].Advice)
		}
	})

	t.Run("a query that does not plan", func(t *testing.T) {
		tp, _ := keytmpl.Parse("p:{id}")
		s := &warmer.Spec{Name: "bad", Template: tp, Query: "SELECT id, payload FROM nowhere WHERE id = ANY($1)"}
		if _, err := src.Explain(ctx, s, []string{"1"}, 0); err == nil || !strings.Contains(err.Error(), "keys[bad].query") {
			t.Errorf("err = %v, want one naming keys[bad].query", err)
		}
	})
}
