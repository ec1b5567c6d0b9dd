package jobs

import "github.com/go-co-op/gocron/v2"

// SetFault makes scheduling a declaration fail when f returns an error: the
// seam for tests of a schedule update that fails half way.
func SetFault(s *Scheduler, f func(name string) error) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	s.fault = f
}

// WrapScheduler replaces each gocron scheduler the scheduler opens by what
// wrap returns for it: the seam for a gocron that does not stop.
func WrapScheduler(s *Scheduler, wrap func(gocron.Scheduler) gocron.Scheduler) {
	s.wrap = wrap
}
