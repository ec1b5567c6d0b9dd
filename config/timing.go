package config

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/hearth-dev/hearth/warmer"
)

// Slack in the timing rules.
const (
	// writeSlack covers what load_timeout does not bound in a scheduled
	// write: the timer firing late, the wait for a load slot, the write's
	// round trip to Redis.
	writeSlack = 50 * time.Millisecond
)

// Campaign timing, as leader.Lease campaigns: a standby tries every
// retry_period ±10% while another instance holds the lease, and after a
// failed attempt backs off exponentially up to CampaignBackoff × retry_period
// ±CampaignJitter. The lease reads these constants, so the rule and the
// campaign cannot drift apart.
const (
	CampaignBackoff = 4
	CampaignJitter  = 0.2
)

// TakeoverWait is the longest a standby waits between two attempts to take
// the lease: the campaign's full backoff with its jitter.
func TakeoverWait(retry time.Duration) time.Duration {
	return time.Duration(float64(retry) * CampaignBackoff * (1 + CampaignJitter))
}

// Timing is what the timing rule found for one declaration.
type Timing struct {
	// Gap is the longest time between two writes of one of its keys by a
	// healthy leader; MinTTL the smallest jittered TTL those writes set.
	Gap, MinTTL time.Duration
	// Terms spell Gap out, for messages ("interval 2s + spread 1s + ...").
	Terms string
}

// Margin is how long a key outlives a missed write: MinTTL − Gap.
func (t Timing) Margin() time.Duration { return t.MinTTL - t.Gap }

// refreshTiming is the timing rule of a declaration: a key never expires
// while the leader and the origin are healthy iff MinTTL > Gap, the longest
// time between two writes of one of its keys (derived in docs/configuration.md,
// "Timing"). Runs never overlap (gocron's singleton mode skips a tick that
// finds the last run going): one batch gives Gap = I + load_timeout + slack;
// n batches paced over spread × I give Gap = (1 + skipped) × I + run, where
// run = pace + load_timeout + slack and skipped = ⌊run / I⌋. Out-of-phase
// writes set a full TTL and never delay the next scheduled one.
func refreshTiming(s *warmer.Spec, k Key, spread, rate float64) Timing {
	t := Timing{MinTTL: s.MinTTL()}
	n := runBatches(s, k)
	if n == 1 {
		t.Gap = s.Interval + s.LoadTimeout + writeSlack
		t.Terms = fmt.Sprintf("interval %s + load_timeout %s + slack %s", s.Interval, s.LoadTimeout, writeSlack)
		return t
	}
	pace := time.Duration(float64(s.Interval) * spread)
	if n > 1 {
		pace = pace / time.Duration(n) * time.Duration(n-1)
		// The warmer never plans batches closer than the source's rate
		// admits (warmer.paceGap), so a low rate stretches the run.
		if g := rateGap(rate); g > 0 {
			pace = max(pace, g*time.Duration(n-1))
		}
	}
	run := pace + s.LoadTimeout + writeSlack
	skipped := run / s.Interval
	t.Gap = (1+skipped)*s.Interval + run
	first := "interval " + s.Interval.String()
	if skipped > 0 {
		first = fmt.Sprintf("%d × interval %s (a run of up to %s skips %d ticks)", 1+skipped, s.Interval, run, skipped)
	}
	t.Terms = fmt.Sprintf("%s + spread %s + load_timeout %s + slack %s", first, pace, s.LoadTimeout, writeSlack)
	return t
}

// runBatches is how many batched loads one run of a declaration makes: 1 for
// a single key, 0 when a query lists the members (how many is unknown).
func runBatches(s *warmer.Spec, k Key) int {
	if !s.Template.IsFamily() {
		return 1
	}
	members := len(k.Members)
	if s.HotSet != nil {
		members += s.HotSet.Limit() // the hot set holds at most this many more
	}
	if k.MembersQuery == "" && (k.MembersFrom == nil || s.HotSet != nil) && s.BatchSize > 0 {
		return max(1, (members+s.BatchSize-1)/s.BatchSize)
	}
	return 0
}

// rateGap is the least time the warmer plans between two batches of a run
// against a source bounded to rate calls per second (0: none).
func rateGap(rate float64) time.Duration {
	if !(rate > 0) || math.IsInf(rate, 0) {
		return 0
	}
	// Rounded up to a millisecond, for readable messages; the difference
	// from the warmer's own figure is within writeSlack.
	g := time.Duration(float64(time.Second) / (rate * warmer.RateHeadroom))
	return g.Truncate(time.Millisecond) + time.Millisecond
}

// checkTiming reports a declaration whose keys could expire between two
// writes (see refreshTiming).
func checkTiming(t Timing, ttl time.Duration, jitter float64) (Problem, bool) {
	if t.MinTTL > t.Gap {
		return Problem{}, false
	}
	return Problem{Path: "ttl", Msg: fmt.Sprintf(
		"smallest jittered ttl %s is not longer than %s = %s: a key could expire between two refreshes (ttl %s, jitter %g); lengthen the ttl or shorten the interval",
		t.MinTTL.Round(time.Millisecond), t.Terms, t.Gap, ttl, jitter)}, true
}

// sourceRate is the calls per second the named source admits, its default
// applied (0: no bound, or no such source).
func (cfg *Config) sourceRate(name string) float64 {
	for _, src := range cfg.Sources {
		if src.Name == name {
			return src.Protection.resolved().Rate
		}
	}
	return 0
}

