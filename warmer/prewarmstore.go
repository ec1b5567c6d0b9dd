package warmer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/store"
)

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

// PrewarmStoreOptions configures a PrewarmStore.
type PrewarmStoreOptions struct {
	Client redis.UniversalClient
	// Namespace is redis.namespace: where the leader keeps its lease, epoch
	// counter and fences.
	Namespace string
	// PerSlot: one fence key per hash slot (Redis Cluster). The default is
	// on for a *redis.ClusterClient, as for the leader's FencedStore.
	PerSlot *bool
	// Overwrite replaces present values; the default fills absent keys only.
	Overwrite bool
	// Versioned, when set, writes the entries the leader version-checks
	// (stamped: Entry.Seq > 0) whenever the writes are fenced, so that the
	// pre-warm never replaces a newer version the leader wrote and leaves a
	// version record its next write compares with (fence.PrewarmVersioned).
	// Without it they are written as the others are.
	Versioned PrewarmVersionedWriter
	Logger    zerolog.Logger
}

// PrewarmVersionedWriter writes stamped entries for a fenced pre-warm with
// the writer's epoch, through the version check: the key's version record
// decides whether the entry is older than what Redis holds. fenceKey names the
// fence guarding a key. Outcomes as for EachStore.
type PrewarmVersionedWriter interface {
	SetVersioned(ctx context.Context, epoch int64, overwrite bool, fenceKey func(string) string, entries []Entry) ([]SetOutcome, error)
}

// PrewarmStore is the Store of `hearth prewarm`, a one-shot writer into a
// Redis that may be serving. By default it fills only absent keys (SET … NX
// PX), so a fresher value already in Redis is never replaced; Overwrite
// replaces them (SET … PX).
//
// When Hearth's leader state is present in that Redis (its lease, epoch
// counter or fence), every write is fenced: Prepare reads the newest epoch
// Hearth issued there, and each write is a script that refuses it if the
// fence (in the value key's hash slot) holds a newer one, that is, if a leader
// took over after the pre-warm started. The pre-warm never raises the fence:
// it is not a leader. Without leader state the writes are plain pipelined SETs.
type PrewarmStore struct {
	client    redis.UniversalClient
	ns        string
	fences    *store.Fences
	overwrite bool
	log       zerolog.Logger

	fenced    bool  // leader state found: writes go through the script
	epoch     int64 // the writer's epoch when fenced
	foreign   atomic.Int64
	versioned PrewarmVersionedWriter
}

var _ EachStore = (*PrewarmStore)(nil)

// NewPrewarmStore builds a PrewarmStore; call Prepare before writing.
func NewPrewarmStore(opts PrewarmStoreOptions) *PrewarmStore {
	perSlot := store.PerSlot(opts.Client, opts.PerSlot)
	return &PrewarmStore{client: opts.Client, ns: opts.Namespace, fences: store.NewFences(opts.Namespace, perSlot), overwrite: opts.Overwrite,
		versioned: opts.Versioned, log: opts.Logger.With().Str("component", "prewarm-store").Logger()}
}

// PrewarmFence is what Prepare found of Hearth's leader state.
type PrewarmFence struct {
	// Fenced is true when leader state was found: writes carry Epoch.
	Fenced bool
	// Epoch is the newest epoch issued in this Redis (the epoch counter, or
	// the lease's if newer).
	Epoch int64
	// Leader is the instance id holding the lease, "" when none does.
	Leader string
}

