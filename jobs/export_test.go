package jobs

// SetFault makes scheduling a declaration fail when f returns an error: the
// seam for tests of a schedule update that fails half way.
func SetFault(s *Scheduler, f func(name string) error) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	s.fault = f
}
