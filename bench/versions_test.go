package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/store"
)

// BenchmarkVersionedWrites compares, side by side in one run, the fenced write
// of a refresh without the version check (unstamped entries, as before
// version records existed), with it when every value changed (value and
// record written), and with it when no value changed (conditional extend: TTL
// only). 1,000 keys of 256 bytes per pipelined batch, 100 batches each.
func BenchmarkVersionedWrites(b *testing.B) {
	env := testenv.Redis(b)
	ctx := context.Background()
	ns := env.Prefix + "hearth"
	fs := fence.NewFencedStore(fence.FencedStoreOptions{Client: env.Client, Namespace: ns, Registerer: prometheus.NewRegistry()})
	l, err := leader.NewLease(leader.LeaseOptions{Client: env.Client, Namespace: ns, Duration: time.Minute, Fence: fs, Registerer: prometheus.NewRegistry()})
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
	const keys, batches = 1000, 100
	value := func(round int) []byte { return []byte(strings.Repeat("x", 240) + fmt.Sprintf("%016d", round)) }
	run := func(stamped, change bool) float64 {
		entries := make([]store.Entry, keys)
		var seq int64
		t0 := time.Now()
		for round := range batches {
			seq++
			v := value(0)
			if change {
				v = value(round)
			}
			for i := range entries {
				entries[i] = store.Entry{Key: env.Prefix + "k:" + strconv.Itoa(i), Value: v, TTL: time.Minute}
				if stamped {
					entries[i].Seq, entries[i].Versioned, entries[i].Version = seq, true, int64(round)
					entries[i].VersionTTL, entries[i].Family = 2*time.Minute, "bench"
				}
			}
			if err := w.Set(ctx, entries); err != nil {
				b.Fatal(err)
			}
		}
		return float64(keys*batches) / time.Since(t0).Seconds()
	}
	for range b.N {
		plain := run(false, true)
		changed := run(true, true)
		same := run(true, false)
		b.ReportMetric(plain, "plain-keys/s")
		b.ReportMetric(changed, "versioned-keys/s")
		b.ReportMetric(same, "extend-keys/s")
		fmt.Printf("\nfenced writes, %d keys × %d batches of 256-byte values: without version check %.0f keys/s; with it, values changed %.0f keys/s (%.0f%%); unchanged (conditional extend) %.0f keys/s (%.0f%%)\n",
			keys, batches, plain, changed, changed/plain*100, same, same/plain*100)
	}
}
