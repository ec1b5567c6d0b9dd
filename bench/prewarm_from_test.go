package bench_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// BenchmarkPrewarmFrom measures a blue-green pre-warm of 100,000 keys of 512
// bytes (BENCH_FROM_KEYS to change the count) into an empty Redis, from
// another, for three topologies (sub-benchmarks): a single node into a single
// node (two private servers), a 3-master Cluster into another (3 masters and
// 3 replicas each), and a single node into a Cluster:
//
//	(o) today's `hearth prewarm` of the same target from the origin
//	    (PostgreSQL); the source is filled the same way before each round,
//	    as a leader would have filled it (not measured);
//	(f) `hearth prewarm --from <source> --from-only`, with the origin's DSN
//	    pointing at a closed port (so not one origin query can be made; the
//	    access log, in a second source, is read: the stored ranking);
//	(r) the ceiling: a raw copy loop given the key list, pipelined GET + PTTL
//	    from the source and SET … PX into the target in chunks of 1,000 with
//	    4 workers, in this process (go-redis's Cluster pipelines on a Cluster).
//
// Each runs three times, best counts. Targets: f ≥ 0.9 × r, f ≥ 3 × o.
func BenchmarkPrewarmFrom(b *testing.B) {
	n := prewarmKeys
	if s := os.Getenv("BENCH_FROM_KEYS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			b.Fatalf("BENCH_FROM_KEYS=%q: want a positive count", s)
		}
		n = v
	}
	pg := testenv.Postgres(b)
	prefix := "bg:"
	setupPrewarmData(b, pg.Pool, prefix)
	ctx := context.Background()
	if n < prewarmKeys {
		// Keep the n hottest in the access log.
		if _, err := pg.Pool.Exec(ctx, `DELETE FROM hearth_access_log WHERE hits <= $1`, prewarmKeys+1-n-1); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := accesslog.New(pg.Pool).Rank(ctx, time.Hour, n); err != nil {
		b.Fatal(err)
	}
	node := func(b *testing.B) fromEnd {
		s := testenv.PrivateRedis(b)
		return fromEnd{addr: s.Addr, url: fmt.Sprintf("redis://%s/0", s.Addr), client: s.Client(b)}
	}
	cluster := func(b *testing.B) fromEnd {
		c := testenv.RedisCluster(b)
		return fromEnd{addr: c.Addrs()[0], url: "redis+cluster://" + strings.Join(c.Addrs(), ","), client: c.Client(b)}
	}
	for _, tc := range []struct {
		name     string
		src, dst func(*testing.B) fromEnd
	}{
		{"node_to_node", node, node},
		{"cluster_to_cluster", cluster, cluster},
		{"node_to_cluster", node, cluster},
	} {
		b.Run(tc.name, func(b *testing.B) {
			prewarmFrom(b, pg, tc.name, tc.src(b), tc.dst(b), prefix, n)
		})
	}
}

// fromEnd is one side of a blue-green copy: an address for the config, the
// URL hearth's flags take, and a client for the checks and the ceiling.
type fromEnd struct {
	addr, url string
	client    redis.UniversalClient
}

