package warmer

// Hot returns those of members that the declaration name keeps warm now: its
// declared members as of its last run, and the members loaded outside the
// declaration (admin refreshes, pre-warms) whose values may still be alive. A
// change notification refreshes only these, so that a change to a row no key
// is declared for writes nothing. A single key's one member is "". ok is false
// for an unknown declaration.
func (w *Warmer) Hot(name string, members []string) (hot []string, ok bool) {
	spec, st, ok := w.lookup(name)
	if !ok {
		return nil, false
	}
	if !spec.Template.IsFamily() {
		return []string{""}, true
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, m := range members {
		if st.declared.Has(m) {
			hot = append(hot, m)
		} else if st.oneOff != nil && st.oneOff.Contains(m) {
			hot = append(hot, m)
		}
	}
	return hot, true
}
