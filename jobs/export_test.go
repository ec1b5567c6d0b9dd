package jobs

import "github.com/go-co-op/gocron/v2"

// WrapScheduler replaces the scheduler's gocron scheduler by what wrap
// returns for it: the seam for a gocron that does not stop.
func WrapScheduler(s *Scheduler, wrap func(gocron.Scheduler) gocron.Scheduler) {
	s.sched = wrap(s.sched)
}
