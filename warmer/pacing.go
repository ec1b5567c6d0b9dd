package warmer

import "time"

// callRater is a source that bounds its calls per second (origin protection,
// sources/protect).
type callRater interface {
	// CallRate is the most calls per second the source admits; 0 or +Inf
	// for no bound.
	CallRate() float64
}

// RateHeadroom is the share of an origin's rate bound a paced run plans to
// use: a plan at the bound itself has no slack, and a batch delayed once (a
// slow query, a GC pause, a starved CPU) leaves every later one as late.
const RateHeadroom = 0.8

// paceGap is the gap between a paced run's batches: the spread left divided
// among them, but never less than the origin admits between two calls (with
// RateHeadroom to catch up): a plan faster than the origin's rate bound makes
// every batch later than the last (docs/performance.md).
func (w *Warmer) paceGap(spec *Spec, left time.Duration, batches int) time.Duration {
	if batches <= 1 || left <= 0 {
		return 0
	}
	gap := left / time.Duration(batches)
	if r, ok := w.sources[spec.Source].(callRater); ok {
		if cr := r.CallRate(); cr > 0 {
			gap = max(gap, time.Duration(float64(time.Second)/(cr*RateHeadroom)))
		}
	}
	return gap
}
