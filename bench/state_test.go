package bench_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/prewarm"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

const stateKeys = 200_000

// keyLog is an access log of generated keys: prefix + "item:" + start..start+n.
type keyLog struct {
	prefix string
	start  int
}

func (l keyLog) EachTopKey(ctx context.Context, _ time.Duration, n int, fn func(string)) error {
	for i := range n {
		if i%1000 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		fn(l.prefix + "item:" + strconv.Itoa(l.start+i))
	}
	return nil
}

// valueSource answers every member with a 64-byte value.
type valueSource struct{}

func (valueSource) Load(_ context.Context, _ *warmer.Spec, members []string) ([]warmer.Result, error) {
	out := make([]warmer.Result, len(members))
	v := make([]byte, 64)
	for i, m := range members {
		out[i] = warmer.Result{Member: m, Value: v}
	}
	return out, nil
}

func (valueSource) Ping(context.Context) error { return nil }

func heapMB() float64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}

// BenchmarkStateAfterPrewarms runs two pre-warms of 200,000 distinct access-log
// keys each (400,000 keys no declaration lists) into real Redis, with the
// default max_stale (10m) and a 1h TTL, and prints the live heap after each,
// the members /admin/status reports and the one-off state the warmer keeps.
// Before the bound, every key ever loaded stayed (two pre-warms of 1M keys:
// 107 → 227 MB, members 2,000,009); now at most warmer.MaxOneOffMembers
// (100,000) per declaration are kept, and the declared members are counted.
func BenchmarkStateAfterPrewarms(b *testing.B) {
	rd := testenv.Redis(b)
	tp, err := keytmpl.Parse(rd.Prefix + "item:{id}")
	if err != nil {
		b.Fatal(err)
	}
	spec := &warmer.Spec{
		Name: "item", Template: tp, Source: "src", TTL: time.Hour, Jitter: 0.1, Interval: 30 * time.Minute,
		LoadTimeout: 5 * time.Second, Members: []string{"0", "1", "2"}, BatchSize: 1000,
		NegativeTTL: time.Minute, NegativeValue: []byte{}, MaxStale: 10 * time.Minute,
	}
	for b.Loop() {
		reg := prometheus.NewRegistry()
		w, err := warmer.New(warmer.Options{Store: &store.RedisStore{Client: rd.Client},
			Sources: map[string]warmer.Source{"src": valueSource{}}, Specs: []*warmer.Spec{spec},
			MaxConcurrentLoads: 8, Registerer: reg, Logger: zerolog.Nop()})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		if _, err := w.Refresh(ctx, "item", warmer.RunOptions{}); err != nil {
			b.Fatal(err)
		}
		before := heapMB()
		heaps := make([]float64, 0, 2)
		pw := prewarm.New(w, reg, zerolog.Nop())
		for run := range 2 {
			rep, err := pw.Run(ctx, prewarm.Options{AccessLog: keyLog{prefix: rd.Prefix, start: 1000 + run*stateKeys},
				TopN: stateKeys, Window: time.Hour, Concurrency: 4, Reason: "bench"})
			if err != nil || rep.Written != stateKeys {
				b.Fatalf("pre-warm %d: written %d of %d: %v", run+1, rep.Written, stateKeys, err)
			}
			heaps = append(heaps, heapMB())
		}
		members := w.Status()[0].NumMembers
		oneOff := gatherGauge(b, reg, "hearth_warmer_state_members", "one_off")
		fmt.Printf("\nstate after two pre-warms of %d distinct undeclared keys (max_stale 10m, ttl 1h)\n", stateKeys)
		fmt.Printf("  live heap  %.1f MB before, %.1f MB after the first, %.1f MB after the second\n", before, heaps[0], heaps[1])
		fmt.Printf("  /admin/status members %d (3 declared); one-off state %g (bound %d)\n\n", members, oneOff, warmer.MaxOneOffMembers)
		b.ReportMetric(heaps[1], "heap-MB")
		b.ReportMetric(heaps[1]-before, "heap-growth-MB")
		b.ReportMetric(oneOff, "one-off-members")
		b.ReportMetric(float64(members), "status-members")
		runtime.KeepAlive(w)
	}
}

func gatherGauge(b *testing.B, reg *prometheus.Registry, name, kind string) float64 {
	b.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}
