package config

// What the tests read of the bounds table: it is rendered into
// docs/configuration.md by TestBoundsDocumented, and the daemon needs none of it.

import (
	"fmt"
	"strings"
	"time"
)

// BoundFor returns the bound of a field by its path in the table's form
// (keys[].ttl).
func BoundFor(path string) (Bound, bool) {
	b, ok := boundsByPath[path]
	return b, ok
}

// IsDuration reports whether the bound is of a duration.
func (b Bound) IsDuration() bool { return b.Max > 0 }

// BoundsMarkdown renders the table as docs/configuration.md prints it.
func BoundsMarkdown() string {
	var b strings.Builder
	b.WriteString("| Field | Minimum | Maximum | 0 means |\n|---|---|---|---|\n")
	for _, x := range Bounds {
		lo, hi := num(x.Lo), num(x.Hi)
		if x.IsDuration() {
			lo, hi = docDuration(x.Min), docDuration(x.Max)
			if x.Step > 0 {
				lo += ", whole " + stepName(x.Step)
			}
		} else if x.HiOpen {
			hi = "below " + hi
		}
		zero := x.Zero
		if zero == "" {
			zero = "(not allowed)"
			if !x.IsDuration() && x.Lo <= 0 {
				zero = "in range"
			}
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", x.Path, lo, hi, zero)
	}
	return b.String()
}

func docDuration(d time.Duration) string {
	if d == MaxDuration {
		return "8760h (a year)"
	}
	s := d.String()
	for _, suffix := range []string{"m0s", "h0m"} {
		s = strings.Replace(s, suffix, suffix[:1], 1)
	}
	return "`" + s + "`"
}