// scheduled is what one declaration's runs ask of its source and of the
// load slots: calls origin calls (its batches, one at least when a query
// lists the members, plus the listing query) and loads batched loads, every
// interval, each lasting up to loadTimeout while the origin is healthy.
type scheduled struct {
	path, source    string
	calls, loads    int
	what            string
	interval, timed time.Duration
}

func (cfg *Config) schedule(specs []*warmer.Spec) []scheduled {
	var out []scheduled
	for i, s := range specs {
		if s == nil || !timeable(s, cfg.Refresh.Spread) {
			continue
		}
		k := cfg.Keys[i]
		d := scheduled{path: fmt.Sprintf("keys[%s]", k.Name), source: k.Source, loads: runBatches(s, k), interval: s.Interval, timed: s.LoadTimeout}
		d.what = fmt.Sprintf("%d loads", d.loads)
		switch {
		case d.loads == 0:
			d.loads, d.what = 1, "at least 1 batch"
		case d.loads == 1:
			d.what = "1 load"
		}
		d.calls = d.loads
		if k.MembersQuery != "" {
			d.calls++
			d.what += " + members_query"
		}
		out = append(out, d)
	}
	return out
}

// demandTerms spells out a demand for a message: the first few declarations,
// then how many more.
func demandTerms(terms []string) string {
	const shown = 4
	if len(terms) > shown {
		return strings.Join(terms[:shown], ", ") + fmt.Sprintf(" and %d more", len(terms)-shown)
	}
	return strings.Join(terms, ", ")
}

// validateRates refuses a source whose rate bound cannot carry the scheduled
// loads of the declarations it serves: the warmer paces every run to the
// rate (with warmer.RateHeadroom), so a run that needs more calls than an
// interval admits falls further behind at every tick, and keys expire while
// the origin is healthy. Each run makes its batches (one at least, when a
// query lists the members) plus the listing query itself.
func (cfg *Config) validateRates(c *checker, specs []*warmer.Spec) {
	sched := cfg.schedule(specs)
	for _, src := range cfg.Sources {
		if !nameRe.MatchString(src.Name) {
			continue // the source has a problem of its own
		}
		g := src.Protection.resolved()
		var (
			calls     float64
			rateTerms []string
		)
		for _, d := range sched {
			if d.source != src.Name {
				continue
			}
			calls += float64(d.calls) / d.interval.Seconds()
			rateTerms = append(rateTerms, fmt.Sprintf("%s %s every %s", d.path, d.what, d.interval))
		}
		if rate := g.Rate; rate > 0 && !math.IsInf(rate, 0) && calls > rate*warmer.RateHeadroom {
			c.add("sources["+src.Name+"].rate", "%g calls/s cannot carry the scheduled loads of its declarations (%s: %.3g calls/s, planned at %g%% of the rate): keys would expire while the origin is healthy; raise rate to at least %.3g, or batch_size or the intervals",
				rate, demandTerms(rateTerms), calls, warmer.RateHeadroom*100, calls/warmer.RateHeadroom)
		}
	}
}

// slotWarnings reports load slots too few for what the declarations
// schedule, each load taking up to its load_timeout as a healthy origin may:
// the shared refresh.max_concurrent_loads (a load waiting for one is bounded
// by nothing, so each run starts later than the one before, without a word:
// 10 single keys of a 1.8s load every 3s on one slot had keys missing in 286
// of 417 polls) and a source's max_in_flight (a call waiting for one spends
// its load's load_timeout and fails as overloaded; with max_in_flight 1 those
// failures opened the breaker and 7 of 10 keys were never written). These
// are warnings, not refusals: the bound assumes every load takes its whole
// load_timeout, and loads are usually much faster.
func (cfg *Config) slotWarnings() []string {
	var out []string
	sched := cfg.schedule(cfg.specs)
	for _, src := range cfg.Sources {
		g := src.Protection.resolved()
		var busy float64
		var terms []string
		for _, d := range sched {
			if d.source != src.Name {
				continue
			}
			busy += float64(d.calls) * d.timed.Seconds() / d.interval.Seconds()
			terms = append(terms, fmt.Sprintf("%s %s of up to %s every %s", d.path, d.what, d.timed, d.interval))
		}
		if slots := g.MaxInFlight; slots > 0 && busy > float64(slots) {
			out = append(out, fmt.Sprintf("sources[%s].max_in_flight: %d calls in flight cannot carry the scheduled loads of its declarations if each takes up to its load_timeout (%s: %.3g calls in flight on average): loads that wait for a call slot fail, and keys could expire while the origin is healthy; raise max_in_flight to at least %d, or lower load_timeout, or lengthen the intervals",
				src.Name, slots, demandTerms(terms), busy, int(math.Ceil(busy))))
		}
	}
	var busy float64
	var terms []string
	for _, d := range sched {
		busy += float64(d.loads) * d.timed.Seconds() / d.interval.Seconds()
		terms = append(terms, fmt.Sprintf("%s %s of up to %s every %s", d.path, strings.TrimSuffix(d.what, " + members_query"), d.timed, d.interval))
	}
	if slots := cfg.Refresh.MaxConcurrentLoads; slots > 0 && busy > float64(slots) {
		out = append(out, fmt.Sprintf("refresh.max_concurrent_loads: %d loads at a time cannot carry the scheduled loads of the declarations if each takes up to its load_timeout (%s: %.3g loads in flight on average): each run could start later than the one before, and keys expire while the origin is healthy; raise it to at least %d, or lower load_timeout, or lengthen the intervals",
			slots, demandTerms(terms), busy, int(math.Ceil(busy))))
	}
	return out
}
