// Package jobs turns key declarations into gocron schedules: one job per
// declaration, every interval, first runs spread over the interval by a hash of
// the name, never overlapping itself. The schedule runs only while it is open:
// the daemon opens it for each leader term and it ends with the term (a fresh
// gocron scheduler per term), so a standby has no schedule at all. It knows
// schedules, not SQL or Redis.
package jobs

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jonboulle/clockwork"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/warmer"
)

// MinPeriod is the shortest period the scheduler accepts for any job: gocron
// computing the next run of a 1 ns interval loops for ever (and its Shutdown
// never returns), so a shorter period is refused, whatever config let it
// through.
const MinPeriod = config.MinPeriod

// shutdownGrace is how long Close still waits for gocron once its context
// ended and the runs were cancelled, before it abandons the scheduler.
const shutdownGrace = 100 * time.Millisecond

// Refresher is the part of the warmer the scheduler drives.
type Refresher interface {
	Refresh(ctx context.Context, name string, ro warmer.RunOptions) (warmer.Outcome, error)
}

// Options configures a Scheduler.
type Options struct {
	Refresher Refresher
	Specs     []*warmer.Spec
	// Spread is the fraction of the interval a family's batches are paced over.
	Spread float64
	Logger zerolog.Logger
	// Clock drives the schedule (gocron's and the scheduler's own reading of
	// the time); nil is the real clock. Tests inject a fake one.
	Clock clockwork.Clock
}

// Scheduler owns the declarations' schedule: while open, a gocron scheduler
// and its jobs.
type Scheduler struct {
	opts   Options
	clock  clockwork.Clock
	log    zerolog.Logger
	drain  chan struct{}
	runCtx context.Context
	cancel context.CancelFunc
	// wrap, set only by tests (export_test.go), wraps each gocron scheduler.
	wrap func(gocron.Scheduler) gocron.Scheduler

	mu sync.Mutex
	// sched is the open term's gocron scheduler, nil while closed.
	sched gocron.Scheduler
	jobs  map[string]gocron.Job
	// negJobs are the negative re-checks (negative.go), by declaration.
	negJobs map[string]gocron.Job
	// applyMu serialises Open, the end of an open schedule and Apply
	// (reloads); opened is true while a schedule is open.
	applyMu sync.Mutex
	opened  bool
	closed  bool
	// runsCtx is the open schedule's runs' context (see Open), termCtx the
	// context it was opened with: no run starts once that has ended.
	runsCtx, termCtx context.Context
	// stops waits for the goroutine that ends each open schedule.
	stops sync.WaitGroup
}

// New builds the scheduler; nothing runs until Open.
func New(opts Options) (*Scheduler, error) {
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Scheduler{
		opts: opts, clock: opts.Clock,
		log:   opts.Logger.With().Str("component", "jobs").Logger(),
		drain: make(chan struct{}), runCtx: ctx, cancel: cancel,
		jobs: map[string]gocron.Job{},
	}, nil
}

// newGocron builds the gocron scheduler of one open schedule.
func (s *Scheduler) newGocron() (gocron.Scheduler, error) {
	g, err := gocron.NewScheduler(gocron.WithClock(s.clock),
		gocron.WithStopTimeout(time.Hour)) // Close's context bounds the wait
	if err != nil {
		return nil, fmt.Errorf("new scheduler: %w", err)
	}
	if s.wrap != nil {
		g = s.wrap(g)
	}
	return g, nil
}

