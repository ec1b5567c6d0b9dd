package bench

import (
	"context"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/sources/protect"
	"github.com/hearth-dev/hearth/warmer"
)

// memSource answers every member at once, so that the benchmark measures the
// origin protection itself.
type memSource struct{ rs []warmer.Result }

func (m memSource) Load(context.Context, *warmer.Spec, []string) ([]warmer.Result, error) {
	return m.rs, nil
}

func (memSource) Ping(context.Context) error { return nil }

// BenchmarkGuardOverhead prints what the origin protection (call slot, rate
// limiter, breaker bookkeeping, retry classification of every member) adds to
// one load of a 500-member batch, against the same load unguarded.
func BenchmarkGuardOverhead(b *testing.B) {
	tp, err := keytmpl.Parse("p:{id}")
	if err != nil {
		b.Fatal(err)
	}
	spec := &warmer.Spec{Name: "p", Template: tp}
	src := memSource{rs: make([]warmer.Result, 500)}
	guarded := protect.Guard(src, protect.GuardConfig{Name: "mem", MaxInFlight: 4, Rate: 1e9, Burst: 4, Retries: 2,
		RetryBackoff: 100 * time.Millisecond, BreakerFailures: 5, BreakerOpenFor: 30 * time.Second})
	for _, c := range []struct {
		name string
		src  warmer.Source
	}{{"direct", src}, {"guarded", guarded}} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.src.Load(ctx, spec, nil); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
