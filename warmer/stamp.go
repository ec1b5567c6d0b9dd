package warmer

import (
	"time"

	"github.com/hearth-dev/hearth/store"
)

// VersionTTL is how long a declaration's version records live: twice its
// longest value TTL, so that a record outlives the value it guards.
func VersionTTL(spec *Spec) time.Duration { return 2 * max(spec.MaxTTL(), spec.NegativeTTL) }

// Stamped reports whether spec's writes are version-checked: it names a
// version column, or change notifications (which load members on a second
// path, beside the schedule). The others keep the plain fenced write, which
// costs Redis half as much (docs/freshness.md).
func Stamped(spec *Spec) bool { return spec.VersionColumn != "" || spec.Notify != "" }

// stamp marks a Stamped declaration's entries with the sequence number their
// load started with (a row's version was set with its entry).
func (w *Warmer) stamp(spec *Spec, entries []store.Entry, seq int64) {
	if !Stamped(spec) {
		return
	}
	vttl := VersionTTL(spec)
	for i := range entries {
		e := &entries[i]
		e.Seq, e.VersionTTL, e.Family = seq, vttl, spec.Name
	}
}
