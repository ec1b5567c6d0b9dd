package warmer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// HotSet makes a family's members follow traffic: the TopN keys of the access
// log that match its template over Window, re-ranked every RankInterval, on
// top of its static or queried members.
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

// HotRanker ranks the access log's keys that start with prefix and end with
// suffix (a family's keys): fn gets at most n of them read over the last
// window, the most read first, and stops the ranking by returning false. It
// returns where the ranking came from (accesslog.RankingStored or RankingLive).
type HotRanker interface {
	EachTopMatching(ctx context.Context, window time.Duration, n int, prefix, suffix string, fn func(key string) bool) (string, error)
}

// Reasons a ranked key is not promoted; the pre-warm skips access-log keys
// for the first three too.
const (
	// SkipTooLong: longer than MaxLogKeyBytes.
	SkipTooLong = "too_long"
	// SkipNamespace: the key is one of Hearth's own (inside redis.namespace,
	// see InNamespace), which a ranking must never make Hearth overwrite.
	SkipNamespace = "namespace"
	// SkipInvalidMember: the template matches, but its parameter fails the
	// declaration's member rules (length, characters, param_pattern).
	SkipInvalidMember = "invalid_member"
	// SkipNoMatch: the key does not belong to the template (a ranker that
	// returned a key it was not asked for).
	SkipNoMatch = "no_match"
)

// MaxLogKeyBytes bounds a ranked or access-log key before it is matched at all.
const MaxLogKeyBytes = 4096

// HotSetChange is what one ranking did to a hot set.
type HotSetChange struct {
	// Ranking is where the ranking came from: stored or live.
	Ranking string
	// Ranked is how many valid members the ranking returned (at most Limit).
	Ranked int
	// Promoted and Demoted list the members that entered and left.
	Promoted []string
	Demoted  []string
	// Size is the hot set's size after the ranking.
	Size int
	// Skipped counts ranked keys that cannot be members, by reason.
	Skipped map[string]int
	// Loaded is the outcome of loading the promoted members at once.
	Loaded Outcome
}

// hotState is a family's hot set: each promoted member and how many rankings
// in a row it has ranked too low to stay (0 while it ranks well).
type hotState map[string]int

// maxScanFactor bounds how many ranked keys one ranking reads, as a multiple
// of the hot set's limit: keys that cannot be members (forged or malformed
// ones in the log) may take ranks, and they are skipped, but a flood of them
// must not make a ranking read the whole log.
const (
	maxScanFactor = 4
	minScanExtra  = 1000
)

// RankHotSet re-ranks a family's hot set from the access log: the TopN
// hottest matching keys are promoted, a member that ranks below
// TopN × (1 + Hysteresis) for DemoteAfter rankings in a row is demoted (no
// longer refreshed: its key expires at the end of its TTL), and the set never
// holds more than Limit members. Keys from the log are untrusted: each must
// belong to the template and pass its member rules and may not be one of
// Hearth's own; the others are skipped and counted. Promoted members are
// loaded at once (through the gate, like every write), then on the family's
// schedule. When the ranking fails, the hot set stays as it was.
func (w *Warmer) RankHotSet(ctx context.Context, name string, r HotRanker) (HotSetChange, error) {
	spec, st, ok := w.lookup(name)
	if !ok {
		return HotSetChange{}, fmt.Errorf("rank hot set %q: %w", name, ErrUnknownSpec)
	}
	hs := spec.HotSet
	if hs == nil || !spec.Template.IsFamily() {
		return HotSetChange{}, fmt.Errorf("rank hot set %q: %w", name, ErrNoHotSet)
	}
	limit := hs.Limit()
	ch := HotSetChange{Skipped: map[string]int{}}
	ranked := make([]string, 0, min(limit, 1<<16))
	rank := make(map[string]int, min(limit, 1<<16))
	prefix, suffix := spec.Template.prefix, spec.Template.suffix
	scan := min(max(maxScanFactor*limit, limit+minScanExtra), math.MaxInt32)
	source, err := r.EachTopMatching(ctx, hs.Window, scan, prefix, suffix, func(key string) bool {
		m, why := hotMember(spec, key)
		if why != "" {
			ch.Skipped[why]++
			return true
		}
		if _, dup := rank[m]; !dup {
			m = strings.Clone(m)
			rank[m] = len(ranked)
			ranked = append(ranked, m)
		}
		return len(ranked) < limit
	})
	ch.Ranking = source
	for why, n := range ch.Skipped {
		w.hot.skipped.WithLabelValues(name, why).Add(float64(n))
	}
	if n := len(ch.Skipped); n > 0 {
		w.log.Warn().Str("family", name).Any("skipped", ch.Skipped).Msg("access-log keys not promoted: they cannot be members")
	}
	if err != nil {
		w.hot.rankings.WithLabelValues(name, "error").Inc()
		return ch, fmt.Errorf("rank hot set %s: %w", name, err)
	}
	w.hot.rankings.WithLabelValues(name, source).Inc()
	ch.Ranked = len(ranked)

	st.mu.Lock()
	prev := st.hot
	next := make(hotState, min(limit, len(prev)+len(ranked)))
	for i, m := range ranked {
		if i < hs.TopN {
			next[m] = 0
			if _, in := prev[m]; !in {
				ch.Promoted = append(ch.Promoted, m)
			}
		} else if _, in := prev[m]; in {
			next[m] = 0 // within the hysteresis band: stays
		}
	}
	// Members that ranked below the band, or not at all.
	var out []string
	for m, misses := range prev {
		if _, ok := next[m]; ok {
			continue
		}
		if misses+1 < max(1, hs.DemoteAfter) {
			next[m] = misses + 1
			out = append(out, m)
		} else {
			ch.Demoted = append(ch.Demoted, m)
		}
	}
	// The bound: members waiting out their DemoteAfter go first, the longest
	// out first.
	if over := len(next) - limit; over > 0 {
		slices.SortFunc(out, func(a, b string) int {
			if d := next[b] - next[a]; d != 0 {
				return d
			}
			return strings.Compare(a, b)
		})
		for _, m := range out[:min(over, len(out))] {
			delete(next, m)
			ch.Demoted = append(ch.Demoted, m)
		}
	}
	st.hot = next
	ch.Size = len(next)
	st.mu.Unlock()
	slices.Sort(ch.Demoted)

	w.hot.size.WithLabelValues(name).Set(float64(ch.Size))
	w.hot.promotions.WithLabelValues(name).Add(float64(len(ch.Promoted)))
	w.hot.demotions.WithLabelValues(name).Add(float64(len(ch.Demoted)))
	if len(ch.Promoted)+len(ch.Demoted) > 0 {
		w.log.Info().Str("family", name).Str("ranking", source).Int("size", ch.Size).
			Int("promoted", len(ch.Promoted)).Int("demoted", len(ch.Demoted)).Msg("hot set re-ranked")
	}
	ch.Loaded = w.loadPromoted(ctx, spec, st, ch.Promoted)
	return ch, ch.Loaded.LastError
}

