package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/store"
)

// BenchmarkVersionedWriteRedisCost measures, on a private Redis, what the
// version-checked write costs Redis per key: its CPU time (INFO cpu, the
// whole process) and the scripts' time (INFO commandstats, evalsha usec),
// for values changed (value and record written) and unchanged (same version
// and bytes: the conditional extend). 1,000 keys of 256 bytes per pipelined
// batch, 100 batches each. Redis's own accounting, so the CPU figure depends
// little on the client or on the other work of the machine. Beside them, the
// writer's own CPU per key (getrusage of this process), and the reference:
// the same keys written as pipelined SET … PX, no fence and no check.
func BenchmarkVersionedWriteRedisCost(b *testing.B) {
	srv := testenv.PrivateRedis(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer client.Close()
	ctx := context.Background()
	ns := "hearth"
	fs := fence.NewFencedStore(fence.FencedStoreOptions{Client: client, Namespace: ns, Registerer: prometheus.NewRegistry()})
	l, err := leader.NewLease(leader.LeaseOptions{Client: client, Namespace: ns, Duration: time.Minute, Fence: fs, Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = l.Close(context.Background()) }()
	term, err := l.Campaign(ctx)
	if err != nil {
		b.Fatal(err)
	}
	w := fs.Writer(term)
	const keys, batches = 1000, 100
	evalUsec := func() float64 {
		info := client.Info(ctx, "commandstats").Val()
		for _, line := range strings.Split(info, "\n") {
			if !strings.HasPrefix(line, "cmdstat_evalsha:") {
				continue
			}
			for _, f := range strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "cmdstat_evalsha:")), ",") {
				if v, ok := strings.CutPrefix(f, "usec="); ok {
					n, _ := strconv.ParseFloat(v, 64)
					return n
				}
			}
		}
		return 0
	}
	// cpuSec is the Redis process's CPU time (user + system): unlike the
	// command's wall time it does not grow when other work preempts Redis.
	cpuSec := func() float64 {
		sum := 0.0
		for _, line := range strings.Split(client.Info(ctx, "cpu").Val(), "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
				n, _ := strconv.ParseFloat(v, 64)
				sum += n
			}
		}
		return sum
	}
	// selfSec is this process's CPU time (user + system): the writer's cost,
	// which its waits for Redis do not count.
	selfSec := func() float64 {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	names := make([]string, keys)
	for i := range names {
		names[i] = "k:" + strconv.Itoa(i)
	}
	entries := make([]store.Entry, keys)
	var seq int64
	type cost struct{ script, redis, client float64 } // µs per key
	run := func(change bool) cost {
		u0, c0, s0 := evalUsec(), cpuSec(), selfSec()
		for range batches {
			seq++
			// Above every version of the changed runs: the first unchanged
			// round writes, the others extend.
			v, ver := []byte(strings.Repeat("x", 240)+fmt.Sprintf("%016d", 0)), int64(1)<<40
			if change {
				v, ver = []byte(strings.Repeat("x", 240)+fmt.Sprintf("%016d", seq)), seq
			}
			for i := range entries {
				entries[i] = store.Entry{Key: names[i], Value: v, TTL: time.Minute,
					Seq: seq, Versioned: true, Version: ver, VersionTTL: 2 * time.Minute, Family: "bench"}
			}
			if err := w.Set(ctx, entries); err != nil {
				b.Fatal(err)
			}
		}
		n := float64(keys * batches)
		return cost{(evalUsec() - u0) / n, (cpuSec() - c0) * 1e6 / n, (selfSec() - s0) * 1e6 / n}
	}
	// plain is the reference: the same keys and values written as one
	// pipeline of SET … PX per batch, no fence and no version check.
	plain := func() cost {
		c0, s0 := cpuSec(), selfSec()
		v := []byte(strings.Repeat("x", 256))
		for range batches {
			pipe := client.Pipeline()
			for _, k := range names {
				pipe.Set(ctx, k, v, time.Minute)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
		n := float64(keys * batches)
		return cost{0, (cpuSec() - c0) * 1e6 / n, (selfSec() - s0) * 1e6 / n}
	}
	for range b.N {
		changed := run(true)
		_ = run(false) // the first round writes the unchanged value once
		client.ConfigResetStat(ctx)
		same := run(false)
		if testing.Verbose() {
			fmt.Println(client.Info(ctx, "commandstats").Val())
		}
		ref := plain()
		b.ReportMetric(changed.redis*1000, "changed-redis-cpu-ns/key")
		b.ReportMetric(same.redis*1000, "extend-redis-cpu-ns/key")
		b.ReportMetric(same.client*1000, "extend-client-cpu-ns/key")
		fmt.Printf("\nversion-checked writes per key (1,000 keys × 100 batches, 256-byte values), CPU in µs:\n"+
			"  %-34s %8s %8s %8s\n  %-34s %8.2f %8.2f %8.2f\n  %-34s %8.2f %8.2f %8.2f\n  %-34s %8s %8.2f %8.2f\n",
			"", "script", "Redis", "writer",
			"values changed", changed.script, changed.redis, changed.client,
			"unchanged (conditional extend)", same.script, same.redis, same.client,
			"reference: pipelined SET … PX", "-", ref.redis, ref.client)
	}
}
