package warmer

import "time"

// The warmer's half of version-aware writes (the store's half, the version
// record and its script, is version.go): every entry a batch writes carries
// the sequence number its load started with and, for a declaration with a
// version column, the row's version.

// VersionTTL is how long a declaration's version records live: twice its
// longest value TTL, so that a record outlives the value it guards.
func VersionTTL(spec *Spec) time.Duration { return 2 * max(spec.MaxTTL(), spec.NegativeTTL) }

// Stamped reports whether spec's writes are version-checked: it names a
// version column, or change notifications (which load members on a second
// path, beside the schedule). The others keep the plain fenced write, which
// costs Redis half as much: one key touched per value, not two, and no record
// per key (on 1,000,000 members at 33,333 writes/s the version check cost the
// write rate and let keys expire on a 2-core machine; docs/freshness.md).
func Stamped(spec *Spec) bool { return spec.VersionColumn != "" || spec.Notify != "" }

// stamp marks a batch's entries with the sequence number its load started
// with and, for a declaration with a version column, each value's version;
// it leaves the entries of a declaration that is not Stamped alone.
func (w *Warmer) stamp(spec *Spec, entries []Entry, seq int64, results []Result) {
	if !Stamped(spec) {
		return
	}
	var versions map[string]int64
	if spec.VersionColumn != "" {
		versions = make(map[string]int64, len(results))
		for _, r := range results {
			if r.HasVersion && r.Err == nil && !r.Missing {
				versions[spec.Template.Key(r.Member)] = r.Version
			}
		}
	}
	vttl := VersionTTL(spec)
	for i := range entries {
		e := &entries[i]
		e.Seq, e.VersionTTL, e.Family = seq, vttl, spec.Name
		if v, ok := versions[e.Key]; ok {
			e.Versioned, e.Version = true, v
		}
	}
}