// prewarmFrom runs (o), (f) and (r) of BenchmarkPrewarmFrom from src into dst
// and prints them.
func prewarmFrom(b *testing.B, pg *testenv.PostgresEnv, topology string, src, dst fromEnd, prefix string, n int) {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
	}
	keyOf := func(id string) string { return prefix + "item:" + id }
	bin := e2e.Binary(b)
	dir := b.TempDir()
	originCfg := writeFromConfig(b, dir, "origin.yaml", pg.DSN, pg.DSN, src.addr, prefix, n)
	downCfg := writeFromConfig(b, dir, "down.yaml", "postgres://root@"+e2e.FreeAddr(b)+"/test?connect_timeout=2", pg.DSN, src.addr, prefix, n)
	run := func(args ...string) time.Duration {
		b.Helper()
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			b.Fatalf("hearth %v: %v\n%s", args, err, out)
		}
		if os.Getenv("BENCH_VERBOSE") != "" {
			fmt.Printf("%s\n", out)
		}
		if args[len(args)-1] == "--from-only" && !strings.Contains(string(out), fmt.Sprintf("copied                %d ", n)) {
			b.Fatalf("the copy did not copy every key:\n%s", out)
		}
		return summaryDuration(b, string(out))
	}
	for b.Loop() {
		var origin, from, raw time.Duration
		best := func(cur *time.Duration, d time.Duration) {
			if *cur == 0 || d < *cur {
				*cur = d
			}
		}
		for round := range 3 {
			// The source is filled from the origin, as a leader keeps it
			// (not measured).
			clearKeys(b, src.client, ids, keyOf)
			run("prewarm", "--config", originCfg, "--redis", src.url, "--top", strconv.Itoa(n))
			checkKeys(b, src.client, ids, keyOf)
			steps := []func(){
				func() {
					// (o) today's pre-warm of the same target, from the origin.
					clearKeys(b, dst.client, ids, keyOf)
					best(&origin, run("prewarm", "--config", originCfg, "--redis", dst.url, "--top", strconv.Itoa(n)))
					checkKeys(b, dst.client, ids, keyOf)
				},
				func() {
					clearKeys(b, dst.client, ids, keyOf)
					best(&from, run("prewarm", "--config", downCfg, "--redis", dst.url, "--from", src.url, "--top", strconv.Itoa(n), "--from-only"))
					checkKeys(b, dst.client, ids, keyOf)
				},
				func() {
					clearKeys(b, dst.client, ids, keyOf)
					best(&raw, rawCopy(b, src.client, dst.client, ids, keyOf))
					checkKeys(b, dst.client, ids, keyOf)
				},
			}
			if round%2 == 1 {
				slices.Reverse(steps)
			}
			for _, s := range steps {
				s()
			}
		}
		rate := func(d time.Duration) float64 { return float64(n) / d.Seconds() }
		o, f, r := rate(origin), rate(from), rate(raw)
		fmt.Printf("\nblue-green pre-warm of %d keys x %d-byte values into an empty Redis from another, %s (GOMAXPROCS %d)\n", n, prewarmValue, topology, runtime.GOMAXPROCS(0))
		fmt.Printf("  (o) hearth prewarm from the origin        %7.0f keys/s  %s\n", o, origin.Round(time.Millisecond))
		fmt.Printf("  (f) hearth prewarm --from --from-only     %7.0f keys/s  %s (origin unreachable: 0 origin queries)\n", f, from.Round(time.Millisecond))
		fmt.Printf("  (r) raw pipelined GET+PTTL / SET copy     %7.0f keys/s  %s\n", r, raw.Round(time.Millisecond))
		fmt.Printf("  f/r = %.2f (target >= 0.9)   f/o = %.1f (target >= 3)\n\n", f/r, f/o)
		b.ReportMetric(f, "from-keys/s")
		b.ReportMetric(o, "origin-keys/s")
		b.ReportMetric(r, "raw-keys/s")
		b.ReportMetric(f/r, "f/r")
		b.ReportMetric(f/o, "f/o")
	}
}

// rawCopy is the ceiling: pipelined GET + PTTL from src, SET … PX into dst,
// chunks of prewarmChunk, 4 workers.
func rawCopy(b *testing.B, src, dst redis.UniversalClient, ids []string, keyOf func(string) string) time.Duration {
	b.Helper()
	ctx := context.Background()
	t0 := time.Now()
	chunks := make(chan []string)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range chunks {
				p := src.Pipeline()
				gets := make([]*redis.StringCmd, len(c))
				ttls := make([]*redis.DurationCmd, len(c))
				for i, id := range c {
					gets[i], ttls[i] = p.Get(ctx, keyOf(id)), p.PTTL(ctx, keyOf(id))
				}
				if _, err := p.Exec(ctx); err != nil {
					errs <- err
					return
				}
				w := dst.Pipeline()
				for i, id := range c {
					v, _ := gets[i].Bytes()
					w.Set(ctx, keyOf(id), v, ttls[i].Val())
				}
				if _, err := w.Exec(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := 0; i < len(ids); i += prewarmChunk {
		chunks <- ids[i:min(i+prewarmChunk, len(ids))]
	}
	close(chunks)
	wg.Wait()
	d := time.Since(t0)
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	return d
}

// writeFromConfig is the benchmark's config: the origin in dsn, the access
// log (with the stored ranking) in logDSN.
func writeFromConfig(b *testing.B, dir, name, dsn, logDSN, redisAddr, prefix string, n int) string {
	b.Helper()
	cfg := fmt.Sprintf(`
redis: {addrs: [%q], namespace: "bench-from"}
log: {level: warn, format: json}
refresh: {max_concurrent_loads: 8}
sources:
  - {name: items, type: postgres, dsn: %q, max_conns: 8, rate: 0}
  - {name: logs, type: postgres, dsn: %q}
access_log: {source: logs}
prewarm: {top_n: %d, concurrency: 4, rate: 0}
keys:
  - name: item
    key: %q
    source: items
    ttl: %s
    batch_size: %d
    param_pattern: "[0-9]{1,9}"
    members: ["1"]
    query: "SELECT id::text, v FROM items WHERE id = ANY($1::bigint[])"
`, redisAddr, dsn, logDSN, n, prefix+"item:{id}", prewarmTTL, prewarmChunk)
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		b.Fatal(err)
	}
	return path
}
