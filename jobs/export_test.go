package jobs

import "github.com/go-co-op/gocron/v2"

// WrapScheduler replaces each gocron scheduler the scheduler opens by what
// wrap returns for it: the seam for a gocron that does not stop.
func WrapScheduler(s *Scheduler, wrap func(gocron.Scheduler) gocron.Scheduler) {
	s.wrap = wrap
}
