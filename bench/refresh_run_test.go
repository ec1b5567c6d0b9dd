package bench

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/warmer"
)

// BenchmarkRefreshRun runs one refresh run of a 100,000-member family (a
// members query, a typed-array query, batches of 500) in process, through the
// fenced store under a lease term, as the leader's schedule does, unpaced; it
// prints keys/s, bytes and allocations per key. In process, so that
// `go test -cpuprofile/-memprofile` profiles the refresh path.
func BenchmarkRefreshRun(b *testing.B) {
	const members = 100_000
	ctx := context.Background()
	rd := testenv.Redis(b)
	pg := testenv.Postgres(b)
	if _, err := pg.Pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE run_members (id bigint PRIMARY KEY, v text NOT NULL);
		INSERT INTO run_members SELECT i, repeat('x', 64) || i FROM generate_series(1, %d) i;
		ANALYZE run_members;`, members)); err != nil {
		b.Fatal(err)
	}
	cfg, err := config.Parse("run.yaml", []byte(fmt.Sprintf(`
sources:
  - {name: db, type: postgres, dsn: %q}
refresh: {max_members: %d}
keys:
  - name: member
    key: %q
    source: db
    ttl: 60s
    members_query: "SELECT id::text FROM run_members"
    query: "SELECT id::text, v FROM run_members WHERE id = ANY($1::bigint[])"
`, pg.DSN, members+1, rd.Prefix+"m:{id}")))
	if err != nil {
		b.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN, MaxConns: 8})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	ns := rd.Prefix + "hearth"
	store := fence.NewFencedStore(fence.FencedStoreOptions{Client: rd.Client, Namespace: ns, Registerer: prometheus.NewRegistry()})
	l, err := leader.NewLease(leader.LeaseOptions{Client: rd.Client, Namespace: ns, Duration: time.Minute, Fence: store, Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = l.Close(context.Background()) }()
	term, err := l.Campaign(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = term.Release(ctx) }()
	w, err := warmer.New(warmer.Options{
		Store: store, Gate: store.Gate(l), Sources: map[string]warmer.Source{"db": src},
		Specs: cfg.Specs(), MaxConcurrentLoads: 8, Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop(),
	})
	if err != nil {
		b.Fatal(err)
	}
	// The first run lists the members; the measured runs reuse the listing,
	// as the schedule's runs do.
	if _, err := w.Refresh(ctx, "member", warmer.RunOptions{}); err != nil {
		b.Fatal(err)
	}
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	b.ResetTimer()
	for b.Loop() {
		out, err := w.Refresh(ctx, "member", warmer.RunOptions{})
		if err != nil || out.Written != members {
			b.Fatalf("written %d of %d: %v", out.Written, members, err)
		}
	}
	b.StopTimer()
	runtime.ReadMemStats(&m1)
	keys := float64(b.N * members)
	b.ReportMetric(keys/b.Elapsed().Seconds(), "keys/s")
	b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/keys, "B/key")
	b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/keys, "allocs/key")
	fmt.Printf("\nrefresh run of %d members (fenced, unpaced, in process): %.0f keys/s, %.0f B and %.1f allocations per key\n",
		members, keys/b.Elapsed().Seconds(), float64(m1.TotalAlloc-m0.TotalAlloc)/keys, float64(m1.Mallocs-m0.Mallocs)/keys)
}
