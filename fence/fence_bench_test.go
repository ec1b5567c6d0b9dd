package fence_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/store"
)

// BenchmarkFencedSet measures fenced writes, 1,000 keys per pipelined batch,
// as a refresh run sends them: the price of the fence script (which reads
// Redis TIME and validates the fence on every write).
func BenchmarkFencedSet(b *testing.B) {
	env := testenv.Redis(b)
	ctx := context.Background()
	off := false
	fs := fence.NewFencedStore(fence.FencedStoreOptions{Client: env.Client, Namespace: env.Prefix + "hearth", PerSlot: &off, Registerer: prometheus.NewRegistry()})
	l, err := leader.NewLease(leader.LeaseOptions{Client: env.Client, Namespace: env.Prefix + "hearth", Duration: time.Minute, Fence: fs, Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = l.Close(context.Background()) }()
	term, err := l.Campaign(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = term.Release(ctx) }()
	w := fs.Writer(term)
	entries := make([]store.Entry, 1000)
	for i := range entries {
		entries[i] = store.Entry{Key: env.Prefix + "k:" + strconv.Itoa(i), Value: []byte("value"), TTL: time.Minute}
	}
	b.ResetTimer()
	for b.Loop() {
		if err := w.Set(ctx, entries); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(entries))/b.Elapsed().Seconds(), "keys/s")
}
