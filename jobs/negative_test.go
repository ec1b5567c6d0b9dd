package jobs_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/warmer"
)

// negRecorder also re-checks negatives, counting the calls.
type negRecorder struct {
	*recorder
	rechecks atomic.Int64
}

func (n *negRecorder) RefreshNegatives(context.Context, string) (warmer.Outcome, error) {
	n.rechecks.Add(1)
	return warmer.Outcome{}, nil
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
		deadline := time.Now().Add(10 * time.Second)
		for rec.rechecks.Load() < 3 {
			if time.Now().After(deadline) {
				t.Fatalf("%d negative re-checks in 10s at 100ms", rec.rechecks.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
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
		for rec.count("fam") < 6 {
			time.Sleep(10 * time.Millisecond)
		}
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
		waitRechecks := func(n int64) {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for rec.rechecks.Load() < n {
				if time.Now().After(deadline) {
					t.Fatalf("%d negative re-checks, want %d", rec.rechecks.Load(), n)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		waitRechecks(2)
		// A longer negative TTL: re-checked every 400ms instead of 100ms.
		slower := specs(time.Hour, "fam")
		slower[0].NegativeTTL = 800 * time.Millisecond
		ch, err := s.Apply(slower)
		if err != nil {
			t.Fatal(err)
		}
		if len(ch.Changed) != 1 {
			t.Errorf("changes %+v: a new negative_ttl must reschedule the re-check", ch)
		}
		base := rec.rechecks.Load()
		time.Sleep(time.Second)
		if got := rec.rechecks.Load() - base; got < 1 || got > 4 {
			t.Errorf("%d re-checks in 1s after the change, want about 2 (every 400ms)", got)
		}
		if _, err := s.Apply(nil); err != nil {
			t.Fatal(err)
		}
		base = rec.rechecks.Load()
		time.Sleep(time.Second)
		if got := rec.rechecks.Load() - base; got > 1 {
			t.Errorf("%d re-checks after the declaration was removed", got)
		}
	})
}
