package prewarm

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
	"github.com/hearth-dev/hearth/warmer"
)

// StoreOptions configures a Store.
type StoreOptions struct {
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
	// (stamped: store.Entry.Seq > 0) whenever the writes are fenced, so that the
	// pre-warm never replaces a newer version the leader wrote and leaves a
	// version record its next write compares with (fence.PrewarmVersioned).
	// Without it they are written as the others are.
	Versioned VersionedWriter
	Logger    zerolog.Logger
}

// VersionedWriter writes stamped entries for a fenced pre-warm with
// the writer's epoch, through the version check: the key's version record
// decides whether the entry is older than what Redis holds. fenceKey names the
// fence guarding a key. Outcomes as for warmer.EachStore.
type VersionedWriter interface {
	SetVersioned(ctx context.Context, epoch int64, overwrite bool, fenceKey func(string) string, entries []store.Entry) ([]store.SetOutcome, error)
}

// Store is the warmer.Store of `hearth prewarm`, a one-shot writer into a
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
type Store struct {
	client    redis.UniversalClient
	ns        string
	fences    *store.Fences
	overwrite bool
	log       zerolog.Logger

	fenced    bool  // leader state found: writes go through the script
	epoch     int64 // the writer's epoch when fenced
	foreign   atomic.Int64
	versioned VersionedWriter
}

var _ CopyTarget = (*Store)(nil)

// NewStore builds a Store; call Prepare before writing.
func NewStore(opts StoreOptions) *Store {
	perSlot := store.PerSlot(opts.Client, opts.PerSlot)
	return &Store{client: opts.Client, ns: opts.Namespace, fences: store.NewFences(opts.Namespace, perSlot), overwrite: opts.Overwrite,
		versioned: opts.Versioned, log: opts.Logger.With().Str("component", "prewarm-store").Logger()}
}

// Fence is what Prepare found of Hearth's leader state.
type Fence struct {
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
func (s *Store) Prepare(ctx context.Context) (Fence, error) {
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
	var pf Fence
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

// Bind fences every write with epoch instead of the epoch Prepare reads: the
// running leader's own fill-absent copy from another Redis (the admin API's
// pre-warm with a source), bound to its term. A leader that takes over raises
// the fence past epoch, and the copy's later writes are refused.
func (s *Store) Bind(epoch int64) { s.fenced, s.epoch = true, epoch }

// anyFence reports whether a fence key exists: the single one, or on a
// Cluster any of the one per hash slot (all 16,384 names checked in one
// pipeline, each on its master: no SCAN of the keyspace).
func (s *Store) anyFence(ctx context.Context) (bool, error) {
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
func (s *Store) fenceKey(key string) string { return s.fences.For(key) }

// Set implements warmer.Store: present keys are left alone (unless Overwrite) and
// fenced writes are an error wrapping warmer.ErrPrewarmFenced.
func (s *Store) Set(ctx context.Context, entries []store.Entry) error {
	res, err := s.SetEach(ctx, entries)
	if err != nil {
		return err
	}
	for _, r := range res {
		if r == store.SetFenced {
			return fmt.Errorf("write %d keys with epoch %d: %w", len(entries), s.epoch, warmer.ErrPrewarmFenced)
		}
	}
	return nil
}

// SetEach implements warmer.EachStore.
func (s *Store) SetEach(ctx context.Context, entries []store.Entry) ([]store.SetOutcome, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	out := make([]store.SetOutcome, len(entries))
	if !s.fenced {
		// No leader here yet (a green Redis): entries that carry an origin
		// version (copied from a serving Redis with their record) still get
		// their record, so that the leader that starts here never replaces
		// them with an older row.
		if s.versioned != nil && anyEntry(entries, hasOriginVersion) {
			versioned, plain := split(entries, hasOriginVersion)
			return s.setSplit(ctx, entries, out, versioned, plain)
		}
		return out, s.setPlain(ctx, entries, out)
	}
	if s.versioned != nil && anyEntry(entries, isStamped) {
		stamped, plain := split(entries, isStamped)
		return s.setSplit(ctx, entries, out, stamped, plain)
	}
	return out, s.setFenced(ctx, entries, out)
}

// isStamped: an entry the leader version-checks; hasOriginVersion: one that
// also carries an origin version.
func isStamped(e *store.Entry) bool        { return e.Seq > 0 }
func hasOriginVersion(e *store.Entry) bool { return e.Seq > 0 && e.Versioned }

// anyEntry reports whether some entry is in. The entries are looked at in
// place: a batch's thousand entries are not copied one by one to be asked.
func anyEntry(entries []store.Entry, in func(*store.Entry) bool) bool {
	for i := range entries {
		if in(&entries[i]) {
			return true
		}
	}
	return false
}

// split returns the indexes of the entries in and not in, in order.
func split(entries []store.Entry, in func(*store.Entry) bool) (yes, no []int) {
	for i := range entries {
		if in(&entries[i]) {
			yes = append(yes, i)
		} else {
			no = append(no, i)
		}
	}
	return yes, no
}

// setSplit writes the stamped entries (indexes into entries) through the
// version check and the others through the fence script.
func (s *Store) setSplit(ctx context.Context, entries []store.Entry, out []store.SetOutcome, stamped, plain []int) ([]store.SetOutcome, error) {
	pick := func(idx []int) []store.Entry {
		es := make([]store.Entry, len(idx))
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
		rest := make([]store.SetOutcome, len(plain))
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
func (s *Store) setFenced(ctx context.Context, entries []store.Entry, out []store.SetOutcome) error {
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
			out[i] = store.SetWritten
		case 2:
			out[i] = store.SetPresent
		case 0:
			out[i] = store.SetFenced
		default:
			return fmt.Errorf("write %s: unexpected script reply %d", quoteKey(entries[i].Key), code)
		}
	}
	return nil
}

// setPlain writes with pipelined SET … [NX] PX: no leader state to fence against.
func (s *Store) setPlain(ctx context.Context, entries []store.Entry, out []store.SetOutcome) error {
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
			out[i] = store.SetPresent
		}
	}
	return nil
}

// Shorten takes by off the TTL of each key, counted from the key's own expiry
// (store.Shorten), so that how long the call takes does not matter: a copy
// from another Redis whose write took longer than its TTL allowed for ends no
// later than its source. A key left with no TTL is deleted; a key that is
// absent, or has no TTL, is left alone.
func (s *Store) Shorten(ctx context.Context, keys []string, by time.Duration) error {
	if len(keys) == 0 || by <= 0 {
		return nil
	}
	ms := strconv.FormatInt(max(1, (by+time.Millisecond-1).Milliseconds()), 10)
	cmds, err := store.RunScript(ctx, s.client, store.Shorten, len(keys), func(i int) ([]string, []any) {
		return []string{keys[i]}, []any{ms}
	})
	if err != nil {
		return fmt.Errorf("shorten %d keys: %w", len(keys), err)
	}
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			return fmt.Errorf("shorten %s: %w", quoteKey(keys[i]), err)
		}
	}
	return nil
}

// Extend implements warmer.Store like store.RedisStore (PEXPIRE … GT never shortens a TTL
// and never creates a key); a pre-warm extends only keys it failed to load.
func (s *Store) Extend(ctx context.Context, keys []string, ttls []time.Duration) ([]bool, error) {
	return (&store.RedisStore{Client: s.client}).Extend(ctx, keys, ttls)
}
