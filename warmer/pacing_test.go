package warmer_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/sources/protect"
	"github.com/hearth-dev/hearth/warmer"
)

// TestPacingHonoursTheOriginRate: a spread that would ask the origin faster
// than its rate bound is stretched to 80% of the bound, so that the plan can
// be kept (batches wait for their planned time, not for the limiter). Only
// lower bounds are checked: a batch can never start before its plan.
func TestPacingHonoursTheOriginRate(t *testing.T) {
	o := newOrigin()
	env := testenv.Redis(t)
	spec := family(t, env.Prefix, "rated", 30)
	spec.BatchSize = 5 // 6 batches
	for _, m := range spec.Members {
		o.set(m, []byte("v"))
	}
	src := protect.Guard(o, protect.GuardConfig{Name: "o", Rate: 25, Burst: 1, Logger: zerolog.Nop()})
	if r, ok := src.(interface{ CallRate() float64 }); !ok || r.CallRate() != 25 {
		t.Fatalf("guarded source does not report its rate bound")
	}
	w, err := warmer.New(warmer.Options{
		Store: &warmer.RedisStore{Client: env.Client}, Sources: map[string]warmer.Source{"o": src},
		Specs: []*warmer.Spec{spec}, Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	// 6 batches over 60ms would be 100 calls/s; the bound is 25/s, so 50ms apart.
	if _, err := w.Refresh(context.Background(), "rated", warmer.RunOptions{Spread: 60 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	starts := o.Starts()
	if got, want := len(starts), 6; got != want {
		t.Fatalf("loads = %d, want %d", got, want)
	}
	gap := 50 * time.Millisecond
	for i := 1; i < len(starts); i++ {
		if d := starts[i].Sub(starts[0]); d < time.Duration(i)*gap-5*time.Millisecond {
			t.Errorf("batch %d started %s after the first, want ≥ %s", i, d, time.Duration(i)*gap)
		}
	}
}
