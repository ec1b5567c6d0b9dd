package warmer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hearth-dev/hearth/store"
)

// CheckedStore is a Store whose version-checked writes say, per entry, what
// they found wrong (the leader's FencedStore). The warmer writes through
// SetChecked when its store has it, counts and logs what it found, and
// re-reads the origin once for the entries to recheck.
type CheckedStore interface {
	Store
	SetChecked(ctx context.Context, entries []store.Entry) ([]store.VersionCheck, error)
}

// Store is where the warmer's writes land. The plain store writes directly; the
// leader lease supplies a fenced one so that only the current leader's writes land.
type Store interface {
	// Set writes every entry with its TTL (SET key value PX ttl), pipelined.
	Set(ctx context.Context, entries []store.Entry) error
	// Extend pushes each existing key's expiry out to ttl without touching its
	// value and never shortens it; kept[i] reports whether keys[i] still existed.
	Extend(ctx context.Context, keys []string, ttls []time.Duration) (kept []bool, err error)
}

var (
	_ Store     = (*store.RedisStore)(nil)
	_ TTLReader = (*store.RedisStore)(nil)
)

// ErrPrewarmFenced: a pre-warm write was refused because a leader took over
// after the pre-warm read the epoch.
var ErrPrewarmFenced = errors.New("pre-warm write fenced by a newer leader")

// EachStore is a Store that tells, per entry, what a write did. The warmer
// writes through SetEach when its store has it, and counts present keys
// (Outcome.Present) and fenced ones apart from the written.
type EachStore interface {
	Store
	SetEach(ctx context.Context, entries []store.Entry) ([]store.SetOutcome, error)
}

// write writes entries through ws: per entry when it is an EachStore,
// with what the version check found when it is a CheckedStore, else all
// written or none.
func (w *Warmer) write(ctx context.Context, ws Store, entries []store.Entry) ([]store.SetOutcome, []store.VersionCheck, error) {
	if es, ok := ws.(EachStore); ok {
		res, err := es.SetEach(ctx, entries)
		return res, nil, err
	}
	if cs, ok := ws.(CheckedStore); ok {
		checks, err := cs.SetChecked(ctx, entries)
		return nil, checks, err
	}
	return nil, nil, ws.Set(ctx, entries)
}

// settle applies a conditional write's outcomes to a batch's counts: a
// present key is warm but was not written (Present), a fenced one failed.
// It returns the members whose write was fenced, and the written-or-present
// and negative member lists without them.
func settle(out *Outcome, spec *Spec, entries []store.Entry, res []store.SetOutcome, okm, negm []string) (ok, neg, fenced []string) {
	if res == nil {
		return okm, negm, nil
	}
	isNeg := make(map[string]bool, len(negm))
	for _, m := range negm {
		isNeg[spec.Template.Key(m)] = true
	}
	drop := map[string]bool{}
	for i, r := range res {
		if r == store.SetWritten {
			continue
		}
		if isNeg[entries[i].Key] {
			out.Negative--
		} else {
			out.Written--
		}
		switch r {
		case store.SetPresent:
			out.Present++
		case store.SetFenced:
			out.Failed++
			out.Fenced++
			drop[entries[i].Key] = true
		}
	}
	if len(drop) == 0 {
		return okm, negm, nil
	}
	out.LastError = fmt.Errorf("write %s: %d keys: %w", spec.Name, len(drop), ErrPrewarmFenced)
	isFenced := func(m string) bool { return drop[spec.Template.Key(m)] }
	for _, m := range okm {
		if isFenced(m) {
			fenced = append(fenced, m)
		}
	}
	return without(okm, isFenced), without(negm, isFenced), fenced
}

// without returns the members of ms that drop does not hold.
func without(ms []string, drop func(m string) bool) []string {
	var kept []string
	for _, m := range ms {
		if !drop(m) {
			kept = append(kept, m)
		}
	}
	return kept
}
