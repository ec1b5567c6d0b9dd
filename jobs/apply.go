package jobs

import (
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
// specs are validated before they reach the scheduler (config validation and
// warmer.Declare), so a step can fail only on a fault of gocron's own: it is
// logged, and the other declarations are still brought in line.
func (s *Scheduler) Apply(specs []*warmer.Spec) warmer.Changes {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if !s.opened {
		s.opts.Specs = specs
		return warmer.Changes{}
	}

	old := make(map[string]*warmer.Spec, len(s.opts.Specs))
	for _, spec := range s.opts.Specs {
		old[spec.Name] = spec
	}
	next := make(map[string]bool, len(specs))
	for _, spec := range specs {
		next[spec.Name] = true
	}
	var ch warmer.Changes
	failed := func(name string, err error) {
		if err != nil {
			s.log.Error().Err(err).Str("family", name).Msg("schedule update failed for this declaration")
		}
	}
	for _, spec := range s.opts.Specs {
		if !next[spec.Name] {
			failed(spec.Name, s.remove(spec.Name))
			ch.Removed = append(ch.Removed, spec.Name)
		}
	}
	now := s.clock.Now()
	for _, spec := range specs {
		prev, ok := old[spec.Name]
		switch {
		case !ok:
			failed(spec.Name, s.add(s.runsCtx, spec, now))
			ch.Added = append(ch.Added, spec.Name)
		case prev.Interval != spec.Interval || warmer.NegativeInterval(prev) != warmer.NegativeInterval(spec):
			failed(spec.Name, s.remove(spec.Name))
			// Its phase is a hash of its name: it runs when it would have.
			failed(spec.Name, s.add(s.runsCtx, spec, phase(s.clock.Now(), spec.Name, spec.Interval)))
			ch.Changed = append(ch.Changed, spec.Name)
		}
	}
	s.opts.Specs = specs
	if !ch.Empty() {
		s.log.Info().Strs("added", ch.Added).Strs("removed", ch.Removed).Strs("rescheduled", ch.Changed).
			Msg("schedule updated")
	}
	return ch
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
