package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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
// little on the client or on the other work of the machine.
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
	var seq int64
	run := func(change bool) (cmdUsec, cpuUsec float64) {
		entries := make([]store.Entry, keys)
		u0, c0 := evalUsec(), cpuSec()
		for round := range batches {
			seq++
			// Above every version of the changed runs: the first unchanged
			// round writes, the others extend.
			v, ver := []byte(strings.Repeat("x", 240)+fmt.Sprintf("%016d", 0)), int64(1)<<40
			if change {
				v, ver = []byte(strings.Repeat("x", 240)+fmt.Sprintf("%016d", seq)), seq
			}
			_ = round
			for i := range entries {
				entries[i] = store.Entry{Key: "k:" + strconv.Itoa(i), Value: v, TTL: time.Minute,
					Seq: seq, Versioned: true, Version: ver, VersionTTL: 2 * time.Minute, Family: "bench"}
			}
			if err := w.Set(ctx, entries); err != nil {
				b.Fatal(err)
			}
		}
		return (evalUsec() - u0) / (keys * batches), (cpuSec() - c0) * 1e6 / (keys * batches)
	}
	for range b.N {
		changed, changedCPU := run(true)
		_, _ = run(false) // the first round writes the unchanged value once
		client.ConfigResetStat(ctx)
		same, sameCPU := run(false)
		if testing.Verbose() {
			fmt.Println(client.Info(ctx, "commandstats").Val())
		}
		b.ReportMetric(changedCPU*1000, "changed-redis-cpu-ns/key")
		b.ReportMetric(sameCPU*1000, "extend-redis-cpu-ns/key")
		fmt.Printf("\nversion-checked writes per key (1,000 keys × 100 batches, 256-byte values): values changed %.2f µs Redis CPU (%.2f µs in the script), unchanged (conditional extend) %.2f µs Redis CPU (%.2f µs in the script)\n",
			changedCPU, changed, sameCPU, same)
	}
}
