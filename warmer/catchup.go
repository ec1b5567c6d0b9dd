package warmer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

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
}

// RefreshBatches loads and writes batches concurrently within the load bound,
// each started in the order given, and returns the outcome of each (its
// Members set) in that order; a batch not started (ctx ended, or its
// declaration is gone) has the zero Outcome.
func (w *Warmer) RefreshBatches(ctx context.Context, batches []Batch) ([]Outcome, error) {
	out := make([]Outcome, len(batches))
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
		g.Go(func() error {
			defer w.loads.Release(1)
			out[i] = w.refreshBatch(ctx, spec, st, b.Members, claims.Place{})
			out[i].Members = len(b.Members)
			return nil
		})
	}
	_ = g.Wait()
	return out, err
}
