package fence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// FencedStoreOptions configures a FencedStore.
type FencedStoreOptions struct {
	Client redis.UniversalClient
	// Namespace prefixes the fence keys.
	Namespace string
	// PerSlot keeps one fence key per hash slot, as Redis Cluster needs (a
	// script may only touch keys of one slot). The default is on for a
	// *redis.ClusterClient and off otherwise (one fence key).
	PerSlot *bool
	// Registerer receives hearth_fenced_writes_total and hearth_state_repairs_total.
	Registerer prometheus.Registerer
	// Logger receives one warning per foreign fence value repaired.
	Logger zerolog.Logger
}

// FencedStore is the Store of a leader-elected Hearth: every write is a script
// that compares the writer's epoch (the term its Writer is bound to, see
// Gate) with a fence key in the same hash slot as the value key, refuses the
// write if the fence holds a newer epoch, and otherwise raises the fence and
// writes. A refused write is counted and ends the writer's term. A write not
// made through a term's Writer is refused before it is sent.
type FencedStore struct {
	client  redis.UniversalClient
	ns      string
	perSlot bool
	fenced  *prometheus.CounterVec
	repairs *store.Repairs
	ver     *versionMetrics
	// fences names the fence keys, built once: FenceKey runs for every key
	// written.
	fences *store.Fences
	// fence is the single fence (the one setMany writes under).
	fence string
	// counter is the lease's epoch counter: a fence above it is foreign.
	counter string
}

var (
	_ warmer.Store     = (*FencedStore)(nil)
	_ leader.Fence     = (*FencedStore)(nil)
	_ warmer.TTLReader = (*FencedStore)(nil)
)

// NewFencedStore builds a FencedStore.
func NewFencedStore(opts FencedStoreOptions) *FencedStore {
	perSlot := store.PerSlot(opts.Client, opts.PerSlot)
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	s := &FencedStore{
		client:  opts.Client,
		ns:      opts.Namespace,
		perSlot: perSlot,
		fenced: promauto.With(opts.Registerer).NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_fenced_writes_total",
			Help: "Writes Redis refused because a newer leader's epoch fences them, by operation (set, extend).",
		}, []string{"op"}),
	}
	s.fences = store.NewFences(s.ns, perSlot)
	s.fence = store.FenceKey(s.ns)
	s.counter = store.EpochKey(s.ns)
	s.repairs = store.NewRepairs(opts.Registerer, opts.Logger.With().Str("component", "fence").Logger())
	s.fenced.WithLabelValues("set")
	s.fenced.WithLabelValues("extend")
	s.ver = newVersionMetrics(opts.Registerer)
	return s
}

// PerSlot reports whether the store keeps one fence per hash slot (a
// Cluster), so that a write is checked on its own slot's master: what lets
// a term write on under leader.LeaseOptions.FailoverGrace.
func (s *FencedStore) PerSlot() bool { return s.perSlot }

// FenceKey returns the fence key guarding key: {ns}:fence on a single node, or
// {ns}:fence:{tag} with a tag in key's hash slot when fences are per slot.
func (s *FencedStore) FenceKey(key string) string { return s.fences.For(key) }

// The fenced scripts (store.Set, SetMany, Extend, VersionedSet,
// VersionedSetMany, Raise, RepairRaise) treat a fence that holds anything but
// a valid epoch as absent, overwrite it with the writer's epoch, and reply
// {code, found} so that the repair is logged and counted. Fencing holds after
// a repair: the current leader's next write raises the fence to its epoch,
// and older epochs are refused from then on.

// setManyChunk bounds the keys of one store.SetMany call, so that one call
// holds Redis for well under a millisecond.
const setManyChunk = 256

// replies reads the codes of a pipeline of fence scripts, logging and counting
// each repair of a fence key.
func (s *FencedStore) replies(cmds []*redis.Cmd, fence func(i int) string) ([]int64, error) {
	codes := make([]int64, len(cmds))
	for i, c := range cmds {
		n, found, repaired, err := store.ScriptReply(c)
		if err != nil {
			return nil, err
		}
		if repaired {
			s.repairs.Repaired(store.KindFence, fence(i), found)
		}
		codes[i] = n
	}
	return codes, nil
}

