package warmer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/origintest"
	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/sources/protect"
	"github.com/hearth-dev/hearth/warmer"
)

// TestPostgresDownMidRun stops the PostgreSQL server under a running warmer:
// the values stay readable and untouched, kept alive by stale extensions, until
// max_stale after their last good load and not longer; the breaker opens; when
// the server is back, refreshes resume on their own.
func TestPostgresDownMidRun(t *testing.T) {
	origintest.NoLeaks(t)
	r := testenv.Redis(t)
	pgs := testenv.PrivatePostgres(t)
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, pgs.DSN())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE TABLE items (id text PRIMARY KEY, body text NOT NULL)`)
	exec(`INSERT INTO items VALUES ('1', 'one'), ('2', 'two'), ('3', 'three')`)

	s := decl(t, "item", r.Prefix+"item:{id}", "db")
	s.Members, s.Query = []string{"1", "2", "3"}, `SELECT id, body FROM items WHERE id = ANY($1)`
	s.MaxStale = 6 * time.Second
	greg := prometheus.NewRegistry()
	guard := protect.Guard(pgSource(t, pgs.DSN()), protect.GuardConfig{Name: "db", Retries: 1, RetryBackoff: 50 * time.Millisecond,
		BreakerFailures: 3, BreakerOpenFor: 3 * time.Second, Metrics: protect.NewGuardMetrics(greg)})
	rg := newRig(t, r.Client, r.Prefix, map[string]warmer.Source{"db": guard}, s)
	sched, err := jobs.New(jobs.Options{Refresher: rg.w, Specs: []*warmer.Spec{s}, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := sched.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sched.Close(ctx); err != nil {
			t.Error(err)
		}
	}()

	t0 := time.Now()
	if _, err := rg.w.Refresh(ctx, "item", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	pgs.Stop(t)
	stopped := time.Now() // the last good load happened before this

	want := map[string]string{"1": "one", "2": "two", "3": "three"}
	key := func(m string) string { return r.Prefix + "item:" + m }
	var gone time.Time
	for gone.IsZero() {
		now := time.Now()
		for m, v := range want {
			got, ok := get(t, r.Client, key(m))
			switch {
			case ok && got != v:
				t.Fatalf("%s = %q while PostgreSQL is down, want %q untouched", key(m), got, v)
			case !ok && now.Before(t0.Add(s.MaxStale-100*time.Millisecond)):
				t.Fatalf("%s expired %s after its last good load, before max_stale %s", key(m), now.Sub(t0), s.MaxStale)
			case !ok && gone.IsZero():
				gone = now
			}
		}
		if now.After(stopped.Add(s.MaxStale + 2*time.Second)) {
			t.Fatalf("values still readable %s after PostgreSQL stopped (max_stale %s)", now.Sub(stopped), s.MaxStale)
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Logf("values readable for %s after their last good load (ttl %s, max_stale %s)", gone.Sub(t0).Round(time.Millisecond), s.TTL, s.MaxStale)
	if got := promtest.Sum(t, rg.reg, "hearth_stale_extensions_total", "family", "item"); got < 3 {
		t.Errorf("hearth_stale_extensions_total = %g, want >= 3", got)
	}
	if got := promtest.Sum(t, rg.reg, "hearth_staleness_seconds", "family", "item"); got < 2 {
		t.Errorf("hearth_staleness_seconds = %g, want >= 2", got)
	}
	if got := promtest.Sum(t, greg, "hearth_origin_rejected_total", "source", "db", "reason", "breaker_open"); got < 1 {
		t.Errorf("hearth_origin_rejected_total{reason=breaker_open} = %g: the breaker never opened", got)
	}

	pgs.Start(t)
	exec(`UPDATE items SET body = 'uno' WHERE id = '1'`)
	testenv.Eventually(t, 10*time.Second, "refreshes resume when PostgreSQL is back", func() bool {
		v, _ := get(t, r.Client, key("1"))
		w, _ := get(t, r.Client, key("2"))
		return v == "uno" && w == "two"
	})
	testenv.Eventually(t, 5*time.Second, "the breaker closes", func() bool {
		return promtest.Sum(t, greg, "hearth_origin_breaker_state", "source", "db") == 0
	})
}
