package jobs

import (
	"errors"
	"fmt"

	"github.com/hearth-dev/hearth/warmer"
)

// Apply brings the running schedule in line with specs, as a config reload does:
// a new declaration is scheduled and runs at once (its keys are not in Redis
// yet), a removed one is unscheduled (a run in progress finishes), and one whose
// interval changed is rescheduled at its usual phase. Any other change needs no
// rescheduling: each run asks the warmer for the declaration by name, and the
// warmer already holds the new one. While the schedule is not open (a
// standby, or between terms), Apply only replaces the declarations that the
// next Open will schedule.
//
// Apply is all or nothing: when a step fails, the steps already taken are
// undone in reverse (an unscheduled declaration is scheduled again at its
// usual phase), and the schedule stays the old one.
func (s *Scheduler) Apply(specs []*warmer.Spec) (warmer.Changes, error) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if !s.opened {
		s.opts.Specs = specs
		return warmer.Changes{}, nil
	}

	old := make(map[string]*warmer.Spec, len(s.opts.Specs))
	for _, spec := range s.opts.Specs {
		old[spec.Name] = spec
	}
	next := make(map[string]bool, len(specs))
	for _, spec := range specs {
		next[spec.Name] = true
	}
	var (
		ch warmer.Changes
		// undo holds, last first, what puts back each step taken so far.
		undo []func() error
	)
	// reschedule puts a declaration back on its schedule: its phase is a hash
	// of its name, so it runs when it would have.
	reschedule := func(spec *warmer.Spec) func() error {
		return func() error { return s.add(s.runsCtx, spec, phase(s.clock.Now(), spec.Name, spec.Interval)) }
	}
	unschedule := func(name string) func() error { return func() error { return s.remove(name) } }
	err := func() error {
		for _, spec := range s.opts.Specs {
			if !next[spec.Name] {
				if err := s.remove(spec.Name); err != nil {
					return err
				}
				undo = append(undo, reschedule(spec))
				ch.Removed = append(ch.Removed, spec.Name)
			}
		}
		now := s.clock.Now()
		for _, spec := range specs {
			prev, ok := old[spec.Name]
			switch {
			case !ok:
				// Undone even when add fails: it may have scheduled the job
				// but not its negative re-check.
				undo = append(undo, unschedule(spec.Name))
				if err := s.add(s.runsCtx, spec, now); err != nil {
					return err
				}
				ch.Added = append(ch.Added, spec.Name)
			case prev.Interval != spec.Interval || warmer.NegativeInterval(prev) != warmer.NegativeInterval(spec):
				if err := s.remove(spec.Name); err != nil {
					return err
				}
				undo = append(undo, reschedule(prev), unschedule(spec.Name))
				if err := s.add(s.runsCtx, spec, phase(s.clock.Now(), spec.Name, spec.Interval)); err != nil {
					return err
				}
				ch.Changed = append(ch.Changed, spec.Name)
			}
		}
		return nil
	}()
	if err != nil {
		errs := []error{err}
		for i := len(undo) - 1; i >= 0; i-- {
			if uerr := undo[i](); uerr != nil {
				errs = append(errs, fmt.Errorf("undo: %w", uerr))
			}
		}
		s.log.Error().Err(err).Msg("schedule update failed; the old schedule stays")
		return warmer.Changes{}, errors.Join(errs...)
	}
	s.opts.Specs = specs
	if !ch.Empty() {
		s.log.Info().Strs("added", ch.Added).Strs("removed", ch.Removed).Strs("rescheduled", ch.Changed).
			Msg("schedule updated")
	}
	return ch, nil
}

// remove unschedules a declaration's job.
func (s *Scheduler) remove(name string) error {
	if err := s.removeNegative(name); err != nil {
		return err
	}
	s.mu.Lock()
	job, ok := s.jobs[name]
	delete(s.jobs, name)
	s.mu.Unlock()
	if !ok {
		return nil
	}
	if err := s.gocron().RemoveJob(job.ID()); err != nil {
		return fmt.Errorf("unschedule %s: %w", name, err)
	}
	return nil
}

// Jobs returns the names of the scheduled declarations.
func (s *Scheduler) Jobs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.jobs))
	for name := range s.jobs {
		out = append(out, name)
	}
	return out
}