// Writer is the store term t writes through: every write carries t's epoch,
// and a write Redis refuses ends t (Term.Fenced).
func (s *FencedStore) Writer(t *leader.Term) *Writer { return &Writer{s: s, t: t} }

// Gate is the warmer's gate of a leader-elected Hearth: while lease holds a
// valid term it admits a batch and hands out that term's Writer; otherwise
// it refuses with leader.ErrNotLeader. It reads memory only, never Redis.
func (s *FencedStore) Gate(lease *leader.Lease) warmer.Gate { return termGate{s: s, lease: lease} }

type termGate struct {
	s     *FencedStore
	lease *leader.Lease
}

func (g termGate) Admit(context.Context) (warmer.Store, error) {
	t, ok := g.lease.Current()
	if !ok {
		return nil, leader.ErrNotLeader
	}
	return g.s.Writer(t), nil
}

// Writer is a FencedStore bound to one term (FencedStore.Writer).
type Writer struct {
	s *FencedStore
	t *leader.Term
}

var (
	_ warmer.Store        = (*Writer)(nil)
	_ warmer.CheckedStore = (*Writer)(nil)
)

// Set writes each entry with SET … PX through the fence script, pipelined.
func (w *Writer) Set(ctx context.Context, entries []store.Entry) error {
	return w.s.set(ctx, w.t, entries)
}

// Extend pushes each existing key's expiry out (PEXPIRE … GT) through the
// fence script; kept[i] reports whether keys[i] still existed.
func (w *Writer) Extend(ctx context.Context, keys []string, ttls []time.Duration) ([]bool, error) {
	return w.s.extend(ctx, w.t, keys, ttls)
}

// SetChecked is FencedStore.SetChecked with the term's epoch.
func (w *Writer) SetChecked(ctx context.Context, entries []store.Entry) ([]store.VersionCheck, error) {
	return w.s.setChecked(ctx, w.t, entries)
}

// PTTLs implements warmer.TTLReader.
func (w *Writer) PTTLs(ctx context.Context, keys []string) ([]time.Duration, error) {
	return w.s.PTTLs(ctx, keys)
}

// Set refuses: outside a term nothing is written (write through Writer).
func (s *FencedStore) Set(_ context.Context, entries []store.Entry) error {
	if len(entries) == 0 {
		return nil
	}
	return fmt.Errorf("write %d keys: %w (not through a term's writer)", len(entries), leader.ErrNotLeader)
}

// Extend refuses: outside a term nothing is written (write through Writer).
func (s *FencedStore) Extend(_ context.Context, keys []string, _ []time.Duration) ([]bool, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	return nil, fmt.Errorf("extend %d keys: %w (not through a term's writer)", len(keys), leader.ErrNotLeader)
}

// set writes each entry with SET … PX through the fence script, pipelined, with t's epoch.
func (s *FencedStore) set(ctx context.Context, t *leader.Term, entries []store.Entry) error {
	if len(entries) == 0 {
		return nil
	}
	if _, some := stamped(entries); some {
		return s.setStamped(ctx, t, entries)
	}
	if !s.perSlot {
		return s.setMany(ctx, t, entries)
	}
	epoch := any(strconv.FormatInt(t.Epoch, 10))
	// One backing array each for every entry's keys and arguments, not two
	// slices per key.
	keys, argv := make([]string, 2*len(entries)), make([]any, 3*len(entries))
	cmds, err := s.run(ctx, store.Set, len(entries), func(i int) ([]string, []any) {
		e := entries[i]
		k, a := keys[2*i:2*i+2:2*i+2], argv[3*i:3*i+3:3*i+3]
		k[0], k[1] = e.Key, s.FenceKey(e.Key)
		a[0], a[1], a[2] = epoch, e.Value, max(1, e.TTL.Milliseconds())
		return k, a
	})
	if err != nil {
		return fmt.Errorf("write %d keys: %w", len(entries), err)
	}
	codes, err := s.replies(cmds, func(i int) string { return s.FenceKey(entries[i].Key) })
	if err != nil {
		return fmt.Errorf("write %d keys: %w", len(entries), err)
	}
	refused := 0
	for _, n := range codes {
		if n == 0 {
			refused++
		}
	}
	return s.refusedSets(t, len(entries), refused)
}

