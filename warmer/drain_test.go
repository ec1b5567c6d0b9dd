package warmer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/warmer"
)

// hookOrigin is an origin that calls after once, after its first load.
type hookOrigin struct {
	*origin
	once  sync.Once
	after func()
}

func (h *hookOrigin) Load(ctx context.Context, spec *warmer.Spec, members []string) ([]warmer.Result, error) {
	res, err := h.origin.Load(ctx, spec, members)
	h.once.Do(h.after)
	return res, err
}

// TestDrainedRunIsNotOK: a run cut short by shutdown is recorded partial (or
// aborted when it wrote nothing), not ok: the declaration's last success and
// staleness stay where the last complete run left them, and the members it
// did not reach keep their own last success (their stale budget).
func TestDrainedRunIsNotOK(t *testing.T) {
	ctx := context.Background()
	env := testenv.Redis(t)
	spec := family(t, env.Prefix, "drain", 20)
	spec.BatchSize = 5 // four batches
	o := newOrigin()
	for _, m := range spec.Members {
		o.set(m, []byte("v1"))
	}
	drain := make(chan struct{})
	src := &hookOrigin{origin: o, after: func() {}}
	f := newFixture(t, src, spec)
	t0 := f.now.Now()
	if _, err := f.w.Refresh(ctx, "drain", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Members {
		o.set(m, []byte("v2"))
	}

	t.Run("drained after its first batch: partial", func(t *testing.T) {
		f.now.Add(30 * time.Second)
		src.once, src.after = sync.Once{}, func() { close(drain) }
		// Batches an hour apart: only the drain ends the wait for the second.
		out, err := f.w.Refresh(ctx, "drain", warmer.RunOptions{Spread: time.Hour, Drain: drain})
		if !errors.Is(err, warmer.ErrDrained) {
			t.Errorf("err = %v, want ErrDrained", err)
		}
		if out.Written != 5 || out.NotRun != 15 {
			t.Errorf("written %d, not run %d; want 5 and 15", out.Written, out.NotRun)
		}
		if got := promtest.Value(t, f.reg, "hearth_refresh_runs_total", "family", "drain", "result", "partial"); got != 1 {
			t.Errorf("runs{partial} = %g, want 1", got)
		}
		if got := promtest.Value(t, f.reg, "hearth_refresh_runs_total", "family", "drain", "result", "ok"); got != 1 {
			t.Errorf("runs{ok} = %g, want 1 (the first run only)", got)
		}
		if got, want := promtest.Value(t, f.reg, "hearth_last_success_timestamp_seconds", "family", "drain"), float64(t0.UnixNano())/1e9; got != want {
			t.Errorf("last success = %f, want the first run's %f", got, want)
		}
		if got := promtest.Value(t, f.reg, "hearth_staleness_seconds", "family", "drain"); got != 30 {
			t.Errorf("staleness = %gs, want 30s since the last complete run", got)
		}
		if st := f.w.Status()[0]; !st.LastOK.Equal(t0) {
			t.Errorf("status last success = %v, want %v", st.LastOK, t0)
		}
		for i, m := range spec.Members {
			want := "v2"
			if i >= 5 {
				want = "v1" // never reached
			}
			if got := env.Client.Get(ctx, spec.Template.Key(m)).Val(); got != want {
				t.Errorf("%s = %q, want %q", spec.Template.Key(m), got, want)
			}
		}
	})

	t.Run("drained before its first batch: aborted", func(t *testing.T) {
		out, err := f.w.Refresh(ctx, "drain", warmer.RunOptions{Drain: drain})
		if !errors.Is(err, warmer.ErrDrained) || out.Written != 0 || out.NotRun != 20 {
			t.Errorf("written %d, not run %d, err %v; want 0, 20, ErrDrained", out.Written, out.NotRun, err)
		}
		if got := promtest.Value(t, f.reg, "hearth_refresh_runs_total", "family", "drain", "result", "aborted"); got != 1 {
			t.Errorf("runs{aborted} = %g, want 1", got)
		}
		if st := f.w.Status()[0]; !st.LastOK.Equal(t0) {
			t.Errorf("status last success = %v, want %v", st.LastOK, t0)
		}
	})

	t.Run("members not reached keep their stale budget", func(t *testing.T) {
		// max_stale is 1m. 75s after the first run the origin fails: the five
		// members the drained run wrote (30s in) are kept alive, the fifteen
		// it never reached are past their budget.
		f.now.Add(45 * time.Second)
		o.setFail(errors.New("origin down"))
		out, _ := f.w.Refresh(ctx, "drain", warmer.RunOptions{})
		if out.Extended != 5 {
			t.Errorf("extended %d members, want the 5 the drained run wrote", out.Extended)
		}
	})
}
