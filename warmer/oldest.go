package warmer

import (
	"cmp"
	"slices"
)

// A run that cannot keep up writes the oldest writes first (oldestFirst);
// package behind projects, logs and counts its shortfall.

// ordered is a run's batches in the order they start, and for each the
// earliest TTL end among its members (unix nanoseconds: last write plus the
// declaration's shortest jittered TTL; 0 when none of them was written yet).
type ordered struct {
	batches [][]string
	due     []int64
	// at is where each batch starts in the members list.
	at []int
}

// oldestFirst cuts members into batches and orders the batches by the oldest
// last write among their members, never written first, ties in member order:
// a sort of the batches, not of the members, whose batches were written
// together by the previous run.
func (w *Warmer) oldestFirst(spec *Spec, st *declState, members []string) ordered {
	batches := spec.Batches(members)
	oldest := make([]int64, len(batches)) // 0: a member never written
	due := make([]int64, len(batches))
	at := make([]int, len(batches))
	ttl := int64(spec.MinTTL())
	sorted := true
	next := 0
	for i, b := range batches {
		at[i] = next
		next += len(b)
		o, d := int64(-1), int64(0)
		st.mu.Lock() // per batch: writers of other batches are not held for long
		// The members just declared (the usual case) are read by position.
		okAt := []int64(nil)
		if st.declared.Is(members) {
			okAt = st.okAt[at[i] : at[i]+len(b)]
		}
		for j, m := range b {
			var t int64
			if okAt != nil {
				t = okAt[j]
			} else {
				t = st.lastSuccess(m)
			}
			if o < 0 || t < o {
				o = t
			}
			if t != 0 && (d == 0 || t+ttl < d) {
				d = t + ttl
			}
		}
		st.mu.Unlock()
		oldest[i], due[i] = max(o, 0), d
		if i > 0 && oldest[i] < oldest[i-1] {
			sorted = false
		}
	}
	if sorted {
		return ordered{batches: batches, due: due, at: at}
	}
	idx := make([]int, len(batches))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		return cmp.Or(cmp.Compare(oldest[a], oldest[b]), cmp.Compare(a, b))
	})
	out := ordered{batches: make([][]string, len(batches)), due: make([]int64, len(batches)), at: make([]int, len(batches))}
	for j, i := range idx {
		out.batches[j], out.due[j], out.at[j] = batches[i], due[i], at[i]
	}
	return out
}
