package warmer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/hearth-dev/hearth/behind"
	"github.com/hearth-dev/hearth/internal/claims"
)

// TTLReader is a Store that can read keys' remaining time to live, which the
// takeover catch-up needs.
type TTLReader interface {
	// PTTLs returns each key's remaining lifetime: -2 (as a Duration) for a
	// missing key, -1 for a key without expiry, as Redis's PTTL does.
	PTTLs(ctx context.Context, keys []string) ([]time.Duration, error)
}

// PTTLs reads keys' remaining lifetimes through the warmer's store.
func (w *Warmer) PTTLs(ctx context.Context, keys []string) ([]time.Duration, error) {
	r, ok := w.store.(TTLReader)
	if !ok {
		return nil, errors.New("the store cannot read TTLs")
	}
	ttls, err := r.PTTLs(ctx, keys)
	if err != nil {
		w.metrics.redisErrors.WithLabelValues("pttl").Inc()
	}
	return ttls, err
}

// Members lists a declaration's members as a run does: validated,
// de-duplicated, with its hot set; the last listing when listing fails.
func (w *Warmer) Members(ctx context.Context, name string) ([]string, error) {
	spec, st, ok := w.lookup(name)
	if !ok {
		return nil, fmt.Errorf("list members of %q: %w", name, ErrUnknownSpec)
	}
	members, _, err := w.members(ctx, spec, st, false)
	return members, err
}

// Batch is some members of one declaration.
type Batch struct {
	Name    string
	Members []string
	// Due is the earliest TTL end among the batch's keys (unix nanoseconds;
	// at or before the start for a key already missing; 0 when unknown): a
	// catch-up's batches are watched against it as a run's are.
	Due int64
}

// RefreshBatches loads and writes batches concurrently within the load bound,
// each started in the order given, and returns the outcome of each (its
// Members set) in that order; a batch not started (ctx ended, or its
// declaration is gone) has the zero Outcome. Each declaration's batches are
// watched for falling behind as a run is (behind.Metrics.WatchCatchUp):
// keys that will expire before the batches reach them are logged, counted
// and shown in hearth_refresh_behind_seconds (a declaration none of whose
// batches has a Due, a traffic-driven promotion, is not).
func (w *Warmer) RefreshBatches(ctx context.Context, batches []Batch) ([]Outcome, error) {
	out := make([]Outcome, len(batches))
	type watched struct {
		run     *behind.Run
		members [][]string
		due     []int64
	}
	fams := map[string]*watched{}
	at := make([]int, len(batches)) // batch i is its declaration's at[i]-th
	for i, b := range batches {
		f := fams[b.Name]
		if f == nil {
			f = &watched{}
			fams[b.Name] = f
		}
		at[i] = len(f.members)
		f.members = append(f.members, b.Members)
		f.due = append(f.due, b.Due)
	}
	start := w.now()
	for name, f := range fams {
		f.run = w.metrics.behind.WatchCatchUp(name, f.members, f.due, start)
	}
	var (
		g   errgroup.Group
		err error
	)
	for i, b := range batches {
		spec, st, ok := w.lookup(b.Name)
		if !ok {
			continue
		}
		if err = w.loads.Acquire(ctx, 1); err != nil {
			break
		}
		run := fams[b.Name].run
		run.Begun(at[i])
		g.Go(func() error {
			defer w.loads.Release(1)
			out[i] = w.refreshBatch(ctx, spec, st, b.Members, claims.Place{})
			out[i].Members = len(b.Members)
			run.Completed(at[i], len(b.Members), out[i].Written+out[i].Negative > 0)
			return nil
		})
	}
	_ = g.Wait()
	for _, f := range fams {
		f.run.Finish()
	}
	return out, err
}
