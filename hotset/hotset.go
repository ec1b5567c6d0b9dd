// Package hotset makes a family's members follow traffic
// (members_from.access_log): the hottest matching keys of the access log are
// promoted into the family's hot set, members that stop ranking are demoted,
// and the warmer refreshes the hot set with the family's other members. It
// sees the warmer through Engine.
package hotset

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/warmer"
)

// Engine is what the hot sets need of the warmer (warmer.Warmer has it).
type Engine interface {
	Spec(name string) (*warmer.Spec, bool)
	// HotMembers returns a family's hot set, sorted; SetHotMembers replaces
	// it (members sorted) and reports whether the family is declared.
	HotMembers(name string) []string
	SetHotMembers(name string, members []string) bool
	// RefreshBatches refreshes batches within the load bound.
	RefreshBatches(ctx context.Context, batches []warmer.Batch) ([]warmer.Outcome, error)
}

// Ranker ranks the access log's keys that start with prefix and end with
// suffix (a family's keys): fn gets at most n of them read over the last
// window, the most read first, and stops the ranking by returning false. It
// returns where the ranking came from (accesslog.RankingStored or RankingLive).
type Ranker interface {
	EachTopMatching(ctx context.Context, window time.Duration, n int, prefix, suffix string, fn func(key string) bool) (string, error)
}

// Reasons a ranked key is not promoted; the pre-warm skips access-log keys
// for the first three too.
const (
	// SkipTooLong: longer than MaxLogKeyBytes.
	SkipTooLong = "too_long"
	// SkipNamespace: the key is one of Hearth's own (inside redis.namespace,
	// see keytmpl.InNamespace), which a ranking must never make Hearth overwrite.
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

// ErrNoHotSet: the declaration takes no members from the access log.
var ErrNoHotSet = errors.New("declaration has no hot set (members_from.access_log)")

// Change is what one ranking did to a hot set.
type Change struct {
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
	Loaded warmer.Outcome
}

// maxScanFactor bounds how many ranked keys one ranking reads, as a multiple
// of the hot set's limit: keys that cannot be members (forged or malformed
// ones in the log) may take ranks, and they are skipped, but a flood of them
// must not make a ranking read the whole log.
const (
	maxScanFactor = 4
	minScanExtra  = 1000
)

// Sets ranks the hot sets of a warmer's families.
type Sets struct {
	e   Engine
	m   *metrics
	log zerolog.Logger

	mu sync.Mutex
	// misses holds, per family, how many rankings in a row each member of
	// its hot set has ranked too low to stay (0 while it ranks well).
	misses map[string]map[string]int
	// declared is the families whose series Declare started.
	declared map[string]bool
}

// New builds the hot sets of e's families; their metrics go to reg.
func New(e Engine, reg prometheus.Registerer, log zerolog.Logger) *Sets {
	return &Sets{e: e, m: newMetrics(reg), log: log,
		misses: map[string]map[string]int{}, declared: map[string]bool{}}
}

// Declare starts the series of every hot set among specs at zero (so that
// rate() sees the first promotions) and drops those of families that have no
// hot set (any more); the daemon calls it at start-up and on every reload.
func (s *Sets) Declare(specs []*warmer.Spec) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := make(map[string]bool, len(specs))
	for _, spec := range specs {
		if spec.HotSet == nil {
			continue
		}
		now[spec.Name] = true
		s.m.size.WithLabelValues(spec.Name)
		s.m.promotions.WithLabelValues(spec.Name)
		s.m.demotions.WithLabelValues(spec.Name)
	}
	for name := range s.declared {
		if !now[name] {
			s.m.forget(name)
		}
	}
	s.declared = now
}

