package warmer

import (
	"fmt"
	"reflect"

	"github.com/prometheus/client_golang/prometheus"
)

// Changes lists, by name, what one Apply did to the declarations.
type Changes struct {
	Added   []string
	Removed []string
	Changed []string
}

// Empty reports whether the new declarations were the same as the old ones.
func (c Changes) Empty() bool {
	return len(c.Added) == 0 && len(c.Removed) == 0 && len(c.Changed) == 0
}

// Apply replaces the declarations with specs, as a config reload does: new ones
// are added, missing ones removed, and changed ones take effect from their next
// run. A declaration that stays keeps what the warmer knows of it (last
// successful loads, stale budgets, member list, error count), so a reload never
// shortens a stale budget or forgets a member. Keys already in Redis are left
// alone: a removed declaration's keys simply expire at the end of their TTL.
//
// Apply checks everything first and changes nothing on error: every source must
// be one the warmer was built with (opening a new source needs a restart).
// A refresh already running finishes with the declaration it started with.
func (w *Warmer) Apply(specs []*Spec) (Changes, error) {
	sw, err := w.Swap(specs)
	if err != nil {
		return Changes{}, err
	}
	sw.Keep()
	return sw.Changes(), nil
}

// Swapped is a replacement of the declarations (Swap) that is not final yet:
// Keep makes it final, Undo puts the old declarations back as they were, state
// included. A reload swaps the warmer first, then the schedule, and undoes the
// warmer's swap when the schedule cannot follow.
type Swapped struct {
	w  *Warmer
	ch Changes
	// old are the declarations, their order and state before the swap.
	old      map[string]*Spec
	oldOrder []string
	oldState map[string]*declState
	done     bool
}

// Swap is Apply that can be undone: it checks specs and changes nothing on
// error, then swaps in the new declarations. Exactly one of Keep or Undo must
// follow. Until Keep, a removed declaration's metric series stay. Until Keep
// or Undo, refreshes do not start (they wait in lookup, Specs): a refresh
// that starts while a reload may still be rolled back would run the new
// declaration once. Refreshes already running finish with their declaration.
// Swap waits for another swap's Keep or Undo.
func (w *Warmer) Swap(specs []*Spec) (*Swapped, error) {
	next := make(map[string]*Spec, len(specs))
	order := make([]string, 0, len(specs))
	for _, s := range specs {
		if _, dup := next[s.Name]; dup {
			return nil, fmt.Errorf("apply: declaration %q twice", s.Name)
		}
		if _, ok := w.sources[s.Source]; !ok {
			return nil, fmt.Errorf("apply: declaration %q: %w: %q (adding a source needs a restart)", s.Name, ErrSourceAbsent, s.Source)
		}
		next[s.Name] = s
		order = append(order, s.Name)
	}

	w.swapping.Lock() // until Keep or Undo
	w.mu.Lock()
	sw := &Swapped{w: w, old: w.specs, oldOrder: w.order, oldState: w.state}
	state := make(map[string]*declState, len(specs))
	for _, name := range order {
		old, ok := w.specs[name]
		switch {
		case !ok:
			sw.ch.Added = append(sw.ch.Added, name)
			state[name] = newDeclState(next[name])
		case !sameSpec(old, next[name]):
			sw.ch.Changed = append(sw.ch.Changed, name)
			state[name] = w.state[name]
		default:
			// Keep the old pointer: callers holding it see no difference.
			next[name] = old
			state[name] = w.state[name]
		}
	}
	for _, name := range w.order {
		if _, ok := next[name]; !ok {
			sw.ch.Removed = append(sw.ch.Removed, name)
		}
	}
	w.specs, w.order, w.state = next, order, state
	w.mu.Unlock()

	for _, name := range append(sw.ch.Added, sw.ch.Changed...) {
		w.decl.set(next[name])
		w.hot.declare(next[name])
	}
	return sw, nil
}

// Changes is what the swap did.
func (s *Swapped) Changes() Changes { return s.ch }

