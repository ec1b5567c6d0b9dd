// Package catchup is what a new leader does before (or while) its schedule
// resumes: it reads the remaining TTL of every declared key and at once
// refreshes those that are missing or would expire before this instance's
// schedule rewrites them. It sees the warmer through Engine.
package catchup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hearth-dev/hearth/warmer"
)

// Engine is what a catch-up needs of the warmer (warmer.Warmer has it).
type Engine interface {
	Specs() []*warmer.Spec
	// Members lists a declaration's members as a run does.
	Members(ctx context.Context, name string) ([]string, error)
	// PTTLs reads keys' remaining lifetimes: -2 for a missing key, -1 for
	// one without expiry.
	PTTLs(ctx context.Context, keys []string) ([]time.Duration, error)
	// RefreshBatches refreshes batches within the load bound, started in
	// the order given.
	RefreshBatches(ctx context.Context, batches []warmer.Batch) ([]warmer.Outcome, error)
}

// Result counts what a catch-up did.
type Result struct {
	// Checked is how many keys had their TTL read.
	Checked int
	// Due is how many were missing or about to expire.
	Due int
	// Refreshed is how many of those were written (values and sentinels).
	Refreshed int
	// Failed is how many could not be loaded or written.
	Failed int
	// Unscheduled is how many declarations had no known next run, and so
	// the conservative horizon (see Horizon).
	Unscheduled int
	// Horizon is the longest horizon used: a key with less TTL left than its
	// horizon was due.
	Horizon time.Duration
}

// Schedule tells when this instance's schedule next starts a run of a
// declaration (jobs.Scheduler does).
type Schedule interface {
	// NextRun returns the start of the declaration's next scheduled run at
	// or after now, or false if the declaration is not scheduled (yet).
	NextRun(name string) (time.Time, bool)
}

// Options says when this instance's schedule will really write each key.
type Options struct {
	// Schedule is this instance's schedule; nil means unknown for every
	// declaration.
	Schedule Schedule
	// Spread is the fraction of the interval a family's batches are paced
	// over (refresh.spread), as the scheduler paces them.
	Spread float64
}

// Slack covers what the horizon cannot know: a late timer, a wait for a load
// slot, the write's round trip, a member list that moved by a batch.
const Slack = 250 * time.Millisecond

// Horizon is how long a key of spec may have left to live and still be
// rewritten by this instance's schedule before it expires: the time until the
// batch-th of batches paced batches of the next run is sent (the run starts at
// next, batches are spread evenly over spread × interval), its load timeout,
// and Slack. When the next run is not known (known false: the declaration is
// not scheduled yet), it assumes the worst: a full interval, then the whole
// spread, then the load timeout. A spread outside [0, 1] (NaN included, which
// config validation should have refused) counts as the whole interval: never
// a shorter horizon.
func Horizon(spec *warmer.Spec, now, next time.Time, known bool, spread float64, batch, batches int) time.Duration {
	if !(spread >= 0 && spread <= 1) {
		spread = 1
	}
	pace := time.Duration(float64(spec.Interval) * spread)
	if !known {
		return spec.Interval + pace + spec.LoadTimeout + Slack
	}
	var gap time.Duration
	if batches > 1 && pace > 0 {
		gap = pace / time.Duration(batches)
	}
	// One gap more than the batch's own start: the batch's load begins at its
	// paced time and the member may sit one batch later in the next run's list.
	return max(0, next.Sub(now)) + time.Duration(min(batch+1, max(batches, 1)))*gap + spec.LoadTimeout + Slack
}

// dueBatch is one batch of keys a catch-up reloads; soonest is the least TTL
// any of its keys has left (missing keys count as already expired).
type dueBatch struct {
	warmer.Batch
	soonest time.Duration
}

// Run reads the remaining TTL of every declared key (a family's members
// included), pipelined, and at once refreshes those that are missing or would
// expire before this instance's schedule rewrites them (see Horizon). The due
// keys are loaded soonest-to-expire first, across declarations, in batches
// under the warmer's load bound. So neither the gap a crashed leader leaves
// nor the batches a drained leader skipped let a hot key expire, and a
// takeover does not reload keys that are still fresh. Each batch carries its
// soonest TTL end, so that a catch-up too slow for the TTLs it races (a
// start-up load that took longer than an interval, say) warns and counts as
// a run falling behind does.
func Run(ctx context.Context, e Engine, opts Options) (Result, error) {
	var (
		res  Result
		errs []error
		due  []dueBatch
	)
	for _, spec := range e.Specs() {
		name := spec.Name
		members, err := e.Members(ctx, name)
		if errors.Is(err, warmer.ErrUnknownSpec) {
			continue // removed by a reload meanwhile
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("catch up %s: %w", name, err))
			if len(members) == 0 {
				continue
			}
		}
		keys := make([]string, len(members))
		for i, m := range members {
			keys[i] = spec.Template.Key(m)
		}
		// Now is taken before the TTLs are read: a key's end (now + its TTL
		// left) is then not later than the truth (but for PTTL's whole
		// milliseconds), nor the horizon shorter.
		now := time.Now()
		ttls, err := e.PTTLs(ctx, keys)
		if err != nil {
			errs = append(errs, fmt.Errorf("catch up %s: %w", name, err))
			continue
		}
		var (
			next  time.Time
			known bool
		)
		if opts.Schedule != nil {
			next, known = opts.Schedule.NextRun(name)
		}
		if !known {
			res.Unscheduled++
		}
		size := spec.BatchSize
		if size <= 0 {
			size = max(1, len(members))
		}
		batches := (len(members) + size - 1) / size
		type dueKey struct {
			member string
			left   time.Duration
		}
		var stale []dueKey
		for i, d := range ttls {
			// A listed family's order may change between runs: assume its
			// last batch.
			batch := batches - 1
			if spec.MembersQuery == "" {
				batch = i / size
			}
			h := Horizon(spec, now, next, known, opts.Spread, batch, batches)
			res.Horizon = max(res.Horizon, h)
			switch {
			case d == -2:
				stale = append(stale, dueKey{members[i], -1})
			case d >= 0 && d < h:
				stale = append(stale, dueKey{members[i], d})
			}
		}
		res.Checked += len(keys)
		res.Due += len(stale)
		slices.SortStableFunc(stale, func(a, b dueKey) int { return cmp.Compare(a.left, b.left) })
		for len(stale) > 0 {
			n := min(size, len(stale))
			b := dueBatch{Batch: warmer.Batch{Name: name, Members: make([]string, n), Due: now.Add(stale[0].left).UnixNano()}, soonest: stale[0].left}
			for i := range n {
				b.Members[i] = stale[i].member
			}
			due = append(due, b)
			stale = stale[n:]
		}
	}
	// Hottest first: the batch whose key expires soonest goes first, whatever
	// its declaration.
	slices.SortStableFunc(due, func(a, b dueBatch) int { return cmp.Compare(a.soonest, b.soonest) })
	batches := make([]warmer.Batch, len(due))
	for i, b := range due {
		batches[i] = b.Batch
	}
	outs, err := e.RefreshBatches(ctx, batches)
	for i, o := range outs {
		if o.Members == 0 {
			continue // not started
		}
		res.Refreshed += o.Written + o.Negative
		res.Failed += len(batches[i].Members) - o.Written - o.Negative
		if o.LastError != nil {
			errs = append(errs, o.LastError)
		}
	}
	if err != nil {
		errs = append(errs, err)
	}
	return res, errors.Join(errs...)
}
