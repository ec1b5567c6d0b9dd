// Package warmer is Hearth's engine: key declarations (specs), the refresh of a
// declaration from its origin, and the pipelined writes to Redis with jittered
// TTLs, negative sentinels and stale extension on origin failure.
package warmer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/hearth-dev/hearth/internal/claims"
	"github.com/hearth-dev/hearth/internal/memberindex"
	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/store"
)

// Options configures a Warmer. Store, Sources and Specs are required.
type Options struct {
	Store   Store
	Sources map[string]Source
	Specs   []*Spec
	// MaxConcurrentLoads bounds origin loads in flight across all declarations.
	MaxConcurrentLoads int
	Registerer         prometheus.Registerer
	Logger             zerolog.Logger
	// Now and Rand are the clock and the jitter source; tests inject them.
	Now  func() time.Time
	Rand func() float64
	// Gate, when set, admits every batch before its load (the leader lease)
	// and hands out the store the batch writes through: bound to the
	// leader's term, whose epoch fences every write.
	Gate Gate
	// OneShot is a warmer that runs once and exits (`hearth prewarm`): it
	// keeps no per-member state (last success, one-off members), which only
	// later runs of a long-lived warmer would read, and its loads claim no
	// members: one pre-warm, which loads each member once, is all it runs.
	OneShot bool
}

// Warmer refreshes declarations: load from the origin, write to Redis.
type Warmer struct {
	store   Store
	gate    Gate
	sources map[string]Source
	loads   *semaphore.Weighted
	// maxLoads is MaxConcurrentLoads, loads' weight.
	maxLoads int
	metrics  *metrics
	decl     *declMetrics
	log      zerolog.Logger
	now      func() time.Time
	rand     func() float64

	// cur is the declarations and their state as of the last Use; every
	// refresh reads it once, at its start. applyMu serialises Use.
	cur     atomic.Pointer[view]
	applyMu sync.Mutex

	stm     *stateMetrics
	oneShot bool

	// seq numbers loads in the order they start; writes carry it so that the
	// store refuses one whose load started before a later one's that already
	// wrote (see version.go).
	seq atomic.Int64

	// life ends at Close. The warmer's own work, which no caller's call
	// bounds (a recovery refresh), runs under it and is counted in own.
	life   context.Context
	end    context.CancelFunc
	lifeMu sync.Mutex // orders own.Add after Close's end
	own    sync.WaitGroup
}

// declState is what the warmer remembers about a declaration between runs.
type declState struct {
	mu sync.Mutex
	// declared is the member list last declared (see declare), indexed.
	// okAt holds each declared member's last successful load (unix
	// nanoseconds, 0 for none yet), which bounds its stale extension
	// (MaxStale), at the member's position in the list, so that a run's
	// batches write theirs in place, and the same list declared again is
	// recognised without a lookup per member.
	declared memberindex.Index
	okAt     []int64
	// oneOff is okAt for members loaded outside the declaration (admin
	// refreshes, access-log pre-warms, members that left): kept only while a
	// value of theirs can still be alive, and at most MaxOneOffMembers of them.
	oneOff *oneOffState
	// evicted counts one-off members evicted since the last noteState.
	evicted int
	// members is the last member list that loaded, reused if listing fails.
	members []string
	// membersClean: members is the listing as it came, nothing skipped or
	// repeated, so that an equal listing can reuse it as it is.
	membersClean bool
	// lastRunOK is the end of the last run in which every member loaded.
	lastRunOK time.Time
	errors    int64
	lastErr   string
	// negative holds the members last written as the not-found sentinel,
	// re-checked every NegativeInterval (see negative.go).
	negative map[string]bool
	// hot is the family's hot set, sorted (package hotset ranks it).
	hot []string
	// failing is true while the last run did not end ok (see recover.go).
	failing bool
	// inflight holds the members a batch of a plain declaration is loading
	// and writing. A version-checked declaration (Stamped) orders its
	// writes in Redis: a write never replaces a value its record says is
	// newer. A plain one has no record, and several paths load its members
	// at once — the schedule, the origin's recovery (RefreshFailing), a
	// re-warm, the catch-up, an admin refresh, the negative re-check — so a
	// load that read an older row could land after one that read a newer row
	// (the soak saw 14 keys go back a version when a recovery refresh
	// overlapped a scheduled run whose writes were slow). A batch claims its
	// members first, so the later load of a member begins after the earlier
	// one's write returned, and lands after it. A one-shot warmer has none of
	// those paths: its one pre-warm loads each member once, and claims none.
	inflight claims.Set
}