// Prepare reads the lease, the epoch counter and (on a single node) the fence
// to decide whether writes are fenced and with which epoch. Values that are
// not Hearth's (a foreign string, another type) are logged and ignored: the
// epoch comes from the valid ones, and a fence the epoch cannot pass refuses
// the writes, never the reverse.
func (s *PrewarmStore) Prepare(ctx context.Context) (PrewarmFence, error) {
	leaseKey, epochKey := store.LeaseKey(s.ns), store.EpochKey(s.ns)
	get := func(key string) (string, bool, error) {
		v, err := s.client.Get(ctx, key).Result()
		switch {
		case errors.Is(err, redis.Nil):
			return "", false, nil
		case err != nil && redis.HasErrorPrefix(err, "WRONGTYPE"):
			s.log.Warn().Str("key", key).Msg("pre-warm: foreign value (wrong type) in hearth's own key ignored")
			return "", true, nil
		case err != nil:
			return "", false, fmt.Errorf("read %s: %w", key, err)
		}
		return v, true, nil
	}
	var pf PrewarmFence
	present := false
	lease, ok, err := get(leaseKey)
	if err != nil {
		return pf, err
	}
	present = present || ok
	if e, id, valid := store.ParseLease(lease); valid {
		pf.Epoch, pf.Leader = e, id
	} else if ok && lease != "" {
		s.log.Warn().Str("key", leaseKey).Str("found", quoteKey(lease)).Msg("pre-warm: foreign lease value ignored")
	}
	counter, ok, err := get(epochKey)
	if err != nil {
		return pf, err
	}
	present = present || ok
	if e, valid := store.ParseEpoch(counter); valid {
		if e > pf.Epoch {
			pf.Epoch = e
		}
	} else if ok && counter != "" {
		s.log.Warn().Str("key", epochKey).Str("found", quoteKey(counter)).Msg("pre-warm: foreign epoch counter ignored")
	}
	if !present {
		// A fence without lease or counter: a leader ran here and its
		// counter was lost. Write fenced with epoch 0, which that fence refuses.
		found, err := s.anyFence(ctx)
		if err != nil {
			return pf, err
		}
		present = found
	}
	pf.Fenced = present
	s.fenced, s.epoch = pf.Fenced, pf.Epoch
	return pf, nil
}

// anyFence reports whether a fence key exists: the single one, or on a
// Cluster any of the one per hash slot (all 16,384 names checked in one
// pipeline, each on its master: no SCAN of the keyspace).
func (s *PrewarmStore) anyFence(ctx context.Context) (bool, error) {
	if !s.fences.PerSlot() {
		key := s.fences.At(0)
		n, err := s.client.Exists(ctx, key).Result()
		if err != nil {
			return false, fmt.Errorf("read %s: %w", key, err)
		}
		return n > 0, nil
	}
	pipe := s.client.Pipeline()
	cmds := make([]*redis.IntCmd, s.fences.Count())
	for i := range cmds {
		cmds[i] = pipe.Exists(ctx, s.fences.At(i))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return false, fmt.Errorf("read the fence keys %s:{…}: %w", store.FenceKey(s.ns), err)
	}
	for _, c := range cmds {
		if c.Val() > 0 {
			return true, nil
		}
	}
	return false, nil
}

// fenceKey is the fence guarding key, named as for the leader's FencedStore.
func (s *PrewarmStore) fenceKey(key string) string { return s.fences.For(key) }

// Set implements Store: present keys are left alone (unless Overwrite) and
// fenced writes are an error wrapping ErrPrewarmFenced.
func (s *PrewarmStore) Set(ctx context.Context, entries []Entry) error {
	res, err := s.SetEach(ctx, entries)
	if err != nil {
		return err
	}
	for _, r := range res {
		if r == SetFenced {
			return fmt.Errorf("write %d keys with epoch %d: %w", len(entries), s.epoch, ErrPrewarmFenced)
		}
	}
	return nil
}

// SetEach implements EachStore.
func (s *PrewarmStore) SetEach(ctx context.Context, entries []Entry) ([]SetOutcome, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	out := make([]SetOutcome, len(entries))
	if !s.fenced {
		if s.versioned != nil {
			// No leader here yet (a green Redis): entries that carry an
			// origin version (copied from a serving Redis with their
			// record) still get their record, so that the leader that
			// starts here never replaces them with an older row.
			var versioned, plain []int
			for i, e := range entries {
				if e.Seq > 0 && e.Versioned {
					versioned = append(versioned, i)
				} else {
					plain = append(plain, i)
				}
			}
			if len(versioned) > 0 {
				return s.setSplit(ctx, entries, out, versioned, plain)
			}
		}
		return out, s.setPlain(ctx, entries, out)
	}
	if s.versioned != nil {
		var stamped, plain []int
		for i, e := range entries {
			if e.Seq > 0 {
				stamped = append(stamped, i)
			} else {
				plain = append(plain, i)
			}
		}
		if len(stamped) > 0 {
			return s.setSplit(ctx, entries, out, stamped, plain)
		}
	}
	return out, s.setFenced(ctx, entries, out)
}

