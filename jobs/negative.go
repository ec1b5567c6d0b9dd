package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/hearth-dev/hearth/warmer"
)

// NegativeRefresher is a Refresher that can ask the origin again for the
// members it last found missing (warmer.Warmer is one).
type NegativeRefresher interface {
	RefreshNegatives(ctx context.Context, name string) (warmer.Outcome, error)
}

// addNegative schedules the re-check of a declaration's missing members every
// warmer.NegativeInterval, when that is shorter than its refresh interval: the
// not-found sentinel is short-lived by design, and a lapsed sentinel would send
// every reader to the origin. It is added and removed with the declaration's
// own job (add, remove), and rescheduled when its interval changes.
func (s *Scheduler) addNegative(ctx context.Context, spec *warmer.Spec, now time.Time) error {
	nr, ok := s.opts.Refresher.(NegativeRefresher)
	every := warmer.NegativeInterval(spec)
	if !ok || every <= 0 {
		return nil
	}
	name := spec.Name
	if every < MinPeriod {
		return fmt.Errorf("schedule %s negative re-check: every %s is below the scheduler's minimum %s", name, every, MinPeriod)
	}
	log := s.log.With().Str("family", name).Logger()
	term := s.termCtx
	task := func() {
		if term.Err() != nil {
			return // the term ended; its schedule is stopping
		}
		out, err := nr.RefreshNegatives(ctx, name)
		if err != nil {
			log.Warn().Err(err).Int("members", out.Members).Msg("negative re-check failed")
			return
		}
		if out.Members > 0 {
			log.Debug().Int("members", out.Members).Int("found", out.Written).Msg("negative re-check")
		}
	}
	job, err := s.gocron().NewJob(
		gocron.DurationJob(every),
		gocron.NewTask(task),
		gocron.WithName("hearth:"+name+":negative"),
		gocron.WithTags(name),
		gocron.WithStartAt(gocron.WithStartDateTime(now.Add(every))),
		gocron.WithSingletonMode(gocron.LimitModeReschedule),
	)
	if err != nil {
		return fmt.Errorf("schedule %s negative re-check: %w", name, err)
	}
	s.mu.Lock()
	if s.negJobs == nil {
		s.negJobs = map[string]gocron.Job{}
	}
	s.negJobs[name] = job
	s.mu.Unlock()
	return nil
}

// removeNegative unschedules a declaration's negative re-check, if it has one.
func (s *Scheduler) removeNegative(name string) error {
	s.mu.Lock()
	job, ok := s.negJobs[name]
	delete(s.negJobs, name)
	s.mu.Unlock()
	if !ok {
		return nil
	}
	if err := s.gocron().RemoveJob(job.ID()); err != nil {
		return fmt.Errorf("unschedule %s negative re-check: %w", name, err)
	}
	return nil
}