// Offset is where in its interval a declaration's runs fall: a hash of its name,
// so that keys declared together never refresh together, and so that a restart
// or a new leader keeps the same phase.
func Offset(name string, interval time.Duration) time.Duration {
	if interval <= 0 {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return time.Duration(h.Sum64() % uint64(interval))
}

// Open schedules every declaration on a new gocron scheduler and starts it;
// the schedule runs until ctx ends (the leader's term), then stops: no run
// starts after that, and the runs in flight are waited for. Each first run is
// at its offset within one interval of now, so a new term keeps the phase of
// the last one. A context already done opens nothing; one done before Open
// has scheduled everything, or a declaration that cannot be scheduled,
// unschedules what Open scheduled: the scheduler is then as before Open, and
// Open may be tried again. Open on an open schedule is an error.
func (s *Scheduler) Open(ctx context.Context) error {
	_, err := s.open(ctx)
	return err
}

// Run is the schedule of one leader term: it opens the schedule (see Open),
// calls opened (if not nil) once every declaration is scheduled, and returns
// once the schedule has stopped: ctx ended, or Close drained it (or gave up
// on it at its deadline).
func (s *Scheduler) Run(ctx context.Context, opened func()) error {
	done, err := s.open(ctx)
	if err != nil {
		return err
	}
	if opened != nil {
		opened()
	}
	select {
	case <-done:
	case <-s.runCtx.Done():
	}
	return nil
}

// open is Open; done is closed once the schedule has stopped.
func (s *Scheduler) open(ctx context.Context) (done chan struct{}, err error) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("open scheduler: %w", err)
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if s.opened || closed {
		return nil, errors.New("open scheduler: already open, or closed")
	}
	g, gerr := s.newGocron()
	if gerr != nil {
		return nil, gerr
	}
	// The runs outlive the term that started them, up to Close's deadline: a
	// run in flight when the term ends finishes its batch (the gate refuses
	// the next ones), and a write sent after a newer leader took over is
	// refused by the fence in Redis, not by a check here.
	rctx, cancelRuns := context.WithCancel(s.runCtx)
	s.mu.Lock()
	s.sched = g
	s.mu.Unlock()
	s.termCtx = ctx
	now := s.clock.Now()
	var added []string
	err = func() error {
		for _, spec := range s.opts.Specs {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("open scheduler: %w", err)
			}
			// Listed first: a half-scheduled declaration (its job but not its
			// negative re-check) is unscheduled too.
			added = append(added, spec.Name)
			if err := s.add(rctx, spec, phase(now, spec.Name, spec.Interval)); err != nil {
				return err
			}
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("open scheduler: %w", err)
		}
		return nil
	}()
	if err != nil {
		errs := []error{err}
		for _, name := range slices.Backward(added) {
			if rerr := s.remove(name); rerr != nil {
				errs = append(errs, rerr)
			}
		}
		cancelRuns()
		_ = g.Shutdown()
		s.mu.Lock()
		s.sched = nil
		s.mu.Unlock()
		return nil, errors.Join(errs...)
	}
	s.opened = true
	s.runsCtx = rctx
	g.Start()
	s.log.Info().Int("jobs", len(s.opts.Specs)).Msg("scheduled")
	s.stops.Add(1)
	done = make(chan struct{})
	go func() {
		defer s.stops.Done()
		defer close(done)
		select {
		case <-ctx.Done():
		case <-s.drain:
		}
		s.stop(g)
		cancelRuns()
	}()
	return done, nil
}

// stop ends an open schedule: no run starts after it, the runs in flight are
// waited for (Close bounds that wait), and the jobs are forgotten.
func (s *Scheduler) stop(g gocron.Scheduler) {
	s.applyMu.Lock()
	s.mu.Lock()
	s.jobs, s.negJobs, s.sched = map[string]gocron.Job{}, nil, nil
	s.mu.Unlock()
	s.opened = false
	s.applyMu.Unlock()
	// Outside the locks: a gocron that does not stop holds up nothing but
	// this goroutine (Close bounds its wait for it).
	if err := g.Shutdown(); err != nil {
		s.log.Warn().Err(err).Msg("schedule stop")
	}
	s.log.Info().Msg("schedule closed")
}

