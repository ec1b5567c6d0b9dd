package prewarm

import "github.com/hearth-dev/hearth/warmer"

// Classify exposes the access-log key matcher to the fuzz test.
func Classify(specs []*warmer.Spec, key string) (*warmer.Spec, string, string) {
	return classify(specs, key)
}

func GlobEscape(s string) string { return globEscape(s) }
