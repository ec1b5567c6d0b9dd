package warmer

// Classify exposes the access-log key matcher to the fuzz test.
func (w *Warmer) Classify(key string) (*Spec, string, string) { return classify(w.Specs(), key) }

func GlobEscape(s string) string { return globEscape(s) }
