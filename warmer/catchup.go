package warmer

import (
	"context"
	"errors"
	"fmt"
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
}

// CatchUp is what a new leader does before it resumes the schedule: it reads
// the remaining TTL of every declared key (a family's members included),
// pipelined, and at once refreshes those that are missing or would expire
// before the schedule reaches them: less than due(spec) + the load timeout
// left, where due(spec) is how long until the declaration's next scheduled
// write (one interval when due is nil). So the gap a crashed leader leaves
// never lets a hot key expire, and a takeover does not reload keys that are
// still fresh.
func (w *Warmer) CatchUp(ctx context.Context, due func(*Spec) time.Duration) (CatchUpResult, error) {
	reader, ok := w.store.(TTLReader)
	if !ok {
		return CatchUpResult{}, errors.New("catch up: the store cannot read TTLs")
	}
	var (
		res  CatchUpResult
		mu   sync.Mutex
		errs []error
		g    errgroup.Group
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
		horizon := spec.Interval
		if due != nil {
			horizon = due(spec)
		}
		horizon += spec.LoadTimeout
		var stale []string
		for i, d := range ttls {
			if d == -2 || (d >= 0 && d < horizon) {
				stale = append(stale, members[i])
			}
		}
		res.Checked += len(keys)
		res.Due += len(stale)
		for _, batch := range w.batches(spec, stale) {
			if err := w.loads.Acquire(ctx, 1); err != nil {
				fail(err)
				break
			}
			g.Go(func() error {
				defer w.loads.Release(1)
				o := w.refreshBatch(ctx, spec, st, batch)
				mu.Lock()
				res.Refreshed += o.Written + o.Negative
				res.Failed += len(batch) - o.Written - o.Negative
				if o.LastError != nil {
					errs = append(errs, o.LastError)
				}
				mu.Unlock()
				return nil
			})
		}
	}
	_ = g.Wait()
	return res, errors.Join(errs...)
}

// stateOf returns a declaration's state, under the lock that guards the
// declarations.
func (w *Warmer) stateOf(name string) (*declState, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st, ok := w.state[name]
	return st, ok
}
