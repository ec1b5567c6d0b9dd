package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/sourcetest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/warmer"
)

// TestConformance runs the Source conformance suite on a real PostgreSQL:
// a table of the test's values, and the query's own pg_sleep for a slow origin.
func TestConformance(t *testing.T) {
	sourcetest.Conformance(t, sourcetest.Backend{
		Name: "db",
		New: func(t *testing.T, values map[string][]byte, delay time.Duration) (warmer.Source, *warmer.Spec) {
			query := "SELECT id, body FROM items WHERE id = ANY($1)"
			if delay > 0 {
				query = fmt.Sprintf("SELECT id, body FROM items, pg_sleep(%g) WHERE id = ANY($1)", delay.Seconds())
			}
			return itemsSource(t, values), spec(t, "item:{id}", query)
		},
		Single: func(t *testing.T, value []byte) (warmer.Source, *warmer.Spec) {
			values := map[string][]byte{"other": []byte("not this one")}
			if value != nil {
				values["single"] = value
			}
			return itemsSource(t, values), spec(t, "single", "SELECT body FROM items WHERE id = 'single'")
		},
		Down: func(t *testing.T) (warmer.Source, *warmer.Spec) {
			src, err := postgres.New(postgres.Config{Name: "db", DSN: "postgres://postgres@" + e2e.FreeAddr(t) + "/test?sslmode=disable&connect_timeout=2"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(src.Close)
			return src, spec(t, "item:{id}", "SELECT id, body FROM items WHERE id = ANY($1)")
		},
	})
}

// itemsSource is a source on a table items (id text, body bytea) that holds
// exactly values.
func itemsSource(t *testing.T, values map[string][]byte) *postgres.Source {
	t.Helper()
	pg := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `CREATE TABLE items (id text PRIMARY KEY, body bytea)`); err != nil {
		t.Fatal(err)
	}
	for m, v := range values {
		if _, err := pg.Pool.Exec(ctx, `INSERT INTO items VALUES ($1, $2)`, m, v); err != nil {
			t.Fatal(err)
		}
	}
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN, MaxConns: 2, StatementTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	return src
}
