package bench

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strings"
	"syscall"
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
// prints keys/s, CPU, bytes and allocations per key. In process, so that
// `go test -cpuprofile/-memprofile` profiles the refresh path. Three
// declarations: plain (the bench config), shipped (a param_pattern, a 96-byte
// text payload, info logs as JSON, as config.yaml ships) and versioned (shipped
// with a version_column: every write version-checked).
func BenchmarkRefreshRun(b *testing.B) {
	const members = 100_000
	ctx := context.Background()
	rd := testenv.Redis(b)
	pg := testenv.Postgres(b)
	if _, err := pg.Pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE run_members (id bigint PRIMARY KEY, v text NOT NULL, p text NOT NULL);
		INSERT INTO run_members SELECT i, repeat('x', 64) || i, lpad(i::text, 96, 'x') FROM generate_series(1, %d) i;
		ANALYZE run_members;`, members)); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, decl string }{
		{"plain", `
    members_query: "SELECT id::text FROM run_members"
    query: "SELECT id::text, v FROM run_members WHERE id = ANY($1::bigint[])"`},
		{"shipped", `
    param_pattern: "[0-9]{1,12}"
    members_query: "SELECT id::text FROM run_members"
    query: "SELECT id::text, p FROM run_members WHERE id = ANY($1::bigint[])"`},
		{"versioned", `
    param_pattern: "[0-9]{1,12}"
    members_query: "SELECT id::text FROM run_members"
    query: "SELECT id::text, p, xmin::text::bigint AS ver FROM run_members WHERE id = ANY($1::bigint[])"
    version_column: ver`},
	} {
		b.Run(c.name, func(b *testing.B) {
			log := zerolog.Nop()
			if c.name != "plain" {
				log = zerolog.New(io.Discard).Level(zerolog.InfoLevel)
			}
			refreshRun(b, rd, pg, members, rd.Prefix+c.name+":m:{id}", c.decl, log)
		})
	}
}

func refreshRun(b *testing.B, rd *testenv.RedisEnv, pg *testenv.PostgresEnv, members int, key, decl string, log zerolog.Logger) {
	ctx := context.Background()
	cfg, err := config.Parse("run.yaml", []byte(fmt.Sprintf(`
sources:
  - {name: db, type: postgres, dsn: %q}
refresh: {max_members: %d}
keys:
  - name: member
    key: %q
    source: db
    ttl: 60s%s
`, pg.DSN, members+1, key, decl)))
	if err != nil {
		b.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN, MaxConns: 8})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	ns := rd.Prefix + "hearth" + strings.TrimSuffix(key, ":m:{id}")[len(rd.Prefix):]
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
		Specs: cfg.Specs(), MaxConcurrentLoads: 8, Registerer: prometheus.NewRegistry(), Logger: log,
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
	cpu0 := processCPU(b)
	b.ResetTimer()
	for b.Loop() {
		out, err := w.Refresh(ctx, "member", warmer.RunOptions{})
		if err != nil || out.Written != members {
			b.Fatalf("written %d of %d: %v", out.Written, members, err)
		}
	}
	b.StopTimer()
	cpu := processCPU(b) - cpu0
	runtime.ReadMemStats(&m1)
	keys := float64(b.N * members)
	b.ReportMetric(cpu.Seconds()*1e6/keys, "cpu-µs/key")
	b.ReportMetric(keys/b.Elapsed().Seconds(), "keys/s")
	b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/keys, "B/key")
	b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/keys, "allocs/key")
	fmt.Printf("\nrefresh run of %d members (%s, fenced, unpaced, in process): %.0f keys/s, %.2f µs CPU (this process), %.0f B and %.1f allocations per key\n",
		members, b.Name(), keys/b.Elapsed().Seconds(), cpu.Seconds()*1e6/keys, float64(m1.TotalAlloc-m0.TotalAlloc)/keys, float64(m1.Mallocs-m0.Mallocs)/keys)
}

// processCPU is the CPU time (user + system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