// Keep makes the swap final: removed declarations' metric series go, and
// refreshes start again, with the new declarations.
func (s *Swapped) Keep() {
	if s.done {
		return
	}
	s.done = true
	defer s.w.swapping.Unlock()
	for _, name := range s.ch.Removed {
		s.w.forget(name)
	}
}

// Undo puts back the declarations, order and state the warmer had before the
// swap, and their published schedule; added declarations' series go.
// Refreshes start again, with the old declarations.
func (s *Swapped) Undo() {
	if s.done {
		return
	}
	s.done = true
	defer s.w.swapping.Unlock()
	w := s.w
	w.mu.Lock()
	w.specs, w.order, w.state = s.old, s.oldOrder, s.oldState
	w.mu.Unlock()
	for _, name := range s.ch.Added {
		w.forget(name)
	}
	for _, name := range append(s.ch.Removed, s.ch.Changed...) {
		w.decl.set(s.old[name])
		w.hot.declare(s.old[name])
	}
}

// forget drops a removed declaration's metric series, so that dashboards and
// alerts (a key not refreshed for longer than TTL/2) stop seeing it.
func (w *Warmer) forget(name string) {
	family := prometheus.Labels{"family": name}
	m := w.metrics
	m.runs.DeletePartialMatch(family)
	m.runDuration.DeletePartialMatch(family)
	m.keysWritten.DeletePartialMatch(family)
	m.failures.DeletePartialMatch(family)
	m.staleExtended.DeletePartialMatch(family)
	m.staleness.DeletePartialMatch(family)
	m.lastSuccess.DeletePartialMatch(family)
	m.lag.DeletePartialMatch(family)
	m.members.DeletePartialMatch(family)
	m.versionRepairs.DeletePartialMatch(family)
	w.decl.interval.DeletePartialMatch(family)
	w.decl.ttl.DeletePartialMatch(family)
	w.stm.members.DeletePartialMatch(family)
	w.stm.pruned.DeletePartialMatch(family)
	w.hot.forget(name)
}

// sameSpec reports whether two declarations would refresh identically.
func sameSpec(a, b *Spec) bool {
	if a.Template.raw != b.Template.raw || a.Template.maxLen != b.Template.maxLen ||
		patternOf(a.Template) != patternOf(b.Template) {
		return false
	}
	ac, bc := *a, *b
	ac.Template, bc.Template = Template{}, Template{}
	return reflect.DeepEqual(ac, bc)
}

func patternOf(t Template) string {
	if t.pattern == nil {
		return ""
	}
	return t.pattern.String()
}

// lookup returns a declaration and its state under the lock Apply takes.
func (w *Warmer) lookup(name string) (*Spec, *declState, bool) {
	w.swapping.RLock()
	defer w.swapping.RUnlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	s, ok := w.specs[name]
	if !ok {
		return nil, nil, false
	}
	return s, w.state[name], true
}

// names returns the declaration names in declared order.
func (w *Warmer) names() []string {
	w.swapping.RLock()
	defer w.swapping.RUnlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.order...)
}

// declMetrics publishes each declaration's schedule, so that alerts can compare
// a declaration's last success with its own TTL rather than a global guess.
type declMetrics struct {
	interval *prometheus.GaugeVec
	ttl      *prometheus.GaugeVec
}

func newDeclMetrics(reg prometheus.Registerer) *declMetrics {
	m := &declMetrics{
		interval: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_refresh_interval_seconds",
			Help: "Configured refresh interval of a declaration.",
		}, []string{"family"}),
		ttl: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_key_ttl_seconds",
			Help: "Configured TTL (before jitter) of the keys of a declaration.",
		}, []string{"family"}),
	}
	reg.MustRegister(m.interval, m.ttl)
	return m
}

func (m *declMetrics) set(s *Spec) {
	m.interval.WithLabelValues(s.Name).Set(s.Interval.Seconds())
	m.ttl.WithLabelValues(s.Name).Set(s.TTL.Seconds())
}