// setSplit writes the stamped entries (indexes into entries) through the
// version check and the others through the fence script.
func (s *PrewarmStore) setSplit(ctx context.Context, entries []Entry, out []SetOutcome, stamped, plain []int) ([]SetOutcome, error) {
	pick := func(idx []int) []Entry {
		es := make([]Entry, len(idx))
		for j, i := range idx {
			es[j] = entries[i]
		}
		return es
	}
	res, err := s.versioned.SetVersioned(ctx, s.epoch, s.overwrite, s.fenceKey, pick(stamped))
	if err != nil {
		return nil, err
	}
	for j, i := range stamped {
		out[i] = res[j]
	}
	if len(plain) > 0 {
		rest := make([]SetOutcome, len(plain))
		write := s.setFenced
		if !s.fenced {
			write = s.setPlain
		}
		if err := write(ctx, pick(plain), rest); err != nil {
			return nil, err
		}
		for j, i := range plain {
			out[i] = rest[j]
		}
	}
	return out, nil
}

// setFenced writes entries through store.PrewarmSet, each refused if a newer
// epoch holds its fence.
func (s *PrewarmStore) setFenced(ctx context.Context, entries []Entry, out []SetOutcome) error {
	epoch := strconv.FormatInt(s.epoch, 10)
	overwrite := "0"
	if s.overwrite {
		overwrite = "1"
	}
	cmds, err := store.RunScript(ctx, s.client, store.PrewarmSet, len(entries), func(i int) ([]string, []any) {
		e := entries[i]
		return []string{e.Key, s.fenceKey(e.Key)}, []any{epoch, e.Value, max(1, e.TTL.Milliseconds()), overwrite}
	})
	if err != nil {
		return fmt.Errorf("write %d keys: %w", len(entries), err)
	}
	for i, c := range cmds {
		code, found, foreign, err := store.ScriptReply(c)
		if err != nil {
			return fmt.Errorf("write %d keys: %w", len(entries), err)
		}
		if foreign && s.foreign.Add(1) == 1 {
			s.log.Warn().Str("key", s.fenceKey(entries[i].Key)).Str("found", quoteKey(found)).
				Msg("pre-warm: foreign value in the fence treated as absent; the leader's next write repairs it")
		}
		switch code {
		case 1:
			out[i] = SetWritten
		case 2:
			out[i] = SetPresent
		case 0:
			out[i] = SetFenced
		default:
			return fmt.Errorf("write %s: unexpected script reply %d", quoteKey(entries[i].Key), code)
		}
	}
	return nil
}

// setPlain writes with pipelined SET … [NX] PX: no leader state to fence against.
func (s *PrewarmStore) setPlain(ctx context.Context, entries []Entry, out []SetOutcome) error {
	pipe := s.client.Pipeline()
	var cmds []*redis.BoolCmd
	if !s.overwrite {
		cmds = make([]*redis.BoolCmd, len(entries))
	}
	for i, e := range entries {
		ttl := max(time.Millisecond, e.TTL)
		if s.overwrite {
			pipe.Set(ctx, e.Key, e.Value, ttl)
		} else {
			cmds[i] = pipe.SetNX(ctx, e.Key, e.Value, ttl)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("write %d keys: %w", len(entries), err)
	}
	for i, c := range cmds {
		if !c.Val() {
			out[i] = SetPresent
		}
	}
	return nil
}

// Extend implements Store like RedisStore (PEXPIRE … GT never shortens a TTL
// and never creates a key); a pre-warm extends only keys it failed to load.
func (s *PrewarmStore) Extend(ctx context.Context, keys []string, ttls []time.Duration) ([]bool, error) {
	return (&RedisStore{Client: s.client}).Extend(ctx, keys, ttls)
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
