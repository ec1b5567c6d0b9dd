// Package jobs turns key declarations into gocron schedules: one job per
// declaration, every interval, first runs spread over the interval by a hash of
// the name, never overlapping itself, gated by leadership. It knows schedules,
// not SQL or Redis.
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
	// Elector gates every run; nil runs every job (no leadership).
	Elector gocron.Elector
	Logger  zerolog.Logger
	// Clock drives the schedule (gocron's and the scheduler's own reading of
	// the time); nil is the real clock. Tests inject a fake one.
	Clock clockwork.Clock
}

// Scheduler owns the gocron scheduler and its jobs.
type Scheduler struct {
	opts   Options
	clock  clockwork.Clock
	sched  gocron.Scheduler
	log    zerolog.Logger
	drain  chan struct{}
	runCtx context.Context
	cancel context.CancelFunc

	mu   sync.Mutex
	jobs map[string]gocron.Job
	// runs is when each scheduled declaration runs: its first run, then
	// every interval (see NextRun).
	runs map[string]cadence
	// negJobs are the negative re-checks (negative.go), by declaration.
	negJobs map[string]gocron.Job
	// applyMu serialises Open and Apply (reloads); opened is set by Open.
	applyMu sync.Mutex
	opened  bool
}

// New builds the scheduler; nothing runs until Open.
func New(opts Options) (*Scheduler, error) {
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	so := []gocron.SchedulerOption{gocron.WithClock(opts.Clock)}
	if opts.Elector != nil {
		so = append(so, gocron.WithDistributedElector(opts.Elector))
	}
	so = append(so, gocron.WithStopTimeout(time.Hour)) // Close's context bounds the wait
	sched, err := gocron.NewScheduler(so...)
	if err != nil {
		return nil, fmt.Errorf("new scheduler: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Scheduler{
		opts: opts, clock: opts.Clock, sched: sched,
		log:   opts.Logger.With().Str("component", "jobs").Logger(),
		drain: make(chan struct{}), runCtx: ctx, cancel: cancel,
		jobs: map[string]gocron.Job{}, runs: map[string]cadence{},
	}, nil
}

// cadence is a declaration's schedule: first run, then every interval.
type cadence struct {
	first    time.Time
	interval time.Duration
}

// next is the first run at or after t.
func (c cadence) next(t time.Time) time.Time {
	if !t.After(c.first) || c.interval <= 0 {
		return c.first
	}
	k := (t.Sub(c.first) + c.interval - 1) / c.interval
	return c.first.Add(k * c.interval)
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

// Open schedules every declaration and starts the scheduler. Each first run is
// at its offset within one interval of now. A context already done opens
// nothing; one done before Open has scheduled everything, or a declaration
// that cannot be scheduled, unschedules what Open scheduled: the scheduler is
// then as before Open, and Open may be tried again.
func (s *Scheduler) Open(ctx context.Context) error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("open scheduler: %w", err)
	}
	now := s.clock.Now()
	var added []string
	err := func() error {
		for _, spec := range s.opts.Specs {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("open scheduler: %w", err)
			}
			// Listed first: a half-scheduled declaration (its job but not its
			// negative re-check) is unscheduled too.
			added = append(added, spec.Name)
			if err := s.add(spec, phase(now, spec.Name, spec.Interval)); err != nil {
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
		return errors.Join(errs...)
	}
	s.opened = true
	s.sched.Start()
	s.log.Info().Int("jobs", len(s.opts.Specs)).Msg("scheduled")
	return nil
}

// add schedules a declaration every interval from first; a first run that is not
// in the future runs at once.
func (s *Scheduler) add(spec *warmer.Spec, first time.Time) error {
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
	task := func() {
		planned := plannedStart(s.clock.Now(), first, interval)
		out, err := s.opts.Refresher.Refresh(s.runCtx, name, warmer.RunOptions{Planned: planned, Spread: spread, Drain: s.drain})
		if err != nil {
			log.Warn().Err(err).Int("written", out.Written).Int("failed", out.Failed).Msg("refresh failed")
			return
		}
		log.Debug().Int("written", out.Written).Int("negative", out.Negative).Dur("took_ms", out.Duration).Msg("refreshed")
	}
	job, err := s.sched.NewJob(
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
	s.runs[name] = cadence{first: first, interval: interval}
	s.mu.Unlock()
	return s.addNegative(spec, s.clock.Now())
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

// NextRun returns when a declaration's next scheduled run starts, at or after
// now: its first run, then every interval. It is computed from the schedule,
// not asked of gocron, whose Job.NextRun keeps the time of the first run the
// elector refused: on a standby it stays in the past for good, and a takeover
// catch-up that trusted it thought the next write was due at once. A run is
// started at that time on the leader; on a standby it is skipped.
func (s *Scheduler) NextRun(name string) (time.Time, bool) {
	s.mu.Lock()
	c, ok := s.runs[name]
	s.mu.Unlock()
	if !ok {
		return time.Time{}, false
	}
	return c.next(s.clock.Now()), true
}

// Close stops scheduling, lets in-flight runs finish their current batches until
// ctx is done, then abandons them. It never waits on gocron past ctx (and a
// short grace once the runs are cancelled): a scheduler that does not stop
// is logged and left behind, so a shutdown always ends.
func (s *Scheduler) Close(ctx context.Context) error {
	close(s.drain)
	done := make(chan error, 1)
	go func() { done <- s.sched.Shutdown() }()
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
