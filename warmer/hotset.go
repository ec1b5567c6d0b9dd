package warmer

import (
	"math"
	"slices"
	"time"
)

// HotSet makes a family's members follow traffic: the TopN keys of the access
// log that match its template over Window, re-ranked every RankInterval, on
// top of its static or queried members (package hotset ranks it).
type HotSet struct {
	// TopN is how many of the hottest matching keys are promoted.
	TopN int
	// Window is how far back the access log is ranked.
	Window time.Duration
	// RankInterval is how often the hot set is re-ranked.
	RankInterval time.Duration
	// Hysteresis keeps a promoted member while it ranks within
	// TopN × (1 + Hysteresis), so that a key at the boundary does not flap.
	Hysteresis float64
	// DemoteAfter is how many rankings in a row a promoted member must rank
	// below TopN × (1 + Hysteresis) (or not at all) before it is demoted.
	DemoteAfter int
}

// Limit is the most members the hot set holds: TopN × (1 + Hysteresis),
// rounded up. A Hysteresis outside [0, 1] (NaN: config rejects it) is taken
// as none.
func (h *HotSet) Limit() int {
	x := h.Hysteresis
	if !(x >= 0 && x <= 1) {
		x = 0
	}
	return max(h.TopN, int(math.Ceil(float64(h.TopN)*(1+x))))
}

// HotMembers returns a family's hot set, sorted.
func (w *Warmer) HotMembers(name string) []string {
	_, st, ok := w.lookup(name)
	if !ok {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return slices.Clone(st.hot)
}

// SetHotMembers makes members (sorted) a family's hot set, refreshed with its
// other members while the declaration has a HotSet; it reports whether the
// family is declared.
func (w *Warmer) SetHotMembers(name string, members []string) bool {
	_, st, ok := w.lookup(name)
	if !ok {
		return false
	}
	st.mu.Lock()
	st.hot = members
	st.mu.Unlock()
	return true
}

// hotMembers returns the hot set's members of a declaration that has one.
// Call with st.mu held.
func (st *declState) hotMembers(spec *Spec) []string {
	if spec.HotSet == nil {
		return nil
	}
	return st.hot
}
