package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/migrations"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestUpDownUp applies, rolls back and re-applies the migrations in a schema of
// the test's own, checking the access-log table and Hearth's own version table.
func TestUpDownUp(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := stdlib.OpenDBFromPool(pg.Pool)
	defer db.Close()
	p, err := migrations.NewProvider(db)
	if err != nil {
		t.Fatal(err)
	}
	exists := func(table string) bool {
		t.Helper()
		var ok bool
		err := pg.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.tables WHERE table_schema = $1 AND table_name = $2)`,
			pg.Schema, table).Scan(&ok)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}

	t.Run("up", func(t *testing.T) {
		res, err := p.Up(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := len(res), len(p.ListSources()); got != want || want == 0 {
			t.Fatalf("applied %d migrations, want %d (> 0)", got, want)
		}
		for _, table := range []string{"hearth_access_log", "hearth_access_rank", "hearth_access_rank_info"} {
			if !exists(table) {
				t.Errorf("%s missing after up", table)
			}
		}
		if !exists(migrations.VersionTable) {
			t.Fatalf("version table %s missing", migrations.VersionTable)
		}
		if exists("goose_db_version") {
			t.Error("goose's default table was created: it belongs to the application")
		}
		var pk string
		err = pg.Pool.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint
			WHERE conrelid = 'hearth_access_log'::regclass AND contype = 'p'`).Scan(&pk)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := pk, "PRIMARY KEY (bucket, key)"; got != want {
			t.Errorf("primary key = %q, want %q (the window is a range of it)", got, want)
		}
	})
	t.Run("up again is a no-op", func(t *testing.T) {
		res, err := p.Up(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(res); got != 0 {
			t.Errorf("second up applied %d migrations, want 0", got)
		}
	})
	t.Run("down one", func(t *testing.T) {
		if _, err := p.Down(ctx); err != nil {
			t.Fatal(err)
		}
		if exists("hearth_access_rank") || exists("hearth_access_rank_info") {
			t.Error("the ranking tables are still there after down")
		}
		if !exists("hearth_access_log") {
			t.Error("down rolled back more than the last migration")
		}
	})
	t.Run("down to zero", func(t *testing.T) {
		if _, err := p.DownTo(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if exists("hearth_access_log") {
			t.Fatal("hearth_access_log still there after down to 0")
		}
	})
	t.Run("up after down", func(t *testing.T) {
		if _, err := p.Up(ctx); err != nil {
			t.Fatal(err)
		}
		for _, table := range []string{"hearth_access_log", "hearth_access_rank", "hearth_access_rank_info"} {
			if !exists(table) {
				t.Errorf("%s missing after up, down, up", table)
			}
		}
		v, err := p.GetDBVersion(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := v, int64(len(p.ListSources())); got != want {
			t.Errorf("version = %d, want %d", got, want)
		}
	})
}