// New builds a Warmer.
func New(opts Options) (*Warmer, error) {
	if opts.Store == nil {
		return nil, errors.New("warmer: no store")
	}
	if opts.MaxConcurrentLoads <= 0 {
		opts.MaxConcurrentLoads = 8
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Rand == nil {
		opts.Rand = defaultRand
	}
	w := &Warmer{
		store:    opts.Store,
		gate:     opts.Gate,
		sources:  opts.Sources,
		loads:    semaphore.NewWeighted(int64(opts.MaxConcurrentLoads)),
		maxLoads: opts.MaxConcurrentLoads,
		decl:     newDeclMetrics(opts.Registerer),
		log:      opts.Logger.With().Str("component", "warmer").Logger(),
		now:      opts.Now,
		rand:     opts.Rand,
		stm:      newStateMetrics(opts.Registerer),
		oneShot:  opts.OneShot,
	}
	w.metrics = newMetrics(opts.Registerer, w.log, opts.Now)
	d, err := w.Declare(opts.Specs)
	if err != nil {
		return nil, fmt.Errorf("warmer: %w", err)
	}
	st := make(map[string]*declState, d.Len())
	for _, s := range d.specs {
		st[s.Name] = newDeclState(s)
		w.decl.set(s)
	}
	w.cur.Store(&view{decl: d, state: st})
	w.life, w.end = context.WithCancel(context.Background())
	w.watchRecoveries(opts.Sources)
	return w, nil
}

// Close ends the warmer's own work — a recovery refresh in progress is
// abandoned, a later recovery refreshes nothing — and returns once it has.
// What callers run (Refresh, the schedule's runs) is theirs to end.
func (w *Warmer) Close() {
	w.lifeMu.Lock()
	w.end()
	w.lifeMu.Unlock()
	w.own.Wait()
}

// owned runs fn on the caller's goroutine as the warmer's own work: under ctx
// and until Close, which waits for it. After Close it does not run fn.
func (w *Warmer) owned(ctx context.Context, fn func(context.Context)) {
	w.lifeMu.Lock()
	if w.life.Err() != nil {
		w.lifeMu.Unlock()
		return
	}
	w.own.Add(1)
	w.lifeMu.Unlock()
	defer w.own.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(w.life, cancel)()
	fn(ctx)
}

// Specs returns the declarations in their declared order.
func (w *Warmer) Specs() []*Spec { return w.cur.Load().decl.Specs() }

// PrepareLoads gets the sources of specs ready for n loads at once
// (Preparer; at most MaxConcurrentLoads), all sources together, and returns
// when they are ready or have given up.
func (w *Warmer) PrepareLoads(ctx context.Context, specs []*Spec, n int) {
	n = min(n, w.maxLoads)
	by := map[string][]*Spec{}
	for _, s := range specs {
		by[s.Source] = append(by[s.Source], s)
	}
	var wg sync.WaitGroup
	for name, ss := range by {
		if p, ok := w.sources[name].(Preparer); ok && n > 0 {
			wg.Go(func() { p.Prepare(ctx, ss, n) })
		}
	}
	wg.Wait()
}

// Spec returns the declaration with the given name.
func (w *Warmer) Spec(name string) (*Spec, bool) {
	s, _, ok := w.lookup(name)
	return s, ok
}

// RunOptions shapes one refresh run.
type RunOptions struct {
	// Planned is when the run was meant to start; lag is measured against it.
	Planned time.Time
	// Spread paces a family's batches evenly over this duration, so that the
	// origin sees a steady rate rather than a burst; zero loads as fast as the
	// concurrency bound allows.
	Spread time.Duration
	// Drain, when closed, stops the run from starting further batches; the
	// batches already started finish (their context still bounds them).
	Drain <-chan struct{}
	// KnownMembers runs a members_query family on the members of its last
	// listing, when there is one, without listing them again: a re-warm,
	// where Redis lost its data and the origin did not lose its rows, and
	// the listing's round trip would only delay every key (the next
	// scheduled run lists again).
	KnownMembers bool
}

// Outcome counts what one run did.
type Outcome struct {
	Members   int
	Written   int
	Negative  int
	Failed    int
	Extended  int
	Skipped   int
	Duration  time.Duration
	LastError error
	// NotRun is how many members' batches never started: the run was
	// drained (shutdown) or its context ended first. Their keys were not
	// written and their staleness is not reset.
	NotRun int
	// Present is how many keys a set-if-absent store (PrewarmStore) found
	// holding a value and left alone; Fenced how many of the Failed it
	// refused because a newer leader's epoch fences the writer.
	Present int
	Fenced  int
}

// Refresh runs one refresh of a declaration: list members, load them in batches,
// write values and sentinels, keep failed members' old values alive.
func (w *Warmer) Refresh(ctx context.Context, name string, ro RunOptions) (Outcome, error) {
	spec, st, ok := w.lookup(name)
	if !ok {
		return Outcome{}, fmt.Errorf("refresh %q: %w", name, ErrUnknownSpec)
	}
	start := w.now()
	if !ro.Planned.IsZero() {
		w.metrics.lag.WithLabelValues(name).Observe(max(0, start.Sub(ro.Planned)).Seconds())
	}
	members, skipped, err := w.members(ctx, spec, st, ro.KnownMembers)
	out := Outcome{Members: len(members), Skipped: skipped}
	if err != nil {
		out.LastError = err
	} else {
		st.pruneNegatives(members)
		w.declare(spec, st, members)
	}
	if spec.Template.IsFamily() {
		w.metrics.members.WithLabelValues(name).Set(float64(len(members)))
	} else {
		w.metrics.members.WithLabelValues(name).Set(1)
	}

	// Oldest writes first: when the run cannot keep up, the keys closest to
	// expiry are the ones written (oldest.go).
	order := w.oldestFirst(spec, st, members)
	batches := order.batches
	// Batches are paced from when the members are known, over what is left
	// of the spread: listing a large family takes a while (a second for a
	// million rows), and planning from the run's start made every batch of
	// that second late before it could begin.
	paced := w.now()
	gap := w.paceGap(spec, ro.Spread-paced.Sub(start), len(batches))
	if gap > 0 && spec.Interval > 0 && gap*time.Duration(len(batches)) > spec.Interval {
		w.log.Warn().Str("family", name).Int("batches", len(batches)).Dur("gap_ms", gap).Dur("interval_ms", spec.Interval).
			Msg("the origin's rate bound cannot fit this family's batches in one interval: raise the source's rate or batch_size")
	}
	watch := w.metrics.behind.Watch(name, batches, order.due, paced)
	var (
		mu      sync.Mutex
		g       errgroup.Group
		started int
	)
	for i, batch := range batches {
		planned := paced.Add(time.Duration(i) * gap)
		if draining(ro.Drain) {
			break
		}
		if gap > 0 && i > 0 {
			if err := sleepUntil(ctx, ro.Drain, w.now, planned); err != nil {
				break
			}
		}
		if err := w.loads.Acquire(ctx, 1); err != nil {
			break
		}
		if gap > 0 && i > 0 {
			// Lag includes waiting for a load slot: a saturated origin shows here.
			w.metrics.lag.WithLabelValues(name).Observe(max(0, w.now().Sub(planned)).Seconds())
		}
		started += len(batch)
		watch.Begun(i)
		g.Go(func() error {
			defer w.loads.Release(1)
			o := w.refreshBatch(ctx, spec, st, batch, claims.Place{List: members, At: order.at[i]})
			watch.Completed(i, len(batch), o.Written+o.Negative > 0)
			mu.Lock()
			out.Add(o)
			mu.Unlock()
			return nil
		})
	}
	_ = g.Wait()
	out.Duration = w.now().Sub(start)
	out.NotRun = len(members) - started
	if ctx.Err() != nil && out.LastError == nil {
		out.LastError = ctx.Err()
	}
	if out.NotRun > 0 && out.LastError == nil {
		out.LastError = fmt.Errorf("refresh %s: %w: %d of %d members not refreshed", name, ErrDrained, out.NotRun, out.Members)
	}
	watch.Finish()
	w.finishRun(spec, st, &out)
	if !ro.Planned.IsZero() {
		w.metrics.behind.Overran(name, out.Duration, spec.Interval, out.Members)
	}
	return out, out.LastError
}

// Add adds b's counts to o's, and b's error if it has one.
func (o *Outcome) Add(b Outcome) {
	o.Written += b.Written
	o.Negative += b.Negative
	o.Failed += b.Failed
	o.Extended += b.Extended
	o.Skipped += b.Skipped
	o.Present += b.Present
	o.Fenced += b.Fenced
	if b.LastError != nil {
		o.LastError = b.LastError
	}
}

// runResult names how a run ended, for hearth_refresh_runs_total{result}:
// ok (every member refreshed), error (failures, nothing written), partial
// (some written, some failed or never started), aborted (cut short by a
// shutdown or the end of the term before anything failed or was written).
// Only ok resets the declaration's staleness.
func runResult(out *Outcome) string {
	done := out.Written + out.Negative
	failed := out.Failed > 0 || (out.LastError != nil && !cutShort(out.LastError))
	switch {
	case failed && done == 0:
		return "error"
	case failed:
		return "partial"
	case out.NotRun > 0 || out.LastError != nil:
		if done == 0 {
			return "aborted"
		}
		return "partial"
	}
	return "ok"
}

// cutShort reports whether err only says that the run was stopped from
// outside (drained, or its context ended), not that anything failed.
func cutShort(err error) bool {
	return errors.Is(err, ErrDrained) || errors.Is(err, context.Canceled)
}

func (w *Warmer) finishRun(spec *Spec, st *declState, out *Outcome) {
	end := w.now()
	result := runResult(out)
	w.metrics.runs.WithLabelValues(spec.Name, result).Inc()
	w.metrics.runDuration.WithLabelValues(spec.Name).Observe(out.Duration.Seconds())
	st.mu.Lock()
	defer st.mu.Unlock()
	st.failing = result == "error" || result == "partial"
	if result == "ok" {
		st.lastRunOK = end
		w.metrics.lastSuccess.WithLabelValues(spec.Name).Set(float64(end.UnixNano()) / 1e9)
		w.metrics.staleness.WithLabelValues(spec.Name).Set(0)
		return
	}
	st.errors++
	if out.LastError != nil {
		st.lastErr = out.LastError.Error()
	}
	if !st.lastRunOK.IsZero() {
		w.metrics.staleness.WithLabelValues(spec.Name).Set(end.Sub(st.lastRunOK).Seconds())
	}
	w.log.Warn().Str("family", spec.Name).Str("result", result).Int("failed", out.Failed).
		Int("not_run", out.NotRun).Int("extended", out.Extended).AnErr("error", out.LastError).Msg("refresh incomplete")
}

// members returns the validated, de-duplicated members of a declaration (nil
// slice with one nil batch for a single key) and how many were skipped. With
// known, a members_query family that was listed before gets that listing's
// members without a query (RunOptions.KnownMembers).
func (w *Warmer) members(ctx context.Context, spec *Spec, st *declState, known bool) ([]string, int, error) {
	if !spec.Template.IsFamily() {
		return []string{""}, 0, nil
	}
	raw := spec.Members
	var listErr error
	if known && spec.MembersQuery != "" {
		st.mu.Lock()
		prev := st.members
		st.mu.Unlock()
		if prev != nil {
			return w.withHot(spec, st, prev, nil), 0, nil
		}
	}
	if spec.MembersQuery != "" {
		lister, ok := w.sources[spec.Source].(MemberLister)
		if !ok {
			return nil, 0, fmt.Errorf("list members of %s: source %s cannot list members", spec.Name, spec.Source)
		}
		// The last listing, if it came through unchanged, is the lister's hint.
		var prev []string
		st.mu.Lock()
		if st.membersClean {
			prev = st.members
		}
		st.mu.Unlock()
		lctx, cancel := context.WithTimeout(ctx, spec.LoadTimeout)
		list, err := lister.ListMembers(lctx, spec, prev)
		cancel()
		if err != nil {
			listErr = fmt.Errorf("list members of %s: %w", spec.Name, err)
			w.metrics.failures.WithLabelValues(spec.Name, reason(err)).Inc()
			st.mu.Lock()
			raw = st.members
			st.mu.Unlock()
			if raw == nil {
				return nil, 0, listErr
			}
		} else {
			raw = list
		}
	}
	// A members query that lists what it listed last time (the usual case)
	// reuses that validated list: no set of a million members is rebuilt and
	// collected every run.
	if listErr == nil && spec.MembersQuery != "" {
		st.mu.Lock()
		prev, clean := st.members, st.membersClean
		st.mu.Unlock()
		if clean && len(prev) > 0 && slices.Equal(prev, raw) {
			return w.withHot(spec, st, prev, nil), 0, nil
		}
	}
	seen := make(map[string]struct{}, len(raw))
	out := make([]string, 0, len(raw))
	skipped := 0
	for _, m := range raw {
		if err := spec.Template.ValidateMember(m); err != nil {
			skipped++
			w.metrics.failures.WithLabelValues(spec.Name, "bad_member").Inc()
			w.log.Debug().Str("family", spec.Name).Err(err).Msg("member skipped")
			continue
		}
		if _, dup := seen[m]; dup {
			continue
		}
		seen[m] = struct{}{}
		out = append(out, m)
	}
	if listErr == nil && spec.MembersQuery != "" {
		st.mu.Lock()
		st.members = out
		st.membersClean = len(out) == len(raw)
		st.mu.Unlock()
	}
	return w.withHot(spec, st, out, seen), skipped, listErr
}

// withHot adds the hot set's members (validated when they were promoted) to
// a family's other members; seen, when not nil, holds those (else they are
// looked up in a set built here, only when there is a hot set).
func (w *Warmer) withHot(spec *Spec, st *declState, out []string, seen map[string]struct{}) []string {
	st.mu.Lock()
	hot := st.hotMembers(spec)
	st.mu.Unlock()
	if len(hot) == 0 {
		return out
	}
	if seen == nil {
		seen = make(map[string]struct{}, len(out))
		for _, m := range out {
			seen[m] = struct{}{}
		}
	}
	out = slices.Clip(out) // the cached list stays the query's own
	for _, m := range hot {
		if _, dup := seen[m]; !dup {
			seen[m] = struct{}{} // a run's members are distinct (loadAndWrite relies on it)
			out = append(out, m)
		}
	}
	return out
}

// Batches cuts members into the declaration's batches, in order.
func (s *Spec) Batches(members []string) [][]string {
	size := s.BatchSize
	if size <= 0 {
		size = len(members)
	}
	var out [][]string
	for len(members) > 0 {
		n := min(size, len(members))
		out = append(out, members[:n:n])
		members = members[n:]
	}
	return out
}

// RefreshMembers loads and writes one set of members of a declaration (a single
// key is the member ""), with the global load bound held by the caller or not.
func (w *Warmer) RefreshMembers(ctx context.Context, name string, members []string) (Outcome, error) {
	spec, st, ok := w.lookup(name)
	if !ok {
		return Outcome{}, fmt.Errorf("refresh %q: %w", name, ErrUnknownSpec)
	}
	start := w.now()
	if err := w.loads.Acquire(ctx, 1); err != nil {
		return Outcome{}, err
	}
	defer w.loads.Release(1)
	o := w.refreshBatch(ctx, spec, st, members, claims.Place{})
	// As a run's: the wall time, waiting for a load slot included.
	o.Duration = w.now().Sub(start)
	return o, o.LastError
}

// refreshBatch loads one batch, at place p of the members a run declared (the
// zero place: not in a run's list), and writes the outcome. It never returns early
// on a bad member: each member's fate is decided alone.
func (w *Warmer) refreshBatch(ctx context.Context, spec *Spec, st *declState, batch []string, p claims.Place) Outcome {
	ws := w.store
	if w.gate != nil {
		admitted, err := w.gate.Admit(ctx)
		if err != nil {
			return Outcome{Skipped: len(batch), LastError: fmt.Errorf("refresh %s: %w", spec.Name, err)}
		}
		ws = admitted
	}
	return w.loadAndWrite(ctx, ws, spec, st, batch, nil, p)
}

// loadAndWrite loads one admitted batch (p as refreshBatch's) and writes the
// outcome through ws. Members whose write a version record refused although
// their values did not back it are re-read once, at once: unconfirmed, in
// that re-read, holds those records by key (the store replaces one the
// re-read does not confirm).
func (w *Warmer) loadAndWrite(ctx context.Context, ws Store, spec *Spec, st *declState, batch []string, unconfirmed map[string]string, p claims.Place) Outcome {
	out := Outcome{}
	var req []string
	if spec.Template.IsFamily() {
		req = batch
	}
	release := func() {}
	if !Stamped(spec) && !w.oneShot {
		r, err := st.inflight.Claim(ctx, batch, p)
		if err != nil {
			return Outcome{Skipped: len(batch), LastError: fmt.Errorf("refresh %s: %w", spec.Name, err)}
		}
		release = r
	}
	defer release()
	seq := w.seq.Add(1)
	t0 := w.now()
	results, err := w.load(ctx, spec, req)
	w.metrics.loadDuration.WithLabelValues(spec.Source, loadResult(err)).Observe(w.now().Sub(t0).Seconds())

	now := w.now()
	var (
		entries []store.Entry
		okm     []string
		okPos   []int32
		negm    []string
		failed  []string
	)
	if err != nil {
		err = fmt.Errorf("load %s (%d members) from %s: %w", spec.Name, len(batch), spec.Source, err)
		w.metrics.failures.WithLabelValues(spec.Name, reason(err)).Add(float64(len(batch)))
		out.Failed = len(batch)
		out.LastError = err
		failed = batch
	} else {
		entries, okm = make([]store.Entry, 0, len(batch)), make([]string, 0, len(batch))
		// answered[i] says the member at position i was answered; okPos[i]
		// is okm[i]'s position. A member's position is its first in the
		// batch (another caller's batch may repeat one). The origin usually
		// answers in the order asked (a scheduled run's batch, whose known
		// place says its members are distinct, or a batch of ids in index
		// order): an answer is first compared with the next member, and the
		// index is built only when one comes out of that order. Without a
		// known place, members matched in order must rise strictly
		// (MemberRises), so that none of them is a repeat.
		answered := make([]bool, len(batch))
		nAnswered := 0
		var index map[string]int32
		next := 0 // the member the next answer is expected for
		position := func(m string) (int32, bool) {
			if next < len(batch) && batch[next] == m && (next == 0 || p.Known() || MemberRises(batch[next-1], m)) {
				next++
				return int32(next - 1), true
			}
			next = len(batch)
			if index == nil {
				index = make(map[string]int32, len(batch))
				for i := len(batch) - 1; i >= 0; i-- {
					index[batch[i]] = int32(i)
				}
			}
			q, ok := index[m]
			return q, ok
		}
		okPos = make([]int32, 0, len(batch))
		foreign := false
		for _, r := range results {
			pos, asked := position(r.Member)
			if !asked || answered[pos] {
				// Not asked for, or already answered: never written.
				w.metrics.failures.WithLabelValues(spec.Name, "unexpected_member").Inc()
				if !asked && !foreign {
					foreign = true
					w.log.Debug().Str("family", spec.Name).Str("answered", r.Member).
						Msg("the origin answered for a member not asked for (does the query rewrite its member?); members without an answer are not written as not found")
				}
				continue
			}
			answered[pos] = true
			nAnswered++
			if r.Err == nil && !r.Missing && spec.MaxValueBytes > 0 && len(r.Value) > spec.MaxValueBytes {
				r.Err = fmt.Errorf("%w: %d bytes, max_value_bytes is %d", ErrTooLarge, len(r.Value), spec.MaxValueBytes)
			}
			switch {
			case r.Err != nil:
				w.metrics.failures.WithLabelValues(spec.Name, reason(r.Err)).Inc()
				out.Failed++
				out.LastError = fmt.Errorf("load %s from %s: %w", spec.Template.Key(r.Member), spec.Source, r.Err)
				w.log.Debug().Str("family", spec.Name).Str("reason", reason(r.Err)).Err(out.LastError).Msg("member not refreshed")
				failed = append(failed, r.Member)
			case r.Missing:
				entries = append(entries, w.negative(spec))
				out.Negative++
				okm, okPos = append(okm, r.Member), append(okPos, pos)
				negm = append(negm, r.Member)
			default:
				e := store.Entry{Value: r.Value, TTL: spec.JitteredTTL(w.rand())}
				if spec.VersionColumn != "" && r.HasVersion {
					e.Versioned, e.Version = true, r.Version
				}
				entries = append(entries, e)
				out.Written++
				okm, okPos = append(okm, r.Member), append(okPos, pos)
			}
		}
		for i, m := range batch {
			if nAnswered == len(batch) {
				break // every position answered: no member left without an answer
			}
			j := i
			if !p.Known() && (index != nil || i >= next) {
				// A repeated member's state is its first's; the members
				// before next were matched in order, each at its first.
				q, _ := position(m)
				j = int(q)
			}
			if answered[j] {
				continue
			}
			answered[j] = true
			if foreign {
				// The origin answered under a name nobody asked for (a query
				// that rewrites its member: 01 answered as 1): the answer may
				// be this member's, so it is not written as not found.
				w.metrics.failures.WithLabelValues(spec.Name, "ambiguous").Inc()
				out.Failed++
				out.LastError = fmt.Errorf("load %s from %s: no answer, and the origin answered for members not asked for: not written as not found", spec.Template.Key(m), spec.Source)
				failed = append(failed, m)
				continue
			}
			entries = append(entries, w.negative(spec))
			out.Negative++
			okm, okPos = append(okm, m), append(okPos, int32(i))
			negm = append(negm, m)
		}
	}

	var recheck []string
	var records map[string]string
	if len(entries) > 0 {
		keysOf(spec.Template, entries, okm)
		w.stamp(spec, entries, seq)
		for i := range entries {
			entries[i].Unconfirmed = unconfirmed[entries[i].Key]
		}
		if res, checks, werr := w.write(ctx, ws, entries); werr != nil {
			w.metrics.redisErrors.WithLabelValues("set").Inc()
			out.LastError = fmt.Errorf("write %s: %w", spec.Name, werr)
			out.Written, out.Negative = 0, 0
			out.Failed += len(okm)
			okm, negm = nil, nil
		} else {
			if checks != nil {
				recheck, records = w.noteChecks(spec, entries, okm, checks, unconfirmed == nil)
				okm, negm = withoutRechecked(&out, okm, negm, recheck)
				if unconfirmed != nil && len(recheck) > 0 {
					// Refused again after the re-read (the record changed
					// meanwhile): not warm, left to the next run.
					w.metrics.failures.WithLabelValues(spec.Name, "version_refused").Add(float64(len(recheck)))
					out.Failed += len(recheck)
					out.LastError = fmt.Errorf("write %s: %d keys refused by version records their values do not back, after a re-read", spec.Name, len(recheck))
					recheck = nil
				}
			}
			okm, negm, _ = settle(&out, spec, entries, res, okm, negm)
			w.metrics.keysWritten.WithLabelValues(spec.Name, "value").Add(float64(out.Written))
			w.metrics.keysWritten.WithLabelValues(spec.Name, "negative").Add(float64(out.Negative))
		}
	}
	release() // the write returned: a later load of these members may begin
	st.mu.Lock()
	// okPos still says where okm's members are unless okm was filtered.
	positional := p.Known() && len(okPos) == len(okm)
	for i, m := range okm {
		if w.oneShot {
			break
		}
		if positional {
			st.setLastOKAt(spec, p.At+int(okPos[i]), m, now.UnixNano())
		} else {
			st.setLastOK(spec, m, now.UnixNano())
		}
	}
	st.noteNegatives(okm, negm)
	w.noteState(spec.Name, st)
	st.mu.Unlock()
	if len(failed) > 0 {
		out.Extended = w.extendStale(ctx, ws, spec, st, failed, now)
	}
	if len(recheck) > 0 {
		out.Add(w.loadAndWrite(ctx, ws, spec, st, recheck, records, claims.Place{}))
	}
	return out
}

// keysOf sets entries[i].Key to t's key of members[i], all of them cut from
// one string: a batch's keys cost one allocation, not one each.
func keysOf(t keytmpl.Template, entries []store.Entry, members []string) {
	if !t.IsFamily() {
		for i := range entries {
			entries[i].Key = t.String()
		}
		return
	}
	prefix, suffix := t.Literals()
	size := 0
	for _, m := range members {
		size += len(prefix) + len(m) + len(suffix)
	}
	buf := make([]byte, 0, size)
	for _, m := range members {
		buf = append(append(append(buf, prefix...), m...), suffix...)
	}
	all, at := string(buf), 0
	for i, m := range members {
		n := len(prefix) + len(m) + len(suffix)
		entries[i].Key = all[at : at+n]
		at += n
	}
}

// noteChecks counts what a version-checked write found wrong at its keys
// (entries[i] is members[i]'s), logs it once per reason with the first key and
// how many, and returns the members to re-read (reread) or left refused, with
// the records that refused them.
func (w *Warmer) noteChecks(spec *Spec, entries []store.Entry, members []string, checks []store.VersionCheck, reread bool) ([]string, map[string]string) {
	type found struct {
		n          int
		key, found string
		recheck    bool
	}
	var (
		by      map[string]*found
		again   []string
		records map[string]string
	)
	for i, c := range checks {
		if c.Reason == "" || i >= len(entries) {
			continue
		}
		w.metrics.versionRepairs.WithLabelValues(spec.Name, c.Reason).Inc()
		if by == nil {
			by = make(map[string]*found, 2)
		}
		f := by[c.Reason]
		if f == nil {
			f = &found{key: entries[i].Key, found: c.Found, recheck: c.Recheck}
			by[c.Reason] = f
		}
		f.n++
		if c.Recheck && i < len(members) {
			if records == nil {
				records = make(map[string]string)
			}
			again = append(again, members[i])
			records[entries[i].Key] = c.Record
		}
	}
	for _, reason := range []string{store.RepairValueMismatch, store.RepairValueAbsent, store.RepairRecordUnconfirmed, store.RepairRecordMalformed} {
		f := by[reason]
		if f == nil {
			continue
		}
		msg := "foreign version record: treated as absent and replaced"
		switch {
		case f.recheck && reread:
			msg = "a version record refused the write but its value does not back it: re-reading the origin"
		case f.recheck:
			msg = "a version record refused the re-read's write but its value does not back it: left to the next run"
		case reason == store.RepairValueMismatch:
			msg = "the value was not the bytes hearth wrote: replaced with the origin's"
		case reason == store.RepairRecordUnconfirmed:
			msg = "a version record the origin does not confirm (its version is above the origin's, read after it): replaced"
		}
		w.log.Warn().Str("family", spec.Name).Str("reason", reason).Str("key", f.key).Str("found", f.found).
			Int("keys", f.n).Msg(msg)
	}
	return again, records
}

// withoutRechecked takes the members to re-read out of a batch's written and
// negative members and counts: their write was refused, the re-read writes
// and counts them.
func withoutRechecked(out *Outcome, okm, negm, recheck []string) (ok, neg []string) {
	if len(recheck) == 0 {
		return okm, negm
	}
	drop := make(map[string]bool, len(recheck))
	for _, m := range recheck {
		drop[m] = true
	}
	isDropped := func(m string) bool { return drop[m] }
	ok, neg = without(okm, isDropped), without(negm, isDropped)
	out.Negative -= len(negm) - len(neg)
	out.Written -= (len(okm) - len(ok)) - (len(negm) - len(neg))
	return ok, neg
}

// load calls the origin within the declaration's load timeout. A panicking
// source fails its batch instead of the daemon.
func (w *Warmer) load(ctx context.Context, spec *Spec, members []string) (results []Result, err error) {
	ctx, cancel := context.WithTimeout(ctx, spec.LoadTimeout)
	defer cancel()
	w.metrics.inFlight.Inc()
	defer w.metrics.inFlight.Dec()
	defer func() {
		if p := recover(); p != nil {
			results, err = nil, fmt.Errorf("%w: source %s: panic: %v", ErrOrigin, spec.Source, p)
		}
	}()
	return w.sources[spec.Source].Load(ctx, spec, members)
}

// extendStale keeps failed members' existing values alive, never past MaxStale
// after their last successful load. A member never loaded by this process gets
// its budget from the first failure seen.
func (w *Warmer) extendStale(ctx context.Context, ws Store, spec *Spec, st *declState, failed []string, now time.Time) int {
	if spec.MaxStale <= 0 {
		return 0
	}
	keys := make([]string, 0, len(failed))
	ttls := make([]time.Duration, 0, len(failed))
	st.mu.Lock()
	for _, m := range failed {
		last := st.lastSuccess(m)
		if last == 0 {
			last = now.UnixNano()
			st.setLastOK(spec, m, last)
		}
		budget := time.Unix(0, last).Add(spec.MaxStale).Sub(now)
		if budget <= 0 {
			continue
		}
		keys = append(keys, spec.Template.Key(m))
		ttls = append(ttls, min(spec.JitteredTTL(w.rand()), budget))
	}
	w.noteState(spec.Name, st)
	st.mu.Unlock()
	if len(keys) == 0 {
		return 0
	}
	kept, err := ws.Extend(ctx, keys, ttls)
	if err != nil {
		w.metrics.redisErrors.WithLabelValues("extend").Inc()
		w.log.Warn().Str("family", spec.Name).Err(err).Msg("stale extension failed")
		return 0
	}
	n := 0
	for _, k := range kept {
		if k {
			n++
		}
	}
	w.metrics.staleExtended.WithLabelValues(spec.Name).Add(float64(n))
	return n
}

func loadResult(err error) string {
	if err == nil {
		return "ok"
	}
	return reason(err)
}

// RefreshAll refreshes every declaration once, as fast as the load bound allows;
// it is the start-up load that precedes readiness. It returns the errors of the
// declarations that did not fully load.
func (w *Warmer) RefreshAll(ctx context.Context) error {
	return each(w.names(), func(name string) error {
		_, err := w.Refresh(ctx, name, RunOptions{})
		return err
	})
}

// RefreshWhere refreshes, once and unpaced, the members of every declaration
// whose key keep accepts (a re-warm of one Cluster master's slots); a nil keep
// refreshes every member. It is the re-warm's: members come from the
// declaration's list, or from its query's last listing (RunOptions.KnownMembers;
// the query when it has not run yet).
func (w *Warmer) RefreshWhere(ctx context.Context, keep func(key string) bool) error {
	if keep == nil {
		return each(w.names(), func(name string) error {
			_, err := w.Refresh(ctx, name, RunOptions{KnownMembers: true})
			return err
		})
	}
	return each(w.names(), func(name string) error {
		spec, st, ok := w.lookup(name)
		if !ok {
			return nil
		}
		members, _, err := w.members(ctx, spec, st, true)
		var mine []string
		for _, m := range members {
			if keep(spec.Template.Key(m)) {
				mine = append(mine, m)
			}
		}
		return errors.Join(err, each(spec.Batches(mine), func(batch []string) error {
			_, err := w.RefreshMembers(ctx, name, batch)
			return err
		}))
	})
}

// each runs fn on every item concurrently (the load bound paces the loads)
// and joins the errors, sorted so that the same failures read the same.
func each[T any](items []T, fn func(T) error) error {
	var (
		mu   sync.Mutex
		errs []error
		g    errgroup.Group
	)
	for _, it := range items {
		g.Go(func() error {
			if err := fn(it); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait()
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return errors.Join(errs...)
}

// Status is what the warmer knows of one declaration.
type Status struct {
	Name       string    `json:"name"`
	Key        string    `json:"key"`
	Interval   string    `json:"interval"`
	LastOK     time.Time `json:"last_success"`
	Errors     int64     `json:"errors"`
	LastError  string    `json:"last_error,omitempty"`
	Staleness  string    `json:"staleness"`
	NumMembers int       `json:"members"`
}

// Status reports every declaration's state, in declared order.
func (w *Warmer) Status() []Status {
	now := w.now()
	v := w.cur.Load()
	out := make([]Status, 0, v.decl.Len())
	for _, s := range v.decl.specs {
		n, st := s.Name, v.state[s.Name]
		st.mu.Lock()
		stale := time.Duration(0)
		if st.errors > 0 && !st.lastRunOK.IsZero() {
			stale = now.Sub(st.lastRunOK)
		}
		members := st.declared.Len()
		if !s.Template.IsFamily() {
			members = 1
		}
		out = append(out, Status{
			Name: n, Key: s.Template.String(), Interval: s.Interval.String(),
			LastOK: st.lastRunOK, Errors: st.errors, LastError: st.lastErr,
			Staleness: stale.Round(time.Millisecond).String(), NumMembers: members,
		})
		st.mu.Unlock()
	}
	return out
}

// ErrDrained: a run stopped starting batches because the scheduler is
// shutting down; the members it did not reach keep their old values.
var ErrDrained = errors.New("cut short by shutdown")

func draining(drain <-chan struct{}) bool {
	select {
	case <-drain:
		return true
	default:
		return false
	}
}

func sleepUntil(ctx context.Context, drain <-chan struct{}, now func() time.Time, t time.Time) error {
	d := t.Sub(now())
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-drain:
		return ErrDrained
	case <-timer.C:
		return nil
	}
}
