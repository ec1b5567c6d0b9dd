package warmer

import (
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/hearth-dev/hearth/internal/memberindex"
)

// MaxOneOffMembers bounds, per declaration, how many members loaded outside
// the declaration (admin refreshes, access-log pre-warms, members that left a
// family) the warmer remembers. Past it the least recently loaded is
// forgotten first: if that member's load fails later, its stale budget starts
// from that failure, as for a member this process never loaded.
const MaxOneOffMembers = 100_000

// oneOffState maps a member outside the declaration to its last success (unix
// nanoseconds), least recently loaded evicted first.
type oneOffState = simplelru.LRU[string, int64]

// newDeclState is the state of a declaration nothing was loaded for yet: a
// single key's one member is declared from the start, a family's members at
// its first run.
func newDeclState(s *Spec) *declState {
	st := &declState{}
	if !s.Template.IsFamily() {
		st.declared, st.okAt = memberindex.New([]string{""}), []int64{0}
	}
	return st
}

// oneOffHorizon is how long a member outside the declaration is remembered
// after its last success: its value lives at most MaxTTL (a sentinel its
// jittered negative TTL) and a stale extension never goes past MaxStale. After
// both, forgetting changes nothing: a failing load finds no value of ours left
// to keep alive. Zero (no stale extension) means nothing needs remembering.
func oneOffHorizon(s *Spec) time.Duration {
	if s.MaxStale <= 0 {
		return 0
	}
	neg := time.Duration(float64(s.NegativeTTL) * (1 + s.Jitter/2))
	return max(s.MaxStale, s.MaxTTL(), neg)
}

// lastSuccess is m's last successful load (unix nanoseconds), 0 if none is
// remembered. Call with st.mu held.
func (st *declState) lastSuccess(m string) int64 {
	if i, ok := st.declared.At(m); ok {
		return st.okAt[i]
	}
	if st.oneOff != nil {
		if v, ok := st.oneOff.Peek(m); ok {
			return v
		}
	}
	return 0
}

// setLastOK records m's last success (or, for a member never loaded, the
// failure its stale budget starts from). Call with st.mu held.
func (st *declState) setLastOK(spec *Spec, m string, t int64) {
	if i, ok := st.declared.At(m); ok {
		st.okAt[i] = t
		return
	}
	st.addOneOff(spec, m, t)
}

// setLastOKAt is setLastOK for a member a run found at position i of the
// declared list (-1: unknown): written in place while it is still there,
// with no lookup in a map of every member. Call with st.mu held.
func (st *declState) setLastOKAt(spec *Spec, i int, m string, t int64) {
	if i >= 0 && i < st.declared.Len() && st.declared.List()[i] == m {
		st.okAt[i] = t
		return
	}
	st.setLastOK(spec, m, t)
}

// addOneOff remembers a member outside the declaration, if its state can
// matter at all. It reports whether another member was evicted to make room.
func (st *declState) addOneOff(spec *Spec, m string, t int64) bool {
	if oneOffHorizon(spec) <= 0 {
		return false
	}
	if st.oneOff == nil {
		st.oneOff, _ = simplelru.NewLRU[string, int64](MaxOneOffMembers, nil) // size > 0: no error
	}
	// A pre-warm's member is a slice of its access-log key: keep the member only.
	if st.oneOff.Add(strings.Clone(m), t) {
		st.evicted++
		return true
	}
	return false
}

func (st *declState) oneOffLen() int {
	if st.oneOff == nil {
		return 0
	}
	return st.oneOff.Len()
}

// declare makes members the declared members of a declaration, after a run
// listed them: a new member takes over what was remembered of it outside the
// declaration, a member that left is remembered outside it (while it
// matters). Then members outside it whose horizon passed are forgotten.
func (w *Warmer) declare(spec *Spec, st *declState, members []string) {
	now := w.now().UnixNano()
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case st.declared.Is(members):
	case slices.Equal(st.declared.List(), members):
		// The same members listed anew (a static list, a single key): the
		// index and the slots hold, over the new list.
		st.declared = st.declared.Over(members)
	default:
		okAt := make([]int64, len(members))
		stayed := make([]bool, st.declared.Len())
		for i, m := range members {
			if j, ok := st.declared.At(m); ok {
				okAt[i], stayed[j] = st.okAt[j], true
			} else if st.oneOff != nil {
				if v, found := st.oneOff.Peek(m); found {
					okAt[i] = v
					st.oneOff.Remove(m)
				}
			}
		}
		for j, m := range st.declared.List() { // left the declaration
			if v := st.okAt[j]; v != 0 && !stayed[j] {
				st.addOneOff(spec, m, v)
			}
		}
		st.declared, st.okAt = memberindex.New(members), okAt
	}
	w.pruneOneOffs(spec, st, now)
	w.noteState(spec.Name, st)
}

// pruneOneOffs forgets the members outside the declaration whose horizon has
// passed. Call with st.mu held.
func (w *Warmer) pruneOneOffs(spec *Spec, st *declState, now int64) {
	if st.oneOff == nil || st.oneOff.Len() == 0 {
		return
	}
	horizon := oneOffHorizon(spec)
	n := 0
	if horizon <= 0 {
		n = st.oneOff.Len()
		st.oneOff.Purge()
	} else {
		// The order is by last write, not by time (members that left enter at
		// once): look at every one. At most MaxOneOffMembers, once a run.
		for _, m := range st.oneOff.Keys() {
			if v, _ := st.oneOff.Peek(m); v+int64(horizon) <= now {
				st.oneOff.Remove(m)
				n++
			}
		}
	}
	if n > 0 {
		w.stm.pruned.WithLabelValues(spec.Name, "expired").Add(float64(n))
	}
}

// noteState publishes a declaration's state size. Call with st.mu held.
func (w *Warmer) noteState(name string, st *declState) {
	w.stm.members.WithLabelValues(name, "declared").Set(float64(st.declared.Len()))
	w.stm.members.WithLabelValues(name, "one_off").Set(float64(st.oneOffLen()))
	if st.evicted > 0 {
		w.stm.pruned.WithLabelValues(name, "evicted").Add(float64(st.evicted))
		st.evicted = 0
	}
}

// stateMetrics show how much the warmer remembers per declaration.
type stateMetrics struct {
	members *prometheus.GaugeVec
	pruned  *prometheus.CounterVec
}

func newStateMetrics(reg prometheus.Registerer) *stateMetrics {
	f := promauto.With(reg)
	m := &stateMetrics{
		members: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_warmer_state_members",
			Help: "Members the warmer keeps state for, by kind: declared, or one_off (loaded outside the declaration by an admin refresh or a pre-warm, or left it; kept while a value of theirs can be alive).",
		}, []string{"family", "kind"}),
		pruned: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_warmer_state_pruned_total",
			Help: "One-off members forgotten, by reason: expired (no value of theirs can be alive) or evicted (over the per-declaration bound, least recently loaded first).",
		}, []string{"family", "reason"}),
	}
	return m
}
