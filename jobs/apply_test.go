package jobs_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/warmer"
)

// runLog is a Refresher that remembers which declarations ran.
type runLog struct {
	mu   sync.Mutex
	runs map[string]int
}

func (r *runLog) Refresh(_ context.Context, name string, _ warmer.RunOptions) (warmer.Outcome, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[name]++
	return warmer.Outcome{}, nil
}

func (r *runLog) count(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[name]
}

func spec(name string, interval time.Duration) *warmer.Spec {
	return &warmer.Spec{Name: name, Interval: interval, TTL: 2 * interval}
}

func TestSchedulerApply(t *testing.T) {
	rec := &runLog{runs: map[string]int{}}
	s, err := jobs.New(jobs.Options{Refresher: rec, Specs: []*warmer.Spec{spec("a", time.Hour), spec("b", time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(ctx) })
	nextB, _ := s.NextRun("b")

	t.Run("added runs at once, removed is unscheduled", func(t *testing.T) {
		ch := s.Apply([]*warmer.Spec{spec("b", time.Hour), spec("c", time.Hour)})
		if got, want := slices.Concat(ch.Added, []string{"|"}, ch.Removed, []string{"|"}, ch.Changed), []string{"c", "|", "a", "|"}; !slices.Equal(got, want) {
			t.Errorf("added | removed | changed = %v, want %v", got, want)
		}
		deadline := time.Now().Add(10 * time.Second)
		for rec.count("c") == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if rec.count("c") == 0 {
			t.Fatal("added declaration c did not run at once")
		}
		got := s.Jobs()
		slices.Sort(got)
		if want := []string{"b", "c"}; !slices.Equal(got, want) {
			t.Errorf("jobs = %v, want %v", got, want)
		}
		if _, ok := s.NextRun("a"); ok {
			t.Error("removed declaration a still has a next run")
		}
		if next, _ := s.NextRun("b"); !next.Equal(nextB) {
			t.Errorf("unchanged b moved from %v to %v", nextB, next)
		}
	})

	t.Run("interval change reschedules", func(t *testing.T) {
		ch := s.Apply([]*warmer.Spec{spec("b", 2*time.Hour), spec("c", time.Hour)})
		if !slices.Equal(ch.Changed, []string{"b"}) || len(ch.Added)+len(ch.Removed) != 0 {
			t.Errorf("changes = %+v, want only b rescheduled", ch)
		}
		next, ok := s.NextRun("b")
		if want := time.Now().Add(2 * time.Hour); !ok || next.After(want) || next.Before(time.Now()) {
			t.Errorf("b's next run = %v (%v), want within the new 2h interval", next, ok)
		}
		if got := rec.count("b"); got != 0 {
			t.Errorf("rescheduled b ran %d times at once; its keys are warm, it should keep its phase", got)
		}
	})
}

// TestSchedulerApplyBeforeOpen: a standby reloads before it ever leads; when it
// takes over, Open schedules the reloaded declarations, once each.
func TestSchedulerApplyBeforeOpen(t *testing.T) {
	rec := &runLog{runs: map[string]int{}}
	s, err := jobs.New(jobs.Options{Refresher: rec, Specs: []*warmer.Spec{spec("a", time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() { _ = s.Close(ctx) })
	if ch := s.Apply([]*warmer.Spec{spec("b", time.Hour), spec("c", time.Hour)}); !ch.Empty() {
		t.Errorf("changes before Open = %+v, want none: nothing is scheduled yet", ch)
	}
	if got := s.Jobs(); len(got) != 0 {
		t.Errorf("jobs before Open = %v, want none", got)
	}
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	got := s.Jobs()
	slices.Sort(got)
	if want := []string{"b", "c"}; !slices.Equal(got, want) {
		t.Errorf("jobs after Open = %v, want %v", got, want)
	}
}

// TestSchedulerApplyComparesWithLast: each update is measured against the
// declarations last applied: the same ones again change nothing, a removed one
// stops running, and the same one declared again is scheduled afresh and runs.
func TestSchedulerApplyComparesWithLast(t *testing.T) {
	rec := &runLog{runs: map[string]int{}}
	oldSpecs := []*warmer.Spec{spec("a", 100*time.Millisecond), spec("b", time.Hour)}
	s, err := jobs.New(jobs.Options{Refresher: rec, Specs: oldSpecs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(ctx) })
	nextB, _ := s.NextRun("b")
	jobsNow := func() []string {
		got := s.Jobs()
		slices.Sort(got)
		return got
	}
	testenv.Eventually(t, 10*time.Second, "a runs", func() bool { return rec.count("a") > 0 })

	if ch := s.Apply(oldSpecs); !ch.Empty() {
		t.Errorf("re-applying the same declarations = %+v, want no change", ch)
	}
	ch := s.Apply([]*warmer.Spec{spec("b", time.Hour)})
	if !slices.Equal(ch.Removed, []string{"a"}) || len(ch.Added)+len(ch.Changed) != 0 {
		t.Errorf("removing a = %+v, want only a removed", ch)
	}
	if got, want := jobsNow(), []string{"b"}; !slices.Equal(got, want) {
		t.Errorf("jobs = %v, want %v", got, want)
	}
	// A run may have started just before the removal; none starts after it.
	time.Sleep(150 * time.Millisecond)
	stopped := rec.count("a")
	time.Sleep(300 * time.Millisecond)
	if got := rec.count("a"); got != stopped {
		t.Errorf("removed a ran %d more times", got-stopped)
	}

	ch = s.Apply(oldSpecs)
	if !slices.Equal(ch.Added, []string{"a"}) || len(ch.Removed)+len(ch.Changed) != 0 {
		t.Errorf("declaring a again = %+v, want only a added", ch)
	}
	testenv.Eventually(t, 10*time.Second, "a declared again runs", func() bool { return rec.count("a") > stopped })
	if next, ok := s.NextRun("b"); !ok || !next.Equal(nextB) {
		t.Errorf("b's next run = %v (%v), want the unchanged %v", next, ok, nextB)
	}
}
