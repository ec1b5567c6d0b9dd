package warmer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

// TTLReader is a Store that can read keys' remaining time to live, which the
// takeover catch-up needs.
type TTLReader interface {
	// PTTLs returns each key's remaining lifetime: -2 (as a Duration) for a
	// missing key, -1 for a key without expiry, as Redis's PTTL does.
	PTTLs(ctx context.Context, keys []string) ([]time.Duration, error)
}

var _ TTLReader = (*RedisStore)(nil)

// PTTLs implements TTLReader.
func (s *RedisStore) PTTLs(ctx context.Context, keys []string) ([]time.Duration, error) {
	return pttls(ctx, s.Client, keys)
}

// pttlChunk bounds one pipeline of PTTLs.
const pttlChunk = 1000

func pttls(ctx context.Context, c redis.UniversalClient, keys []string) ([]time.Duration, error) {
	out := make([]time.Duration, 0, len(keys))
	for len(keys) > 0 {
		n := min(pttlChunk, len(keys))
		pipe := c.Pipeline()
		cmds := make([]*redis.DurationCmd, n)
		for i, k := range keys[:n] {
			cmds[i] = pipe.PTTL(ctx, k)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("read ttl of %d keys: %w", n, err)
		}
		for _, cmd := range cmds {
			out = append(out, cmd.Val())
		}
		keys = keys[n:]
	}
	return out, nil
}

// CatchUpResult counts what a catch-up did.
type CatchUpResult struct {
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

// CatchUpOptions says when this instance's schedule will really write each key.
type CatchUpOptions struct {
	// Schedule is this instance's schedule; nil means unknown for every
	// declaration.
	Schedule Schedule
	// Spread is the fraction of the interval a family's batches are paced
	// over (refresh.spread), as the scheduler paces them.
	Spread float64
}

// catchUpSlack covers what the horizon cannot know: a late timer, a wait for
// a load slot, the write's round trip, a member list that moved by a batch.
const catchUpSlack = 250 * time.Millisecond

// Horizon is how long a key of spec may have left to live and still be
// rewritten by this instance's schedule before it expires: the time until the
// batch-th of batches paced batches of the next run is sent (the run starts at
// next, batches are spread evenly over spread × interval), its load timeout,
// and catchUpSlack. When the next run is not known (known false: the
// declaration is not scheduled yet), it assumes the worst: a full interval,
// then the whole spread, then the load timeout. A spread outside [0, 1] (NaN
// included, which config validation should have refused) counts as the whole
// interval: never a shorter horizon.
func Horizon(spec *Spec, now, next time.Time, known bool, spread float64, batch, batches int) time.Duration {
	if !(spread >= 0 && spread <= 1) {
		spread = 1
	}
	pace := time.Duration(float64(spec.Interval) * spread)
	if !known {
		return spec.Interval + pace + spec.LoadTimeout + catchUpSlack
	}
	var gap time.Duration
	if batches > 1 && pace > 0 {
		gap = pace / time.Duration(batches)
	}
	// One gap more than the batch's own start: the batch's load begins at its
	// paced time and the member may sit one batch later in the next run's list.
	return max(0, next.Sub(now)) + time.Duration(min(batch+1, max(batches, 1)))*gap + spec.LoadTimeout + catchUpSlack
}

// dueBatch is one batch of keys a catch-up reloads; soonest is the least TTL
// any of its keys has left (missing keys count as already expired).
type dueBatch struct {
	spec    *Spec
	st      *declState
	members []string
	soonest time.Duration
}

// CatchUp is what a new leader does before (or while) its schedule resumes: it
// reads the remaining TTL of every declared key (a family's members included),
// pipelined, and at once refreshes those that are missing or would expire
// before this instance's schedule rewrites them (see Horizon). The due keys
// are loaded soonest-to-expire first, across declarations, in batches under
// the warmer's load bound. So neither the gap a crashed leader leaves nor the
// batches a drained leader skipped let a hot key expire, and a takeover does
// not reload keys that are still fresh.
func (w *Warmer) CatchUp(ctx context.Context, opts CatchUpOptions) (CatchUpResult, error) {
	reader, ok := w.store.(TTLReader)
	if !ok {
		return CatchUpResult{}, errors.New("catch up: the store cannot read TTLs")
	}
	var (
		res  CatchUpResult
		mu   sync.Mutex
		errs []error
		g    errgroup.Group
		due  []dueBatch
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for _, spec := range w.Specs() {
		name := spec.Name
		st, ok := w.stateOf(name)
		if !ok {
			continue
		}
		members, _, err := w.members(ctx, spec, st)
		if err != nil {
			fail(fmt.Errorf("catch up %s: %w", name, err))
			if len(members) == 0 {
				continue
			}
		}
		keys := make([]string, len(members))
		for i, m := range members {
			keys[i] = spec.Template.Key(m)
		}
		ttls, err := reader.PTTLs(ctx, keys)
		if err != nil {
			w.metrics.redisErrors.WithLabelValues("pttl").Inc()
			fail(fmt.Errorf("catch up %s: %w", name, err))
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
		now := w.now()
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
			b := dueBatch{spec: spec, st: st, soonest: stale[0].left, members: make([]string, n)}
			for i := range n {
				b.members[i] = stale[i].member
			}
			due = append(due, b)
			stale = stale[n:]
		}
	}
	// Hottest first: the batch whose key expires soonest goes first, whatever
	// its declaration.
	slices.SortStableFunc(due, func(a, b dueBatch) int { return cmp.Compare(a.soonest, b.soonest) })
	for _, b := range due {
		if err := w.loads.Acquire(ctx, 1); err != nil {
			fail(err)
			break
		}
		g.Go(func() error {
			defer w.loads.Release(1)
			o := w.refreshBatch(ctx, b.spec, b.st, b.members)
			mu.Lock()
			res.Refreshed += o.Written + o.Negative
			res.Failed += len(b.members) - o.Written - o.Negative
			if o.LastError != nil {
				errs = append(errs, o.LastError)
			}
			mu.Unlock()
			return nil
		})
	}
	_ = g.Wait()
	return res, errors.Join(errs...)
}

// stateOf returns a declaration's state, from the current view.
func (w *Warmer) stateOf(name string) (*declState, bool) {
	_, st, ok := w.lookup(name)
	return st, ok
}
