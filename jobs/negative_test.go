package jobs_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/warmer"
)

// negRecorder also re-checks negatives, counting the calls and recording when
// each declaration's ran.
type negRecorder struct {
	*recorder
	rechecks atomic.Int64

	mu sync.Mutex
	at map[string][]time.Time
}

func (n *negRecorder) RefreshNegatives(_ context.Context, name string) (warmer.Outcome, error) {
	n.rechecks.Add(1)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.at == nil {
		n.at = map[string][]time.Time{}
	}
	n.at[name] = append(n.at[name], time.Now())
	return warmer.Outcome{}, nil
}

// times returns when name's re-checks ran.
func (n *negRecorder) times(name string) []time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]time.Time(nil), n.at[name]...)
}

func TestNegativeRecheckScheduled(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
	t.Run("every negative_ttl/2 when that is shorter than the interval", func(t *testing.T) {
		rec := &negRecorder{recorder: &recorder{runs: map[string]int{}, running: map[string]int{}}}
		sp := specs(time.Hour, "fam")
		sp[0].NegativeTTL = 200 * time.Millisecond
		s, err := jobs.New(jobs.Options{Refresher: rec, Specs: sp, Logger: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Open(context.Background()); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, "3 negative re-checks at 100ms", func() bool { return rec.rechecks.Load() >= 3 })
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := rec.count("fam"); got != 0 {
			t.Errorf("%d full refreshes in the first hour", got)
		}
	})
	t.Run("not when the interval is already short enough", func(t *testing.T) {
		rec := &negRecorder{recorder: &recorder{runs: map[string]int{}, running: map[string]int{}}}
		sp := specs(100*time.Millisecond, "fam")
		sp[0].NegativeTTL = time.Second
		s, err := jobs.New(jobs.Options{Refresher: rec, Specs: sp, Logger: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Open(context.Background()); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, "6 runs", func() bool { return rec.count("fam") >= 6 })
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := rec.rechecks.Load(); got != 0 {
			t.Errorf("%d negative re-checks, want none", got)
		}
	})
	t.Run("removed and rescheduled with its declaration on reload", func(t *testing.T) {
		rec := &negRecorder{recorder: &recorder{runs: map[string]int{}, running: map[string]int{}}}
		sp := specs(time.Hour, "fam")
		sp[0].NegativeTTL = 200 * time.Millisecond
		s, err := jobs.New(jobs.Options{Refresher: rec, Specs: sp, Logger: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Open(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = s.Close(context.Background()) }()
		testenv.Eventually(t, 10*time.Second, "2 negative re-checks", func() bool { return rec.rechecks.Load() >= 2 })
		// A longer negative TTL: re-checked every 400ms instead of 100ms.
		slower := specs(time.Hour, "fam")
		slower[0].NegativeTTL = 800 * time.Millisecond
		ch := s.Apply(slower)
		if len(ch.Changed) != 1 {
			t.Errorf("changes %+v: a new negative_ttl must reschedule the re-check", ch)
		}
		// The gaps between the re-checks after the change are the new 400ms,
		// not the old 100ms (the first may still be on the old schedule).
		base := len(rec.times("fam"))
		testenv.Eventually(t, 10*time.Second, "3 re-checks after the change", func() bool { return len(rec.times("fam")) >= base+3 })
		at := rec.times("fam")
		if gap := at[base+2].Sub(at[base+1]); gap < 300*time.Millisecond {
			t.Errorf("re-checks %s apart after the change, want about 400ms", gap)
		}
		// Removed: the other declaration's re-checks go on (the positive
		// control), this one's stop.
		other := specs(time.Hour, "other")
		other[0].NegativeTTL = 200 * time.Millisecond
		s.Apply(other)
		removed := len(rec.times("fam"))
		testenv.Eventually(t, 10*time.Second, "4 re-checks of the remaining declaration", func() bool { return len(rec.times("other")) >= 4 })
		if got := len(rec.times("fam")) - removed; got > 1 {
			t.Errorf("%d re-checks after the declaration was removed", got)
		}
	})
}
