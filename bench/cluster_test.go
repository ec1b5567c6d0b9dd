package bench_test

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/daemon"
	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/rewarm"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// BenchmarkCluster prints, in one run, single node beside a local 3-master,
// 3-replica Redis Cluster (its six processes share this machine's cores with
// Hearth, PostgreSQL and the benchmark):
//
//	(1) `hearth prewarm` of 100,000 keys x 512 bytes (--redis redis+cluster://
//	    for the cluster): keys/s and the process's CPU;
//	(2) a pipeline of 1,000 SET … PX: go-redis's ClusterClient groups it by
//	    node (one round trip per master, in parallel), against one SET per
//	    round trip;
//	(3) one full refresh of a 100,000-member family, in process: keys/s and
//	    CPU of this process;
//	(4) the re-warm of one master's slots after a FLUSHALL of that master,
//	    detected by push: flush → every key of that master back.
//
// Run with `make bench`.
func BenchmarkCluster(b *testing.B) {
	pg := testenv.Postgres(b)
	rd := testenv.Redis(b)
	cl := testenv.RedisCluster(b)
	setupPrewarmData(b, pg.Pool, rd.Prefix)
	ids := make([]string, prewarmKeys)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
	}
	keyOf := func(id string) string { return rd.Prefix + "item:" + id }
	cfgPath := writePrewarmConfig(b, pg.DSN, rd.Addr, rd.Prefix)
	bin := e2e.Binary(b)
	cc := daemon.NewRedis(config.Redis{Addrs: cl.Addrs()}).(*redis.ClusterClient)
	b.Cleanup(func() { _ = cc.Close() })
	clusterURL := "redis+cluster://" + strings.Join(cl.Addrs(), ",")

	prewarm := func(target redis.UniversalClient, url string) (rate float64, cpu time.Duration) {
		b.Helper()
		clearAny(b, target, ids, keyOf)
		args := []string{"prewarm", "--config", cfgPath, "--top", strconv.Itoa(prewarmKeys)}
		if url != "" {
			args = append(args, "--redis", url)
		}
		cmd := exec.Command(bin, args...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("hearth prewarm: %v\n%s", err, out)
		}
		d := summaryDuration(b, string(out))
		if n := countAny(b, target, ids, keyOf); n != prewarmKeys {
			b.Fatalf("after hearth prewarm %d of %d keys present", n, prewarmKeys)
		}
		clearAny(b, target, ids, keyOf)
		return prewarmKeys / d.Seconds(), cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}

	for b.Loop() {
		fmt.Printf("\nRedis Cluster (3 masters + 3 replicas, local) beside a single node; GOMAXPROCS %d, all processes on this machine\n", runtime.GOMAXPROCS(0))

		// (1) pre-warm through the CLI.
		sRate, sCPU := prewarm(rd.Client, "")
		cRate, cCPU := prewarm(cc, clusterURL)
		fmt.Printf("  (1) hearth prewarm, %d keys x %d B   single %7.0f keys/s (CPU %s)   cluster %7.0f keys/s (CPU %s)\n",
			prewarmKeys, prewarmValue, sRate, sCPU.Round(time.Millisecond), cRate, cCPU.Round(time.Millisecond))

		// (2) pipelining.
		single, cluster, perKey := pipelineRates(b, rd.Client, cc, rd.Prefix)
		fmt.Printf("  (2) 1,000 SET PX per pipeline        single %7.0f keys/s   cluster %7.0f keys/s   cluster one SET per round trip %6.0f keys/s\n",
			single, cluster, perKey)

		// (3) refresh of a large family, in process.
		sRef, sRefCPU := refreshFamily(b, rd.Client, pg.DSN, keyOf("{id}"))
		cRef, cRefCPU := refreshFamily(b, cc, pg.DSN, keyOf("{id}"))
		fmt.Printf("  (3) refresh of %d members            single %7.0f keys/s (CPU %s)   cluster %7.0f keys/s (CPU %s)\n",
			prewarmKeys, sRef, sRefCPU.Round(time.Millisecond), cRef, cRefCPU.Round(time.Millisecond))
		clearAny(b, rd.Client, ids, keyOf)

		// (4) one master's slots re-warmed after it lost its data.
		n, took := rewarmOneMaster(b, cl, cc, pg.DSN, keyOf("{id}"), ids, keyOf)
		fmt.Printf("  (4) FLUSHALL of one master: its %d keys back in %s (push detection, unpaced re-warm of its slots only)\n\n",
			n, took.Round(time.Millisecond))
		clearAny(b, cc, ids, keyOf)

		b.ReportMetric(sRate, "prewarm-single-keys/s")
		b.ReportMetric(cRate, "prewarm-cluster-keys/s")
		b.ReportMetric(cluster, "pipeline-cluster-keys/s")
		b.ReportMetric(cRef, "refresh-cluster-keys/s")
		b.ReportMetric(took.Seconds(), "master-rewarm-s")
	}
}

