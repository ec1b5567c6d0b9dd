package jobs_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/warmer"
)

func TestOffsetsSpreadDeclarations(t *testing.T) {
	interval := 30 * time.Second
	names := []string{"product", "price", "stock", "user", "top-products", "banner", "rates", "category"}
	seen := map[time.Duration]string{}
	for _, n := range names {
		off := jobs.Offset(n, interval)
		if off < 0 || off >= interval {
			t.Fatalf("Offset(%q) = %s, outside [0, %s)", n, off, interval)
		}
		if got := jobs.Offset(n, interval); got != off {
			t.Errorf("Offset(%q) not deterministic: %s then %s", n, off, got)
		}
		if other, dup := seen[off]; dup {
			t.Errorf("%q and %q share offset %s", n, other, off)
		}
		seen[off] = n
	}
}

// recorder counts runs per declaration and can hold a run to test overlap.
type recorder struct {
	mu      sync.Mutex
	runs    map[string]int
	running map[string]int
	overlap bool
	hold    time.Duration
	drained bool
}

func (r *recorder) Refresh(ctx context.Context, name string, ro warmer.RunOptions) (warmer.Outcome, error) {
	r.mu.Lock()
	r.runs[name]++
	r.running[name]++
	if r.running[name] > 1 {
		r.overlap = true
	}
	r.mu.Unlock()
	select {
	case <-time.After(r.hold):
	case <-ro.Drain:
		r.mu.Lock()
		r.drained = true
		r.mu.Unlock()
	case <-ctx.Done():
	}
	r.mu.Lock()
	r.running[name]--
	r.mu.Unlock()
	return warmer.Outcome{}, nil
}

func (r *recorder) count(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[name]
}

func specs(interval time.Duration, names ...string) []*warmer.Spec {
	var out []*warmer.Spec
	for _, n := range names {
		tp, _ := warmer.ParseTemplate(n)
		out = append(out, &warmer.Spec{Name: n, Template: tp, Interval: interval})
	}
	return out
}

func TestEveryDeclarationRunsEachInterval(t *testing.T) {
	rec := &recorder{runs: map[string]int{}, running: map[string]int{}}
	s, err := jobs.New(jobs.Options{Refresher: rec, Specs: specs(200*time.Millisecond, "a", "b", "c"), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for rec.count("a") < 3 || rec.count("b") < 3 || rec.count("c") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("runs after 10s: a=%d b=%d c=%d, want ≥ 3 each", rec.count("a"), rec.count("b"), rec.count("c"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if next, ok := s.NextRun("a"); !ok || next.IsZero() {
		t.Errorf("NextRun(a) = %v, %v", next, ok)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestRunsNeverOverlap(t *testing.T) {
	rec := &recorder{runs: map[string]int{}, running: map[string]int{}, hold: 350 * time.Millisecond}
	s, err := jobs.New(jobs.Options{Refresher: rec, Specs: specs(100*time.Millisecond, "slow"), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for rec.count("slow") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d runs", rec.count("slow"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.overlap {
		t.Error("a declaration's runs overlapped")
	}
}

func TestCloseDrainsInFlightRuns(t *testing.T) {
	rec := &recorder{runs: map[string]int{}, running: map[string]int{}, hold: time.Hour}
	s, err := jobs.New(jobs.Options{Refresher: rec, Specs: specs(50*time.Millisecond, "long"), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	for rec.count("long") < 1 {
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if !rec.drained {
		t.Error("the in-flight run was not told to drain")
	}
}

type denyElector struct{}

func (denyElector) IsLeader(context.Context) error { return errors.New("standby") }

func TestElectorGatesRuns(t *testing.T) {
	rec := &recorder{runs: map[string]int{}, running: map[string]int{}}
	s, err := jobs.New(jobs.Options{Refresher: rec, Specs: specs(20*time.Millisecond, "gated"), Elector: denyElector{}, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // fifteen intervals
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := rec.count("gated"); got != 0 {
		t.Errorf("a standby ran %d refreshes", got)
	}
}