// refusedSets counts and reports the keys of a write the fence refused.
func (s *FencedStore) refusedSets(t *leader.Term, n, refused int) error {
	if refused == 0 {
		return nil
	}
	s.fenced.WithLabelValues("set").Add(float64(refused))
	t.Fenced()
	return fmt.Errorf("write %d keys with epoch %d: %d refused: %w", n, t.Epoch, refused, leader.ErrFenced)
}

// setMany writes entries under the single fence key, setManyChunk keys per
// script call, the calls pipelined.
func (s *FencedStore) setMany(ctx context.Context, t *leader.Term, entries []store.Entry) error {
	epoch := strconv.FormatInt(t.Epoch, 10)
	chunks := (len(entries) + setManyChunk - 1) / setManyChunk
	// Every call's command in one backing array, its arguments pointers
	// into entries and ttls: no allocation per key.
	cmd := getArgs(chunks*(store.ScriptHead+2) + 3*len(entries))
	defer func() { putArgs(cmd) }()
	ttls := make([]int64, len(entries))
	for i, e := range entries {
		ttls[i] = max(1, e.TTL.Milliseconds())
	}
	cmds, err := store.RunPacked(ctx, s.client, store.SetMany, chunks, func(i int) ([]any, int) {
		lo, hi := i*setManyChunk, min(len(entries), (i+1)*setManyChunk)
		c0 := len(cmd)
		cmd = append(cmd, nil, nil, nil, &s.fence)
		for j := lo; j < hi; j++ {
			cmd = append(cmd, &entries[j].Key)
		}
		cmd = append(cmd, epoch)
		for j := lo; j < hi; j++ {
			cmd = append(cmd, (*store.Bytes)(&entries[j].Value), &ttls[j])
		}
		return cmd[c0:len(cmd):len(cmd)], 1 + hi - lo
	})
	if err != nil {
		return fmt.Errorf("write %d keys: %w", len(entries), err)
	}
	codes, err := s.replies(cmds, func(int) string { return s.fence })
	if err != nil {
		return fmt.Errorf("write %d keys: %w", len(entries), err)
	}
	refused := 0
	for i, n := range codes {
		if n == 0 {
			refused += min(len(entries), (i+1)*setManyChunk) - i*setManyChunk
		}
	}
	return s.refusedSets(t, len(entries), refused)
}

// argsPool holds the backing arrays of batched writes' script arguments
// (tens of kilobytes a batch, every batch): reused, not collected.
var argsPool sync.Pool

// getArgs returns an empty slice of at least capacity n from argsPool.
func getArgs(n int) []any {
	if p, ok := argsPool.Get().(*[]any); ok && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]any, 0, n)
}

// putArgs clears a (it points into the batch's entries) and returns it to
// argsPool. Call once the commands that used it are read.
func putArgs(a []any) {
	a = a[:cap(a)]
	clear(a)
	a = a[:0]
	argsPool.Put(&a)
}

// extend is Writer.Extend with t's epoch.
func (s *FencedStore) extend(ctx context.Context, t *leader.Term, keys []string, ttls []time.Duration) ([]bool, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	epoch := strconv.FormatInt(t.Epoch, 10)
	cmds, err := s.run(ctx, store.Extend, len(keys), func(i int) ([]string, []any) {
		return []string{keys[i], s.FenceKey(keys[i])}, []any{epoch, max(1, ttls[i].Milliseconds())}
	})
	if err != nil {
		return nil, fmt.Errorf("extend %d keys: %w", len(keys), err)
	}
	codes, err := s.replies(cmds, func(i int) string { return s.FenceKey(keys[i]) })
	if err != nil {
		return nil, fmt.Errorf("extend %d keys: %w", len(keys), err)
	}
	kept := make([]bool, len(keys))
	refused := 0
	for i, n := range codes {
		kept[i] = n == 1
		if n < 0 {
			refused++
		}
	}
	if refused > 0 {
		s.fenced.WithLabelValues("extend").Add(float64(refused))
		t.Fenced()
		return nil, fmt.Errorf("extend %d keys with epoch %d: %d refused: %w", len(keys), t.Epoch, refused, leader.ErrFenced)
	}
	return kept, nil
}