// loadPromoted loads newly promoted members at once, batch by batch within the
// warmer's load bound, so that a key that just turned hot is warm before the
// family's next run.
func (w *Warmer) loadPromoted(ctx context.Context, spec *Spec, st *declState, members []string) Outcome {
	var out Outcome
	for _, batch := range w.batches(spec, members) {
		if err := w.loads.Acquire(ctx, 1); err != nil {
			out.LastError = err
			out.NotRun += len(batch)
			continue
		}
		out.add(w.refreshBatch(ctx, spec, st, batch))
		w.loads.Release(1)
	}
	out.Members = len(members)
	return out
}

// hotMember returns the member a ranked key names, or why it cannot be one.
func hotMember(spec *Spec, key string) (string, string) {
	if len(key) > MaxLogKeyBytes {
		return "", SkipTooLong
	}
	if m, ok := spec.Template.Match(key); ok {
		return m, ""
	}
	t := spec.Template
	switch {
	case t.namespace != "" && InNamespace(key, t.namespace):
		return "", SkipNamespace
	case !t.CouldMatch(key):
		return "", SkipNoMatch
	}
	return "", SkipInvalidMember
}

// HotMembers returns a family's hot set, sorted.
func (w *Warmer) HotMembers(name string) []string {
	_, st, ok := w.lookup(name)
	if !ok {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make([]string, 0, len(st.hot))
	for m := range st.hot {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// hotMembers returns the hot set's members of a declaration that has one.
// Call with st.mu held.
func (st *declState) hotMembers(spec *Spec) []string {
	if spec.HotSet == nil || len(st.hot) == 0 {
		return nil
	}
	out := make([]string, 0, len(st.hot))
	for m := range st.hot {
		out = append(out, m)
	}
	// A stable order: batches (and their origin queries) stay the same.
	slices.Sort(out)
	return out
}

// ErrNoHotSet: the declaration takes no members from the access log.
var ErrNoHotSet = errors.New("declaration has no hot set (members_from.access_log)")

// hotMetrics show each hot set: its size and how it moves.
type hotMetrics struct {
	size       *prometheus.GaugeVec
	promotions *prometheus.CounterVec
	demotions  *prometheus.CounterVec
	skipped    *prometheus.CounterVec
	rankings   *prometheus.CounterVec
}

func newHotMetrics(reg prometheus.Registerer) *hotMetrics {
	f := promauto.With(reg)
	m := &hotMetrics{
		size: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_hotset_members",
			Help: "Members of a family promoted from the access log (its hot set), after the last ranking.",
		}, []string{"family"}),
		promotions: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_hotset_promotions_total",
			Help: "Members that entered a family's hot set (ranked in its top N of the access log).",
		}, []string{"family"}),
		demotions: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_hotset_demotions_total",
			Help: "Members that left a family's hot set: no longer refreshed, left to expire.",
		}, []string{"family"}),
		skipped: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_hotset_skipped_keys_total",
			Help: "Ranked access-log keys not promoted because they cannot be members, by reason (too_long, invalid_member, namespace, no_match).",
		}, []string{"family", "reason"}),
		rankings: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_hotset_rankings_total",
			Help: "Rankings of a family's hot set, by result: stored (read the stored ranking), live (ranked the access log), error.",
		}, []string{"family", "result"}),
	}
	return m
}

// declare starts a hot set's series at zero (so that rate() sees the first
// promotions), or drops them when the declaration has no hot set (any more).
func (m *hotMetrics) declare(s *Spec) {
	if s.HotSet == nil {
		m.forget(s.Name)
		return
	}
	m.size.WithLabelValues(s.Name)
	m.promotions.WithLabelValues(s.Name)
	m.demotions.WithLabelValues(s.Name)
}

func (m *hotMetrics) forget(name string) {
	family := prometheus.Labels{"family": name}
	m.size.DeletePartialMatch(family)
	m.promotions.DeletePartialMatch(family)
	m.demotions.DeletePartialMatch(family)
	m.skipped.DeletePartialMatch(family)
	m.rankings.DeletePartialMatch(family)
}
