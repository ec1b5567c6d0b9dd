package rewarm

// Armed reports whether r took its baseline: Run's first check, or Mark.
func Armed(r *Rewarmer) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runIDs != nil
}
