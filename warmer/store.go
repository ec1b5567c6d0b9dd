package warmer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Entry is one value to write.
type Entry struct {
	Key   string
	Value []byte
	TTL   time.Duration

	// Seq, when > 0, stamps the write with the order in which its load
	// started (see version.go): a FencedStore refuses it if a load of the same
	// key that started later already wrote, or, when Versioned, if Redis holds
	// a newer origin Version. The unfenced RedisStore ignores stamps.
	Seq       int64
	Versioned bool
	Version   int64
	// VersionTTL is how long the key's version record lives (0: twice TTL).
	VersionTTL time.Duration
	// Family labels the version metrics of a stamped write.
	Family string
	// Unconfirmed, when not empty, is a version record that refused this
	// key's last write although its value did not back it (VersionCheck.Recheck),
	// and that this entry's re-read of the origin did not confirm: if the key's
	// record is still exactly this and would refuse the write again, the store
	// treats it as foreign and replaces it.
	Unconfirmed string
}

// Reasons of hearth_version_repairs_total: what a version-checked write found
// wrong at a key.
const (
	// RepairValueMismatch: the value was not the bytes its record says Hearth
	// wrote (another client's SET, an application's older value).
	RepairValueMismatch = "value_mismatch"
	// RepairValueAbsent: a record refused the write while the value it
	// guards was absent.
	RepairValueAbsent = "value_absent"
	// RepairRecordUnconfirmed: a record refused the write with a version the
	// origin, re-read after it, did not reach: foreign, replaced.
	RepairRecordUnconfirmed = "record_unconfirmed"
	// RepairRecordMalformed: the record was not one Hearth writes (format,
	// number range, Redis type, TTL, epoch): treated as absent, replaced.
	RepairRecordMalformed = "record_malformed"
)

// VersionCheck is what a version-checked write found wrong at one entry's
// key (CheckedStore); the zero value: nothing.
type VersionCheck struct {
	// Reason is one of the Repair… reasons, "" when nothing was wrong.
	Reason string
	// Found says what was wrong, for the log; never the value's bytes.
	Found string
	// Recheck: the write was refused as older by a version record that the
	// value in Redis does not back (absent, or other bytes). Record is that
	// record: the writer re-reads the origin once and writes the entry again
	// with Entry.Unconfirmed = Record.
	Recheck bool
	Record  string
}

// CheckedStore is a Store whose version-checked writes say, per entry, what
// they found wrong (the leader's FencedStore). The warmer writes through
// SetChecked when its store has it, counts and logs what it found, and
// re-reads the origin once for the entries to recheck.
type CheckedStore interface {
	Store
	SetChecked(ctx context.Context, entries []Entry) ([]VersionCheck, error)
}

// Store is where the warmer's writes land. The plain store writes directly; the
// leader lease supplies a fenced one so that only the current leader's writes land.
type Store interface {
	// Set writes every entry with its TTL (SET key value PX ttl), pipelined.
	Set(ctx context.Context, entries []Entry) error
	// Extend pushes each existing key's expiry out to ttl without touching its
	// value and never shortens it; kept[i] reports whether keys[i] still existed.
	Extend(ctx context.Context, keys []string, ttls []time.Duration) (kept []bool, err error)
}

// RedisStore is the unfenced Store: pipelined SET … PX and PEXPIRE … GT.
type RedisStore struct {
	Client redis.UniversalClient
}

var _ Store = (*RedisStore)(nil)

// Set writes entries in one pipeline. SET is idempotent, so a retransmitted
// pipeline is harmless.
func (s *RedisStore) Set(ctx context.Context, entries []Entry) error {
	if len(entries) == 0 {
		return nil
	}
	pipe := s.Client.Pipeline()
	for _, e := range entries {
		pipe.Set(ctx, e.Key, e.Value, e.TTL)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("write %d keys: %w", len(entries), err)
	}
	return nil
}

// Extend sets PEXPIRE … GT on each key in one pipeline.
func (s *RedisStore) Extend(ctx context.Context, keys []string, ttls []time.Duration) ([]bool, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := s.Client.Pipeline()
	cmds := make([]*redis.Cmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Do(ctx, "pexpire", k, ttls[i].Milliseconds(), "gt")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("extend %d keys: %w", len(keys), err)
	}
	return existed(ctx, s.Client, keys, cmds)
}

// existed tells, for keys whose PEXPIRE GT answered 0, whether the key exists
// (its TTL was already longer) or is gone.
func existed(ctx context.Context, c redis.UniversalClient, keys []string, cmds []*redis.Cmd) ([]bool, error) {
	kept := make([]bool, len(keys))
	var check []int
	for i, cmd := range cmds {
		if n, _ := cmd.Int64(); n == 1 {
			kept[i] = true
		} else {
			check = append(check, i)
		}
	}
	if len(check) == 0 {
		return kept, nil
	}
	pipe := c.Pipeline()
	ex := make([]*redis.IntCmd, len(check))
	for j, i := range check {
		ex[j] = pipe.Exists(ctx, keys[i])
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("check %d keys: %w", len(check), err)
	}
	for j, i := range check {
		kept[i] = ex[j].Val() == 1
	}
	return kept, nil
}

// ErrPrewarmFenced: a pre-warm write was refused because a leader took over
// after the pre-warm read the epoch.
var ErrPrewarmFenced = errors.New("pre-warm write fenced by a newer leader")

// SetOutcome is what a store did with one entry of a write.
type SetOutcome uint8

const (
	// SetWritten: the value was written.
	SetWritten SetOutcome = iota
	// SetPresent: the key already held a value, which was left alone
	// (set-if-absent).
	SetPresent
	// SetFenced: the fence holds a newer epoch than the writer's: a leader
	// took over after the writer read the epoch; nothing was written.
	SetFenced
)

// EachStore is a Store that tells, per entry, what a write did. The warmer
// writes through SetEach when its store has it, and counts present keys
// (Outcome.Present) and fenced ones apart from the written.
type EachStore interface {
	Store
	SetEach(ctx context.Context, entries []Entry) ([]SetOutcome, error)
}

// write writes entries through ws: per entry when it is an EachStore,
// with what the version check found when it is a CheckedStore, else all
// written or none.
func (w *Warmer) write(ctx context.Context, ws Store, entries []Entry) ([]SetOutcome, []VersionCheck, error) {
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
func settle(out *Outcome, spec *Spec, entries []Entry, res []SetOutcome, okm, negm []string) (ok, neg, fenced []string) {
	if res == nil {
		return okm, negm, nil
	}
	isNeg := make(map[string]bool, len(negm))
	for _, m := range negm {
		isNeg[spec.Template.Key(m)] = true
	}
	drop := map[string]bool{}
	for i, r := range res {
		if r == SetWritten {
			continue
		}
		if isNeg[entries[i].Key] {
			out.Negative--
		} else {
			out.Written--
		}
		switch r {
		case SetPresent:
			out.Present++
		case SetFenced:
			out.Failed++
			out.Fenced++
			drop[entries[i].Key] = true
		}
	}
	if len(drop) == 0 {
		return okm, negm, nil
	}
	out.LastError = fmt.Errorf("write %s: %d keys: %w", spec.Name, len(drop), ErrPrewarmFenced)
	keep := func(ms []string) []string {
		var kept []string
		for _, m := range ms {
			if !drop[spec.Template.Key(m)] {
				kept = append(kept, m)
			}
		}
		return kept
	}
	for _, m := range okm {
		if drop[spec.Template.Key(m)] {
			fenced = append(fenced, m)
		}
	}
	return keep(okm), keep(negm), fenced
}