// add schedules a declaration every interval from first; a first run that is not
// in the future runs at once. Its runs get ctx (the open schedule's).
func (s *Scheduler) add(ctx context.Context, spec *warmer.Spec, first time.Time) error {
	start := gocron.WithStartDateTime(first)
	if now := s.clock.Now(); !first.After(now) {
		start = gocron.WithStartImmediately()
		first = now
	}
	name := spec.Name
	interval := spec.Interval
	if interval < MinPeriod {
		return fmt.Errorf("schedule %s: interval %s is below the scheduler's minimum %s", name, interval, MinPeriod)
	}
	spread := time.Duration(float64(interval) * s.opts.Spread)
	log := s.log.With().Str("family", name).Logger()
	term := s.termCtx
	task := func() {
		if term.Err() != nil {
			return // the term ended; its schedule is stopping
		}
		planned := plannedStart(s.clock.Now(), first, interval)
		out, err := s.opts.Refresher.Refresh(ctx, name, warmer.RunOptions{Planned: planned, Spread: spread, Drain: s.drain})
		if err != nil {
			log.Warn().Err(err).Int("written", out.Written).Int("failed", out.Failed).Msg("refresh failed")
			return
		}
		log.Debug().Int("written", out.Written).Int("negative", out.Negative).Dur("took_ms", out.Duration).Msg("refreshed")
	}
	job, err := s.gocron().NewJob(
		gocron.DurationJob(interval),
		gocron.NewTask(task),
		gocron.WithName("hearth:"+name),
		gocron.WithTags(name),
		gocron.WithStartAt(start),
		gocron.WithSingletonMode(gocron.LimitModeReschedule),
	)
	if err != nil {
		return fmt.Errorf("schedule %s: %w", name, err)
	}
	s.mu.Lock()
	s.jobs[name] = job
	s.mu.Unlock()
	return s.addNegative(ctx, spec, s.clock.Now())
}

func (s *Scheduler) gocron() gocron.Scheduler {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sched
}

// phase returns the first run time of a declaration after now, at its offset.
func phase(now time.Time, name string, interval time.Duration) time.Time {
	off := Offset(name, interval)
	first := now.Truncate(interval).Add(off)
	for !first.After(now.Add(time.Millisecond)) {
		first = first.Add(interval)
	}
	return first
}

// plannedStart is the scheduled time of the run closest to now.
func plannedStart(now, first time.Time, interval time.Duration) time.Time {
	if now.Before(first) {
		return first
	}
	k := (now.Sub(first) + interval/2) / interval
	return first.Add(k * interval)
}

// NextRun returns when a declaration's next scheduled run starts, as gocron
// plans it; false when the schedule is not open (a standby) or does not hold
// the declaration.
func (s *Scheduler) NextRun(name string) (time.Time, bool) {
	s.mu.Lock()
	job, ok := s.jobs[name]
	s.mu.Unlock()
	if !ok {
		return time.Time{}, false
	}
	t, err := job.NextRun()
	if err != nil || t.IsZero() {
		return time.Time{}, false
	}
	return t, true
}

// Close stops scheduling for good, lets in-flight runs finish their current
// batches until ctx is done, then abandons them. It never waits on gocron past
// ctx (and a short grace once the runs are cancelled): a scheduler that does
// not stop is logged and left behind, so a shutdown always ends.
func (s *Scheduler) Close(ctx context.Context) error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.drain)
	}
	s.mu.Unlock()
	done := make(chan error, 1)
	go func() { s.stops.Wait(); done <- nil }()
	select {
	case err := <-done:
		s.cancel()
		return err
	case <-ctx.Done():
	}
	s.cancel()
	drain := fmt.Errorf("drain: %w", context.Cause(ctx))
	t := time.NewTimer(shutdownGrace)
	defer t.Stop()
	select {
	case err := <-done:
		return errors.Join(drain, err)
	case <-t.C:
		s.log.Error().Dur("grace_ms", shutdownGrace).Msg("scheduler did not stop: abandoned")
		return errors.Join(drain, fmt.Errorf("scheduler shutdown abandoned: %w", context.DeadlineExceeded))
	}
}
