package jobs_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/warmer"
)

// The schedule's timing on gocron's real code and the real clock, inside a
// synctest bubble: time moves only when every goroutine waits, so each run's
// start is exact and an hour of schedule takes no time.

// timeline records each run's start, its plan and its spread, per declaration;
// each run takes hold.
type timeline struct {
	hold time.Duration
	mu   sync.Mutex
	runs map[string][]run
	busy map[string]bool
	over bool // a declaration's run started while one of it ran
}

type run struct {
	start, planned time.Time
	spread         time.Duration
}

func newTimeline(hold time.Duration) *timeline {
	return &timeline{hold: hold, runs: map[string][]run{}, busy: map[string]bool{}}
}

func (tl *timeline) Refresh(ctx context.Context, name string, ro warmer.RunOptions) (warmer.Outcome, error) {
	tl.mu.Lock()
	tl.over = tl.over || tl.busy[name]
	tl.busy[name] = true
	tl.runs[name] = append(tl.runs[name], run{start: time.Now(), planned: ro.Planned, spread: ro.Spread})
	tl.mu.Unlock()
	select {
	case <-time.After(tl.hold):
	case <-ro.Drain:
	case <-ctx.Done():
	}
	tl.mu.Lock()
	tl.busy[name] = false
	tl.mu.Unlock()
	return warmer.Outcome{}, nil
}

func (tl *timeline) of(name string) []run {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return slices.Clone(tl.runs[name])
}

// openFor opens a schedule of specs on rec with spread, for one term that
// the test ends by cancelling; Close runs at the test's end, before the term
// ends: its drain ends a run in flight at once, so that gocron's stop (which
// polls the clock until its jobs are done) never waits on a bubble whose
// time cannot move while it polls.
func openFor(t *testing.T, rec jobs.Refresher, spread float64, specs []*warmer.Spec) (s *jobs.Scheduler, end context.CancelFunc) {
	t.Helper()
	s, err := jobs.New(jobs.Options{Refresher: rec, Specs: specs, Spread: spread, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	term, end := context.WithCancel(context.Background())
	if err := s.Open(term); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Error(err)
		}
		end()
	})
	return s, end
}

// Each declaration runs first at its offset within the interval (its name's
// hash, so declarations opened together do not run together), then exactly
// once per interval; each run is planned when it starts and paces its
// batches over the configured share of the interval.
func TestScheduleRunsAtPhaseEachInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = 10 * time.Second
		tl := newTimeline(time.Second)
		t0 := time.Now() // the bubble starts on a whole second
		s, _ := openFor(t, tl, 0.5, specs(interval, "product", "price", "stock"))
		for _, name := range []string{"product", "price", "stock"} {
			if next, ok := s.NextRun(name); !ok || !next.Equal(t0.Add(jobs.Offset(name, interval))) {
				t.Errorf("NextRun(%s) = %v (ok %v), want its offset %v", name, next, ok, jobs.Offset(name, interval))
			}
		}
		time.Sleep(time.Minute)
		starts := map[time.Duration]string{}
		for _, name := range []string{"product", "price", "stock"} {
			runs := tl.of(name)
			if len(runs) != 6 {
				t.Fatalf("%s ran %d times in a minute at %v, want 6", name, len(runs), interval)
			}
			first := t0.Add(jobs.Offset(name, interval))
			for k, r := range runs {
				want := first.Add(time.Duration(k) * interval)
				if !r.start.Equal(want) || !r.planned.Equal(want) {
					t.Errorf("%s run %d started %v, planned %v; want both at %v", name, k, r.start.Sub(t0), r.planned.Sub(t0), want.Sub(t0))
				}
				if r.spread != interval/2 {
					t.Errorf("%s run %d spread %v, want half its interval", name, k, r.spread)
				}
			}
			if other, dup := starts[first.Sub(t0)]; dup {
				t.Errorf("%s and %s start together", name, other)
			}
			starts[first.Sub(t0)] = name
		}
	})
}

// A run longer than its interval is never overlapped by the next: the runs
// it covered are skipped, and the next starts at the first planned time
// after it ended, planned then (so its lag measures the schedule, not the
// skipped runs).
func TestScheduleSlowRunIsNotOverlapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = 10 * time.Second
		tl := newTimeline(25 * time.Second)
		t0 := time.Now()
		openFor(t, tl, 0, specs(interval, "slow"))
		time.Sleep(2 * time.Minute)
		runs := tl.of("slow")
		tl.mu.Lock()
		over := tl.over
		tl.mu.Unlock()
		if over {
			t.Error("a run started while the one before still ran")
		}
		first := t0.Add(jobs.Offset("slow", interval))
		if len(runs) < 3 {
			t.Fatalf("%d runs in 2 minutes, want one every 30 s", len(runs))
		}
		for k, r := range runs {
			slot := r.start.Sub(first)
			if slot%interval != 0 || !r.planned.Equal(r.start) {
				t.Errorf("run %d started %v after the first slot, planned %v: want on a slot, planned then", k, slot, r.planned.Sub(first))
			}
			if k > 0 {
				if gap := r.start.Sub(runs[k-1].start); gap < tl.hold || gap > tl.hold+interval {
					t.Errorf("run %d started %v after the one before, want within an interval of its 25 s end", k, gap)
				}
			}
		}
	})
}

// A schedule runs only in its term: once the term's context ends no run
// starts, however long after, and the next term's schedule keeps the phase.
func TestScheduleOnlyInItsTerm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval = 10 * time.Second
		tl := newTimeline(0)
		t0 := time.Now()
		s, end := openFor(t, tl, 0, specs(interval, "termed"))
		time.Sleep(30 * time.Second)
		end()
		synctest.Wait()
		if got := s.Jobs(); len(got) != 0 {
			t.Fatalf("jobs after the term ended = %v, want none", got)
		}
		if _, ok := s.NextRun("termed"); ok {
			t.Error("NextRun known after the term ended")
		}
		n := len(tl.of("termed"))
		if n != 3 {
			t.Fatalf("%d runs in the 30 s term, want 3", n)
		}
		time.Sleep(time.Hour)
		if got := len(tl.of("termed")); got != n {
			t.Fatalf("%d runs in the hour after the term ended, want none", got-n)
		}
		term2, end2 := context.WithCancel(context.Background())
		defer end2()
		if err := s.Open(term2); err != nil {
			t.Fatalf("Open for a new term: %v", err)
		}
		time.Sleep(interval)
		runs := tl.of("termed")
		if len(runs) != n+1 {
			t.Fatalf("%d runs in the new term's first interval, want 1", len(runs)-n)
		}
		if phase := runs[n].start.Sub(t0) % interval; phase != jobs.Offset("termed", interval) {
			t.Errorf("the new term's run at phase %v, want the offset %v", phase, jobs.Offset("termed", interval))
		}
	})
}
