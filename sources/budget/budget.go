// Package budget bounds the payload bytes that every load of a process holds
// at once (refresh.max_inflight_bytes): one weighted semaphore shared by all
// sources and families, acquired for a body's size before it is read.
package budget

import (
	"context"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"golang.org/x/sync/semaphore"

	"github.com/hearth-dev/hearth/warmer"
)

// ErrOverBudget is a payload larger than the whole budget: it could never be
// read, so its member fails at once (its old value is kept). It is a
// warmer.ErrTooLarge.
var ErrOverBudget = fmt.Errorf("%w: over refresh.max_inflight_bytes", warmer.ErrTooLarge)

// Budget is the process's in-flight payload budget. A nil *Budget bounds
// nothing.
type Budget struct {
	sem      *semaphore.Weighted
	max      int64
	inflight prometheus.Gauge
	refused  *prometheus.CounterVec
}

// New is a budget of max bytes whose metrics go to reg (nil: unregistered).
func New(max int64, reg prometheus.Registerer) *Budget {
	f := promauto.With(reg) // nil: unregistered
	b := &Budget{
		sem: semaphore.NewWeighted(max), max: max,
		inflight: f.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_payload_inflight_bytes",
			Help: "Payload bytes the loads hold now, out of refresh.max_inflight_bytes (a body is counted at its Content-Length or its bound before it is read).",
		}),
		refused: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_payload_budget_refused_total",
			Help: "Loads refused by the in-flight payload budget: over (the payload is larger than the whole budget; the member fails, its old value is kept) or wait (the budget did not free up before the load's deadline).",
		}, []string{"source", "reason"}),
	}
	return b
}

// Max is the budget's size in bytes (0 for a nil budget).
func (b *Budget) Max() int64 {
	if b == nil {
		return 0
	}
	return b.max
}

// Acquire takes n bytes of the budget for source, waiting until they are free
// or ctx ends, and returns the function that gives them back. A payload over
// the whole budget fails at once with ErrOverBudget.
func (b *Budget) Acquire(ctx context.Context, source string, n int64) (release func(), err error) {
	if b == nil || n <= 0 {
		return func() {}, nil
	}
	if n > b.max {
		b.refused.WithLabelValues(source, "over").Inc()
		return nil, fmt.Errorf("%w: payload of %d bytes, the budget is %d", ErrOverBudget, n, b.max)
	}
	if err := b.sem.Acquire(ctx, n); err != nil {
		b.refused.WithLabelValues(source, "wait").Inc()
		return nil, fmt.Errorf("%w: wait for %d bytes of refresh.max_inflight_bytes: %w", warmer.ErrOverloaded, n, err)
	}
	b.inflight.Add(float64(n))
	var once sync.Once
	return func() {
		once.Do(func() {
			b.inflight.Sub(float64(n))
			b.sem.Release(n)
		})
	}, nil
}