// Raise implements Fence: every fence key (one, or one per slot) is raised to
// epoch before the new leader's first write, so that an older leader's write
// is refused everywhere, not only where the new leader has written already.
func (s *FencedStore) Raise(ctx context.Context, epoch int64) error {
	n := s.fences.Count()
	e := strconv.FormatInt(epoch, 10)
	key := s.fences.At
	cmds, err := s.run(ctx, store.Raise, n, func(i int) ([]string, []any) {
		return []string{key(i)}, []any{e}
	})
	if err != nil {
		return fmt.Errorf("raise %d fences: %w", n, err)
	}
	var refused []int
	held := make(map[int]string)
	for i, c := range cmds {
		r, err := s.raiseReply(c, key(i))
		if err != nil {
			return fmt.Errorf("raise %d fences: %w", n, err)
		}
		if r.Code != 1 {
			refused = append(refused, i)
			held[i] = r.Fence
		}
	}
	if len(refused) == 0 {
		return nil
	}
	return s.repairAbove(ctx, epoch, refused, held, key)
}

// raiseReply reads one reply of store.Raise or store.RepairRaise, logging and
// counting a foreign value it repaired.
func (s *FencedStore) raiseReply(c *redis.Cmd, key string) (store.RaiseReply, error) {
	r, err := store.ParseRaiseReply(c)
	if err != nil {
		return r, err
	}
	if r.Found != "" {
		s.repairs.Repaired(store.KindFence, key, r.Found)
	}
	return r, nil
}

// repairAbove handles the fences that refused epoch: each one holding more
// than the epoch counter (read after the refusal, so that it counts every
// epoch issued until the fence was seen) was never raised by a Hearth
// instance, so it is set to the counter's value — compare-and-set, see
// store.RepairRaise — and raised again. A raise still refused means a newer
// epoch than this one was issued: leader.ErrFenced, as before.
func (s *FencedStore) repairAbove(ctx context.Context, epoch int64, refused []int, held map[int]string, key func(int) string) error {
	fenced := fmt.Errorf("raise fences to epoch %d: %w", epoch, leader.ErrFenced)
	raw, err := s.client.Get(ctx, s.counter).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("raise fences to epoch %d: read epoch counter %s: %w", epoch, s.counter, err)
	}
	counter, ok := store.ParseEpoch(raw)
	if !ok {
		// A counter gone or foreign tells nothing: the next campaign's
		// acquisition repairs it.
		return fenced
	}
	var todo []int
	for _, i := range refused {
		if f, ok := store.ParseEpoch(held[i]); ok && f > counter {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return fenced
	}
	// A fence that refused with at most the counter's epoch is a newer
	// leader's: this raise fails, but the foreign ones are repaired anyway.
	newer := len(todo) < len(refused)
	e, c := strconv.FormatInt(epoch, 10), strconv.FormatInt(counter, 10)
	cmds, err := s.run(ctx, store.RepairRaise, len(todo), func(j int) ([]string, []any) {
		i := todo[j]
		return []string{key(i)}, []any{e, held[i], c}
	})
	if err != nil {
		return fmt.Errorf("raise %d fences: %w", len(todo), err)
	}
	refusedAgain := false
	for j, cmd := range cmds {
		k := key(todo[j])
		r, err := s.raiseReply(cmd, k)
		if err != nil {
			return fmt.Errorf("raise %d fences: %w", len(todo), err)
		}
		if r.Fixed {
			s.repairs.RepairedWhy(store.KindFence, k, held[todo[j]],
				"epoch above the epoch counter's "+c+" and ahead of redis time: never issued; set to "+c)
		}
		if r.Code != 1 {
			refusedAgain = true
		}
	}
	if refusedAgain || newer {
		return fenced
	}
	return nil
}

// PTTLs implements TTLReader.
func (s *FencedStore) PTTLs(ctx context.Context, keys []string) ([]time.Duration, error) {
	return (&store.RedisStore{Client: s.client}).PTTLs(ctx, keys)
}

// run sends n invocations of script in one pipeline with EVALSHA; the ones that
// fail with NOSCRIPT (Redis restarted, or a new cluster node) are sent again
// with EVAL, which also caches the script for next time. The scripts are
// idempotent, so a pipeline the client retransmits does no harm.
func (s *FencedStore) run(ctx context.Context, script *redis.Script, n int, args func(i int) ([]string, []any)) ([]*redis.Cmd, error) {
	return store.RunScript(ctx, s.client, script, n, args)
}
