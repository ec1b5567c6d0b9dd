package jobs_test

import (
	"context"
	"errors"
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
		ch, err := s.Apply([]*warmer.Spec{spec("b", time.Hour), spec("c", time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
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
		ch, err := s.Apply([]*warmer.Spec{spec("b", 2*time.Hour), spec("c", time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
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
	if _, err := s.Apply([]*warmer.Spec{spec("b", time.Hour), spec("c", time.Hour)}); err != nil {
		t.Fatal(err)
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

// TestSchedulerApplyFailsWhole: a schedule update that fails half way (after a
// removal and an addition) is undone, so the old schedule stays whole and keeps
// running, and the next update compares against the old declarations.
func TestSchedulerApplyFailsWhole(t *testing.T) {
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
	errInjected := errors.New("injected")
	// fail fails scheduling bad once: the undo that schedules it again succeeds.
	fail := func(bad string) func(string) error {
		failed := false
		return func(name string) error {
			if name == bad && !failed {
				failed = true
				return errInjected
			}
			return nil
		}
	}
	jobsNow := func() []string {
		got := s.Jobs()
		slices.Sort(got)
		return got
	}

	// a removed, c added, then d fails.
	jobs.SetFault(s, fail("d"))
	if _, err := s.Apply([]*warmer.Spec{spec("b", time.Hour), spec("c", time.Hour), spec("d", time.Hour)}); !errors.Is(err, errInjected) {
		t.Fatalf("apply = %v, want the injected failure", err)
	}
	if got, want := jobsNow(), []string{"a", "b"}; !slices.Equal(got, want) {
		t.Errorf("jobs after a failed update = %v, want the old %v", got, want)
	}
	if _, ok := s.NextRun("c"); ok {
		t.Error("c, added before the failure, is still scheduled")
	}
	// b rescheduled to 2h, then its new job fails: the old b is put back at its phase.
	jobs.SetFault(s, fail("b"))
	if _, err := s.Apply([]*warmer.Spec{spec("a", 100*time.Millisecond), spec("b", 2*time.Hour)}); !errors.Is(err, errInjected) {
		t.Fatalf("apply = %v, want the injected failure", err)
	}
	if next, ok := s.NextRun("b"); !ok || !next.Equal(nextB) {
		t.Errorf("b's next run = %v (%v) after a failed reschedule, want the old %v", next, ok, nextB)
	}
	// The restored a keeps running.
	ran := rec.count("a")
	testenv.Eventually(t, 10*time.Second, "restored a runs again", func() bool { return rec.count("a") > ran })

	jobs.SetFault(s, nil)
	ch, err := s.Apply(oldSpecs)
	if err != nil || !ch.Empty() {
		t.Errorf("re-applying the old declarations = %+v, %v; want no change: the failed updates must not count", ch, err)
	}
	ch, err = s.Apply([]*warmer.Spec{spec("b", time.Hour), spec("c", time.Hour)})
	if err != nil || !slices.Equal(ch.Added, []string{"c"}) || !slices.Equal(ch.Removed, []string{"a"}) {
		t.Errorf("update without a fault = %+v, %v; want c added, a removed", ch, err)
	}
	if got, want := jobsNow(), []string{"b", "c"}; !slices.Equal(got, want) {
		t.Errorf("jobs = %v, want %v", got, want)
	}
}