// Rank re-ranks a family's hot set from the access log: the TopN hottest
// matching keys are promoted, a member that ranks below
// TopN × (1 + Hysteresis) for DemoteAfter rankings in a row is demoted (no
// longer refreshed: its key expires at the end of its TTL), and the set never
// holds more than Limit members. Keys from the log are untrusted: each must
// belong to the template and pass its member rules and may not be one of
// Hearth's own; the others are skipped and counted. Promoted members are
// loaded at once (through the gate, like every write), then on the family's
// schedule. When the ranking fails, the hot set stays as it was.
func (s *Sets) Rank(ctx context.Context, name string, r Ranker) (Change, error) {
	spec, ok := s.e.Spec(name)
	if !ok {
		return Change{}, fmt.Errorf("rank hot set %q: %w", name, warmer.ErrUnknownSpec)
	}
	hs := spec.HotSet
	if hs == nil || !spec.Template.IsFamily() {
		return Change{}, fmt.Errorf("rank hot set %q: %w", name, ErrNoHotSet)
	}
	limit := hs.Limit()
	ch := Change{Skipped: map[string]int{}}
	ranked := make([]string, 0, min(limit, 1<<16))
	rank := make(map[string]int, min(limit, 1<<16))
	prefix, suffix := spec.Template.Literals()
	scan := min(max(maxScanFactor*limit, limit+minScanExtra), math.MaxInt32)
	source, err := r.EachTopMatching(ctx, hs.Window, scan, prefix, suffix, func(key string) bool {
		m, why := member(spec, key)
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
		s.m.skipped.WithLabelValues(name, why).Add(float64(n))
	}
	if n := len(ch.Skipped); n > 0 {
		s.log.Warn().Str("family", name).Any("skipped", ch.Skipped).Msg("access-log keys not promoted: they cannot be members")
	}
	if err != nil {
		s.m.rankings.WithLabelValues(name, "error").Inc()
		return ch, fmt.Errorf("rank hot set %s: %w", name, err)
	}
	s.m.rankings.WithLabelValues(name, source).Inc()
	ch.Ranked = len(ranked)

	s.mu.Lock()
	// The warmer's hot set is the truth (a declaration dropped and declared
	// again starts with none); misses only counts for its members.
	prev := make(map[string]int)
	for _, m := range s.e.HotMembers(name) {
		prev[m] = s.misses[name][m]
	}
	next := make(map[string]int, min(limit, len(prev)+len(ranked)))
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
	members := make([]string, 0, len(next))
	for m := range next {
		members = append(members, m)
	}
	// A stable order: batches (and their origin queries) stay the same.
	slices.Sort(members)
	s.e.SetHotMembers(name, members)
	s.misses[name] = next
	ch.Size = len(next)
	s.mu.Unlock()
	slices.Sort(ch.Demoted)

	s.m.size.WithLabelValues(name).Set(float64(ch.Size))
	s.m.promotions.WithLabelValues(name).Add(float64(len(ch.Promoted)))
	s.m.demotions.WithLabelValues(name).Add(float64(len(ch.Demoted)))
	if len(ch.Promoted)+len(ch.Demoted) > 0 {
		s.log.Info().Str("family", name).Str("ranking", source).Int("size", ch.Size).
			Int("promoted", len(ch.Promoted)).Int("demoted", len(ch.Demoted)).Msg("hot set re-ranked")
	}
	ch.Loaded = s.load(ctx, spec, ch.Promoted)
	return ch, ch.Loaded.LastError
}

// load loads newly promoted members at once, batch by batch within the
// warmer's load bound, so that a key that just turned hot is warm before the
// family's next run.
func (s *Sets) load(ctx context.Context, spec *warmer.Spec, members []string) warmer.Outcome {
	out := warmer.Outcome{Members: len(members)}
	for _, batch := range spec.Batches(members) {
		outs, err := s.e.RefreshBatches(ctx, []warmer.Batch{{Name: spec.Name, Members: batch}})
		if outs[0].Members == 0 {
			out.LastError = err
			out.NotRun += len(batch)
			continue
		}
		out.Add(outs[0])
	}
	return out
}

// member returns the member a ranked key names, or why it cannot be one.
func member(spec *warmer.Spec, key string) (string, string) {
	if len(key) > MaxLogKeyBytes {
		return "", SkipTooLong
	}
	if m, ok := spec.Template.Match(key); ok {
		return m, ""
	}
	t := spec.Template
	switch {
	case t.Namespace() != "" && keytmpl.InNamespace(key, t.Namespace()):
		return "", SkipNamespace
	case !t.CouldMatch(key):
		return "", SkipNoMatch
	}
	return "", SkipInvalidMember
}

// metrics show each hot set: its size and how it moves.
type metrics struct {
	size       *prometheus.GaugeVec
	promotions *prometheus.CounterVec
	demotions  *prometheus.CounterVec
	skipped    *prometheus.CounterVec
	rankings   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
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
}

func (m *metrics) forget(name string) {
	family := prometheus.Labels{"family": name}
	m.size.DeletePartialMatch(family)
	m.promotions.DeletePartialMatch(family)
	m.demotions.DeletePartialMatch(family)
	m.skipped.DeletePartialMatch(family)
	m.rankings.DeletePartialMatch(family)
}