// pipelineRates writes 20 pipelines of 1,000 SET … PX to each target, and
// 2,000 SETs one round trip each to the cluster.
func pipelineRates(b *testing.B, single, cluster redis.UniversalClient, prefix string) (s, c, perKey float64) {
	b.Helper()
	ctx := context.Background()
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = prefix + "pipe:" + strconv.Itoa(i)
	}
	run := func(rdb redis.UniversalClient) float64 {
		t0 := time.Now()
		for range 20 {
			pipe := rdb.Pipeline()
			for _, k := range keys {
				pipe.Set(ctx, k, "v", time.Minute)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
		return 20 * 1000 / time.Since(t0).Seconds()
	}
	s, c = run(single), run(cluster)
	t0 := time.Now()
	for range 2 {
		for _, k := range keys {
			if err := cluster.Set(ctx, k, "v", time.Minute).Err(); err != nil {
				b.Fatal(err)
			}
		}
	}
	perKey = 2000 / time.Since(t0).Seconds()
	for _, rdb := range []redis.UniversalClient{single, cluster} {
		for _, k := range keys {
			rdb.Del(ctx, k)
		}
	}
	return s, c, perKey
}

// familyWarmer builds an in-process Warmer over the benchmark's items table:
// one family, every row a member, written unfenced to rdb.
func familyWarmer(b *testing.B, rdb redis.UniversalClient, dsn, key string) (*warmer.Warmer, *prometheus.Registry) {
	b.Helper()
	cfg, err := config.Parse("bench.yaml", []byte(fmt.Sprintf(`
sources: [{name: items, type: postgres, dsn: %q}]
refresh: {max_concurrent_loads: 8}
keys:
  - {name: item, key: %q, source: items, ttl: 10m, batch_size: 1000, param_pattern: "[0-9]{1,9}",
     members_query: "SELECT id FROM items", query: "SELECT id, v FROM items WHERE id = ANY($1)"}
`, dsn, key)))
	if err != nil {
		b.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "items", DSN: dsn, MaxConns: 8})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(src.Close)
	reg := prometheus.NewRegistry()
	w, err := warmer.New(warmer.Options{Store: &store.RedisStore{Client: rdb}, Sources: map[string]warmer.Source{"items": src},
		Specs: cfg.Specs(), MaxConcurrentLoads: 8, Registerer: reg, Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	return w, reg
}

// refreshFamily times one full refresh of the family, and this process's CPU.
func refreshFamily(b *testing.B, rdb redis.UniversalClient, dsn, key string) (float64, time.Duration) {
	b.Helper()
	w, _ := familyWarmer(b, rdb, dsn, key)
	cpu0 := selfCPU(b)
	t0 := time.Now()
	if err := w.RefreshAll(context.Background()); err != nil {
		b.Fatal(err)
	}
	d := time.Since(t0)
	return prewarmKeys / d.Seconds(), selfCPU(b) - cpu0
}

// selfCPU is this process's user+system CPU so far.
func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rewarmOneMaster warms the family on the cluster, FLUSHALLs one master and
// times until every key of that master is back, as a separate client sees it.
func rewarmOneMaster(b *testing.B, cl *testenv.Cluster, cc *redis.ClusterClient, dsn, key string, ids []string, keyOf func(string) string) (int, time.Duration) {
	b.Helper()
	ctx := context.Background()
	w, reg := familyWarmer(b, cc, dsn, key)
	if err := w.RefreshAll(ctx); err != nil {
		b.Fatal(err)
	}
	rw, err := rewarm.New(rewarm.Options{Client: cc, Namespace: "bench-rw", Interval: time.Hour, MinGap: time.Millisecond,
		Warmer: w, Registerer: reg})
	if err != nil {
		b.Fatal(err)
	}
	defer startRewarmer(b, rw)()
	waitTracked(b, cl)
	owners := cl.SlotOwners(b)
	m := owners[slot.Of(keyOf("1"))]
	var mine []string
	for _, id := range ids {
		if k := keyOf(id); owners[slot.Of(k)] == m {
			mine = append(mine, k)
		}
	}
	node := redis.NewClient(&redis.Options{Addr: m.Addr})
	defer node.Close()
	t0 := time.Now()
	if err := node.FlushAll(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	for missing := slices.Clone(mine); len(missing) > 0; {
		if time.Since(t0) > time.Minute {
			b.Fatalf("%d of %d keys not back after a minute", len(missing), len(mine))
		}
		pipe := node.Pipeline()
		cmds := make([]*redis.IntCmd, len(missing))
		for i, k := range missing {
			cmds[i] = pipe.Exists(ctx, k)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		var still []string
		for i, c := range cmds {
			if c.Val() == 0 {
				still = append(still, missing[i])
			}
		}
		missing = still
	}
	return len(mine), time.Since(t0)
}

func waitTracked(b *testing.B, cl *testenv.Cluster) {
	b.Helper()
	testenv.Eventually(b, 20*time.Second, "the push watch tracks every master", func() bool {
		for _, m := range cl.Masters(b) {
			c := redis.NewClient(&redis.Options{Addr: m.Addr})
			list, err := c.ClientList(context.Background()).Result()
			_ = c.Close()
			if err != nil || !strings.Contains(list, "flags=t") {
				return false
			}
		}
		return true
	})
}

// clearAny deletes the benchmark's keys on any kind of client (a Cluster
// pipeline routes each DEL to its slot).
func clearAny(b *testing.B, rdb redis.UniversalClient, ids []string, keyOf func(string) string) {
	b.Helper()
	ctx := context.Background()
	for i := 0; i < len(ids); i += 5000 {
		pipe := rdb.Pipeline()
		for _, id := range ids[i:min(i+5000, len(ids))] {
			pipe.Del(ctx, keyOf(id))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func countAny(b *testing.B, rdb redis.UniversalClient, ids []string, keyOf func(string) string) int {
	b.Helper()
	ctx := context.Background()
	n := 0
	for i := 0; i < len(ids); i += 5000 {
		pipe := rdb.Pipeline()
		cmds := make([]*redis.IntCmd, 0, 5000)
		for _, id := range ids[i:min(i+5000, len(ids))] {
			cmds = append(cmds, pipe.Exists(ctx, keyOf(id)))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		for _, c := range cmds {
			n += int(c.Val())
		}
	}
	return n
}
