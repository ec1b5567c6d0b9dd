package jobs_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/keytmpl"
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
		tp, _ := keytmpl.Parse(n)
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
	testenv.Eventually(t, 10*time.Second, "3 runs of each of a, b and c", func() bool {
		return rec.count("a") >= 3 && rec.count("b") >= 3 && rec.count("c") >= 3
	})
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
	testenv.Eventually(t, 10*time.Second, "3 runs of slow", func() bool { return rec.count("slow") >= 3 })
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
	testenv.Eventually(t, 10*time.Second, "a run of long", func() bool { return rec.count("long") >= 1 })
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

// plannedLog records each run's planned and actual start, on its clock.
type plannedLog struct {
	clock   clockwork.Clock
	mu      sync.Mutex
	planned []time.Time
	started []time.Time
}

func (p *plannedLog) Refresh(_ context.Context, _ string, ro warmer.RunOptions) (warmer.Outcome, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.planned = append(p.planned, ro.Planned)
	p.started = append(p.started, p.clock.Now())
	return warmer.Outcome{}, nil
}

// TestNextRunInANewTerm: a schedule opened for a new term keeps the
// declaration's phase, and NextRun says when its first run starts (the
// takeover catch-up trusts it): the run is planned and started then, not an
// interval later. The clock is a fake one: the schedule moves only when the
// test advances it.
func TestNextRunInANewTerm(t *testing.T) {
	const interval = 500 * time.Millisecond
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rec := &plannedLog{clock: clock}
	s, err := jobs.New(jobs.Options{Refresher: rec, Specs: specs(interval, "p"), Logger: zerolog.Nop(), Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	term, end := context.WithCancel(context.Background())
	if err := s.Open(term); err != nil {
		t.Fatal(err)
	}
	first, ok := s.NextRun("p")
	if !ok || !first.After(clock.Now()) || first.After(clock.Now().Add(interval)) {
		t.Fatalf("first run = %v (ok %v), want within one interval of %v", first, ok, clock.Now())
	}
	end()
	testenv.Eventually(t, 10*time.Second, "the first term's schedule closed", func() bool { return len(s.Jobs()) == 0 })
	// Three intervals and a half later, a new term.
	clock.Advance(first.Sub(clock.Now()) + 3*interval + interval/2)
	if err := s.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	next, ok := s.NextRun("p")
	if want := first.Add(4 * interval); !ok || !next.Equal(want) {
		t.Fatalf("NextRun in the new term = %v (ok %v), want %v (the same phase)", next, ok, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("gocron did not wait for a run: %v", err)
	}
	clock.Advance(next.Sub(clock.Now()))
	testenv.Eventually(t, 10*time.Second, "the new term's first run", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.planned) > 0
	})
	rec.mu.Lock()
	planned, started := rec.planned[0], rec.started[0]
	rec.mu.Unlock()
	if !planned.Equal(next) {
		t.Errorf("first run planned at %v, NextRun said %v", planned, next)
	}
	if !started.Equal(next) {
		t.Errorf("first run started at %v, NextRun said %v", started, next)
	}
}

// TestOpenHonoursContext: Open with a context already done schedules nothing;
// one cancelled while Open schedules unschedules what it had scheduled, and a
// later Open with a live context schedules everything.
func TestOpenHonoursContext(t *testing.T) {
	rec := &runLog{runs: map[string]int{}}
	s, err := jobs.New(jobs.Options{Refresher: rec, Specs: []*warmer.Spec{spec("a", time.Hour), spec("b", time.Hour), spec("c", time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })

	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Open(done); !errors.Is(err, context.Canceled) {
		t.Errorf("Open(cancelled) = %v, want context.Canceled", err)
	}
	if got := s.Jobs(); len(got) != 0 {
		t.Errorf("jobs after Open(cancelled) = %v, want none", got)
	}

	// Ends once a and b are scheduled, before c is.
	mid := endsWhen{Context: context.Background(), ended: func() bool { return len(s.Jobs()) >= 2 }}
	if err := s.Open(mid); !errors.Is(err, context.Canceled) {
		t.Errorf("Open cancelled mid-way = %v, want context.Canceled", err)
	}
	if got := s.Jobs(); len(got) != 0 {
		t.Errorf("jobs after Open cancelled mid-way = %v, want none (what it scheduled is unscheduled)", got)
	}
	if _, ok := s.NextRun("a"); ok {
		t.Error("a still has a next run after the cancelled Open")
	}

	if err := s.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := s.Jobs()
	slices.Sort(got)
	if want := []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Errorf("jobs after Open = %v, want %v", got, want)
	}
}

// endsWhen is a context whose Err reports it cancelled as soon as ended
// returns true: Open checks it between declarations.
type endsWhen struct {
	context.Context
	ended func() bool
}

func (c endsWhen) Err() error {
	if c.ended() {
		return context.Canceled
	}
	return c.Context.Err()
}
