package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/hearth-dev/hearth/accesslog"
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
	tables := []string{"hearth_access_log", "hearth_access_rank", "hearth_access_rank_info", "hearth_access_rollup", "hearth_access_log_rejects"}
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
		for _, table := range tables {
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
	notifyFunc := func() bool {
		t.Helper()
		var ok bool
		if err := pg.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
			WHERE n.nspname = $1 AND p.proname = 'hearth_notify')`, pg.Schema).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	t.Run("down one drops the notify function", func(t *testing.T) {
		if !notifyFunc() {
			t.Fatal("hearth_notify() missing after up")
		}
		if _, err := p.Down(ctx); err != nil {
			t.Fatal(err)
		}
		if notifyFunc() {
			t.Error("hearth_notify() still there after down")
		}
		if !exists("hearth_access_log_rejects") {
			t.Error("down rolled back more than the last migration")
		}
	})
	t.Run("down one more", func(t *testing.T) {
		if _, err := p.Down(ctx); err != nil {
			t.Fatal(err)
		}
		if exists("hearth_access_log_rejects") {
			t.Error("the guard's rejects table is still there after down")
		}
		if !exists("hearth_access_rollup") {
			t.Error("down rolled back more than the last migration")
		}
	})
	t.Run("down to the ranking", func(t *testing.T) {
		if _, err := p.DownTo(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if exists("hearth_access_rank") || exists("hearth_access_rank_info") || exists("hearth_access_rollup") {
			t.Error("the ranking or roll-up tables are still there after down to 1")
		}
		if !exists("hearth_access_log") {
			t.Error("down to 1 rolled back the access log")
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
		for _, table := range tables {
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

// TestGuardLowersStoredCounts: the migration that adds the table's guard lowers
// counts stored before it above the bound, so that the documented upsert onto
// such a row cannot overflow a bigint.
func TestGuardLowersStoredCounts(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := stdlib.OpenDBFromPool(pg.Pool)
	defer db.Close()
	p, err := migrations.NewProvider(db)
	if err != nil {
		t.Fatal(err)
	}
	bucket := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := p.UpTo(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Pool.Exec(ctx, `INSERT INTO hearth_access_log VALUES ($1, 'k', 9223372036854775807)`, bucket); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Pool.Exec(ctx, accesslog.RecordSQL, bucket, []string{"k"}, []int64{1}); err != nil {
		t.Fatalf("upsert onto a count stored before the guard: %v", err)
	}
	var hits int64
	if err := pg.Pool.QueryRow(ctx, `SELECT hits FROM hearth_access_log WHERE key = 'k'`).Scan(&hits); err != nil {
		t.Fatal(err)
	}
	if got, want := hits, accesslog.MaxBucketHits; got != want {
		t.Errorf("hits = %d, want %d", got, want)
	}
}
