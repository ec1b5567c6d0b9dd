package jobs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/jobs"
)

// TestRefusesPeriodBelowMinimum: a 1 ns interval (what interval: 1 decoded to)
// is refused with an error naming the declaration, not handed to gocron,
// whose next-run loop never ends on it.
func TestRefusesPeriodBelowMinimum(t *testing.T) {
	for _, iv := range []time.Duration{time.Nanosecond, time.Microsecond, jobs.MinPeriod - 1} {
		rec := &recorder{runs: map[string]int{}, running: map[string]int{}}
		s, err := jobs.New(jobs.Options{Refresher: rec, Specs: specs(iv, "tiny"), Logger: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		err = s.Open(context.Background())
		if err == nil || !strings.Contains(err.Error(), "schedule tiny: interval "+iv.String()+" is below the scheduler's minimum") {
			t.Errorf("interval %s: Open err = %v, want it refused", iv, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.Close(ctx)
		cancel()
		if n := rec.count("tiny"); n != 0 {
			t.Errorf("interval %s: %d runs, want none", iv, n)
		}
	}
}

// stuck is a gocron scheduler whose Shutdown never returns, as gocron's does
// while its scheduler goroutine spins on a period it cannot keep.
type stuck struct {
	gocron.Scheduler
	release chan struct{}
}

func (s stuck) Shutdown() error {
	<-s.release
	return s.Scheduler.Shutdown()
}

// TestCloseBoundedWhenGocronHangs: Close returns once its context ends (plus
// a short grace), with an error saying the scheduler was abandoned, even
// though gocron's Shutdown never returns.
func TestCloseBoundedWhenGocronHangs(t *testing.T) {
	rec := &recorder{runs: map[string]int{}, running: map[string]int{}, hold: time.Hour}
	s, err := jobs.New(jobs.Options{Refresher: rec, Specs: specs(time.Hour, "a"), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	jobs.WrapScheduler(s, func(g gocron.Scheduler) gocron.Scheduler { return stuck{g, release} })
	if err := s.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Close(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "scheduler shutdown abandoned") {
			t.Errorf("Close = %v, want the drain deadline and the abandoned scheduler", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waiting on gocron's Shutdown 10s after its 200ms deadline")
	}
}
