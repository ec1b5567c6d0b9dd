package warmer

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/hearth-dev/hearth/keytmpl"
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

// Declarations is one checked set of declarations: the specs in declared
// order and their index by name. Declare builds it and nothing changes it
// afterwards, so that it can be shared by every reader of the running
// config, and Use cannot fail.
type Declarations struct {
	specs []*Spec
	index map[string]*Spec
	// by is the warmer that checked the sources.
	by *Warmer
}

// Specs returns the declarations in declared order.
func (d *Declarations) Specs() []*Spec { return slices.Clone(d.specs) }

// Len is the number of declarations.
func (d *Declarations) Len() int { return len(d.specs) }

// Declare checks specs against what the warmer can run and returns them as
// Declarations for Use. It fails on a name declared twice and on a source the
// warmer was not built with (opening a new source needs a restart).
func (w *Warmer) Declare(specs []*Spec) (*Declarations, error) {
	d := &Declarations{specs: slices.Clone(specs), index: make(map[string]*Spec, len(specs)), by: w}
	for _, s := range specs {
		if _, dup := d.index[s.Name]; dup {
			return nil, fmt.Errorf("declaration %q twice", s.Name)
		}
		if _, ok := w.sources[s.Source]; !ok {
			return nil, fmt.Errorf("declaration %q: %w: %q", s.Name, ErrSourceAbsent, s.Source)
		}
		d.index[s.Name] = s
	}
	return d, nil
}

// Declarations returns the declarations in force.
func (w *Warmer) Declarations() *Declarations { return w.cur.Load().decl }

// Diff names what replacing old by next adds, removes and changes, in the
// order each declares them.
func Diff(old, next *Declarations) Changes {
	var ch Changes
	for _, s := range next.specs {
		prev, ok := old.index[s.Name]
		switch {
		case !ok:
			ch.Added = append(ch.Added, s.Name)
		case !sameSpec(prev, s):
			ch.Changed = append(ch.Changed, s.Name)
		}
	}
	for _, s := range old.specs {
		if _, ok := next.index[s.Name]; !ok {
			ch.Removed = append(ch.Removed, s.Name)
		}
	}
	return ch
}

// view is what a refresh reads: the declarations and what the warmer knows of
// each. A view is never changed once published; Use publishes a new one.
type view struct {
	decl  *Declarations
	state map[string]*declState
}

func (v *view) lookup(name string) (*Spec, *declState, bool) {
	s, ok := v.decl.index[name]
	if !ok {
		return nil, nil, false
	}
	return s, v.state[name], true
}

// Apply is Declare then Use: it changes nothing when specs are refused.
func (w *Warmer) Apply(specs []*Spec) (Changes, error) {
	d, err := w.Declare(specs)
	if err != nil {
		return Changes{}, err
	}
	return w.Use(d), nil
}

// Use replaces the declarations with d, as a config reload does: new ones
// are added, missing ones removed, and changed ones take effect from their next
// run. A declaration that stays keeps what the warmer knows of it (last
// successful loads, stale budgets, member list, error count), so a reload never
// shortens a stale budget or forgets a member. Keys already in Redis are left
// alone: a removed declaration's keys simply expire at the end of their TTL,
// and its metric series go. A refresh already running finishes with the
// declaration it started with; every later one reads the new declarations.
// d must come from w.Declare.
func (w *Warmer) Use(d *Declarations) Changes {
	if d.by != w {
		panic("warmer: Use of declarations another warmer checked")
	}
	w.applyMu.Lock()
	defer w.applyMu.Unlock()
	old := w.cur.Load()
	ch := Diff(old.decl, d)
	next := &Declarations{specs: make([]*Spec, 0, len(d.specs)), index: make(map[string]*Spec, len(d.specs)), by: w}
	state := make(map[string]*declState, len(d.specs))
	for _, s := range d.specs {
		if prev, ok := old.decl.index[s.Name]; !ok {
			state[s.Name] = newDeclState(s)
		} else {
			state[s.Name] = old.state[s.Name]
			if sameSpec(prev, s) {
				// Keep the old pointer: callers holding it see no difference.
				s = prev
			}
		}
		next.specs = append(next.specs, s)
		next.index[s.Name] = s
	}
	w.cur.Store(&view{decl: next, state: state})
	for _, name := range slices.Concat(ch.Added, ch.Changed) {
		w.decl.set(next.index[name])
	}
	for _, name := range ch.Removed {
		w.forget(name)
	}
	return ch
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
}

// sameSpec reports whether two declarations would refresh identically.
func sameSpec(a, b *Spec) bool {
	if !a.Template.Same(b.Template) {
		return false
	}
	ac, bc := *a, *b
	ac.Template, bc.Template = keytmpl.Template{}, keytmpl.Template{}
	return reflect.DeepEqual(ac, bc)
}

// lookup returns a declaration and its state, from the current view.
func (w *Warmer) lookup(name string) (*Spec, *declState, bool) {
	return w.cur.Load().lookup(name)
}

// names returns the declaration names in declared order.
func (w *Warmer) names() []string {
	specs := w.cur.Load().decl.specs
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.Name
	}
	return out
}

// declMetrics publishes each declaration's schedule, so that alerts can compare
// a declaration's last success with its own TTL rather than a global guess.
type declMetrics struct {
	interval *prometheus.GaugeVec
	ttl      *prometheus.GaugeVec
}

func newDeclMetrics(reg prometheus.Registerer) *declMetrics {
	f := promauto.With(reg)
	m := &declMetrics{
		interval: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_refresh_interval_seconds",
			Help: "Configured refresh interval of a declaration.",
		}, []string{"family"}),
		ttl: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_key_ttl_seconds",
			Help: "Configured TTL (before jitter) of the keys of a declaration.",
		}, []string{"family"}),
	}
	return m
}

func (m *declMetrics) set(s *Spec) {
	m.interval.WithLabelValues(s.Name).Set(s.Interval.Seconds())
	m.ttl.WithLabelValues(s.Name).Set(s.TTL.Seconds())
}
