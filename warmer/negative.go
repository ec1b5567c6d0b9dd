package warmer

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/hearth-dev/hearth/internal/claims"
	"github.com/hearth-dev/hearth/store"
)

// NegativeInterval is how often the members a declaration found missing are
// asked for again: half the negative TTL, like values at half their TTL. It is
// zero when the declaration's own refresh interval is already that short.
func NegativeInterval(spec *Spec) time.Duration {
	if every := spec.NegativeTTL / 2; every > 0 && every < spec.Interval {
		return every
	}
	return 0
}

// negativeTTL is the sentinel's lifetime: the jittered negative TTL. Re-checks
// every NegativeInterval (half of it) rewrite the sentinel before it lapses, as
// long as a check takes less than the other half (minus jitter); a check that
// fails keeps the sentinel alive like any value (stale extension).
func (w *Warmer) negativeTTL(spec *Spec) time.Duration {
	return time.Duration(float64(spec.NegativeTTL) * (1 + spec.Jitter*(w.rand()-0.5)))
}

// negative is the sentinel entry of a member; its key is set with the
// batch's (keysOf).
func (w *Warmer) negative(spec *Spec) store.Entry {
	return store.Entry{Value: spec.NegativeValue, TTL: w.negativeTTL(spec)}
}

// noteNegatives records which written members are now sentinels. Call with st.mu held.
func (st *declState) noteNegatives(written, negative []string) {
	if st.negative == nil {
		if len(negative) == 0 {
			return
		}
		st.negative = map[string]bool{}
	}
	for _, m := range written {
		delete(st.negative, m)
	}
	for _, m := range negative {
		st.negative[m] = true
	}
}

// pruneNegatives forgets sentinels of members no longer declared.
func (st *declState) pruneNegatives(members []string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.negative) == 0 {
		return
	}
	keep := make(map[string]bool, len(members))
	for _, m := range members {
		if st.negative[m] {
			keep[m] = true
		}
	}
	st.negative = keep
}

// Negatives returns the members of a declaration currently cached as not
// found, sorted ("" for a single key).
func (w *Warmer) Negatives(name string) []string {
	_, st, ok := w.lookup(name)
	if !ok {
		return nil
	}
	st.mu.Lock()
	out := make([]string, 0, len(st.negative))
	for m := range st.negative {
		out = append(out, m)
	}
	st.mu.Unlock()
	sort.Strings(out)
	return out
}

// RefreshNegatives asks the origin again for the members a declaration last
// found missing, in batches: a row inserted since replaces its sentinel, a
// still-missing one gets a fresh sentinel. The scheduler calls it every
// NegativeInterval, so a missing member costs the origin one batched load per
// half negative TTL, however often it is read.
func (w *Warmer) RefreshNegatives(ctx context.Context, name string) (Outcome, error) {
	spec, st, ok := w.lookup(name)
	if !ok {
		return Outcome{}, fmt.Errorf("refresh %q: %w", name, ErrUnknownSpec)
	}
	members := w.Negatives(name)
	out := Outcome{Members: len(members)}
	if len(members) == 0 {
		return out, nil
	}
	start := w.now()
	for _, batch := range spec.Batches(members) {
		if err := w.loads.Acquire(ctx, 1); err != nil {
			out.LastError = err
			break
		}
		o := w.refreshBatch(ctx, spec, st, batch, claims.Place{})
		w.loads.Release(1)
		out.Add(o)
	}
	out.Duration = w.now().Sub(start)
	return out, out.LastError
}
