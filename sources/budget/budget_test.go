package budget_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hearth-dev/hearth/sources/budget"
	"github.com/hearth-dev/hearth/warmer"
)

// TestBudgetBoundsAndReleases: acquisitions within the budget proceed, one
// that does not fit waits until bytes are released (or its context ends),
// and a payload over the whole budget fails at once as too large.
func TestBudgetBoundsAndReleases(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := budget.New(100, reg)
	r1, err := b.Acquire(context.Background(), "up", 60)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Acquire(ctx, "up", 50); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, warmer.ErrOverloaded) {
		t.Fatalf("acquire past the budget = %v, want a deadline (overloaded) once the context ends", err)
	}
	got := make(chan error, 1)
	go func() {
		r, err := b.Acquire(context.Background(), "up", 50)
		if err == nil {
			r()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("acquired 50 with 60 of 100 held: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	r1()
	r1() // a second release gives nothing back twice
	if err := <-got; err != nil {
		t.Fatalf("acquire after the release: %v", err)
	}
	if _, err := b.Acquire(context.Background(), "up", 101); !errors.Is(err, budget.ErrOverBudget) || !errors.Is(err, warmer.ErrTooLarge) {
		t.Fatalf("acquire over the whole budget = %v, want ErrOverBudget (too large)", err)
	}
	if n := testutil.ToFloat64(b.InflightGauge()); n != 0 {
		t.Errorf("in flight = %g after every release, want 0", n)
	}
	if n, err := testutil.GatherAndCount(reg, "hearth_payload_budget_refused_total"); err != nil || n != 2 {
		t.Errorf("refused series = %d (%v), want 2 (over, wait)", n, err)
	}
	var none *budget.Budget
	if r, err := none.Acquire(context.Background(), "up", 1<<40); err != nil {
		t.Errorf("a nil budget refused: %v", err)
	} else {
		r()
	}
}
