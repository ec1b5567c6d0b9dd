package leader

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/hstate"
	"github.com/hearth-dev/hearth/internal/slot"
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
	repairs *hstate.Repairs
	ver     *versionMetrics
	// fence and slotFences are the fence key names, built once: FenceKey
	// runs for every key written.
	fence      string
	slotFences []string
	// counter is the lease's epoch counter: a fence above it is foreign.
	counter string
}

var (
	_ warmer.Store     = (*FencedStore)(nil)
	_ Fence            = (*FencedStore)(nil)
	_ warmer.TTLReader = (*FencedStore)(nil)
)

// NewFencedStore builds a FencedStore.
func NewFencedStore(opts FencedStoreOptions) *FencedStore {
	perSlot := false
	if _, ok := opts.Client.(*redis.ClusterClient); ok {
		perSlot = true
	}
	if opts.PerSlot != nil {
		perSlot = *opts.PerSlot
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	s := &FencedStore{
		client:  opts.Client,
		ns:      opts.Namespace,
		perSlot: perSlot,
		fenced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_fenced_writes_total",
			Help: "Writes Redis refused because a newer leader's epoch fences them, by operation (set, extend).",
		}, []string{"op"}),
	}
	s.fence = s.ns + ":fence"
	s.counter = epochKey(s.ns)
	if perSlot {
		s.slotFences = make([]string, slot.Count)
		for i := range s.slotFences {
			s.slotFences[i] = s.ns + ":fence:{" + warmer.SlotTag(i) + "}"
		}
	}
	s.repairs = hstate.NewRepairs(opts.Registerer, opts.Logger.With().Str("component", "fence").Logger())
	s.fenced.WithLabelValues("set")
	s.fenced.WithLabelValues("extend")
	opts.Registerer.MustRegister(s.fenced)
	s.ver = newVersionMetrics(opts.Registerer)
	return s
}

// FenceKey returns the fence key guarding key: {ns}:fence on a single node, or
// {ns}:fence:{tag} with a tag in key's hash slot when fences are per slot.
func (s *FencedStore) FenceKey(key string) string {
	if !s.perSlot {
		return s.fence
	}
	return s.slotFence(warmer.HashSlot(key))
}

func (s *FencedStore) slotFence(n int) string {
	if n >= 0 && n < len(s.slotFences) {
		return s.slotFences[n]
	}
	return s.ns + ":fence:{" + warmer.SlotTag(n) + "}"
}

// The scripts compare epochs as numbers (epochs stay below 2^53, exact in Lua)
// and store the fence as the writer's own decimal string. Each is idempotent:
// run twice (a retransmitted pipeline), it does the same thing or refuses. A
// fence that holds anything but a valid epoch (see hstate: NaN compares
// false both ways, and a far-future number would refuse every write for good)
// is treated as absent and overwritten with the writer's epoch, and a TTL on a
// valid fence is removed; the script then replies {code, found} so that the
// repair is logged and counted. Fencing holds
// after a repair: the current leader's next write raises the fence to its
// epoch, and older epochs are refused from then on.

// fenceLua is the fence check every fenced script starts with.
// hearth_fence(key, es) compares the writer's epoch es (its decimal string)
// with the fence key: false when a newer epoch holds it; otherwise it raises
// the fence to es (or overwrites a foreign value) and returns true. Its second
// result describes a foreign value it found, nil when none. hearth_reply(code,
// found) is the script's reply: code alone, or {code, found} after a repair.
const fenceLua = `
local function hearth_fence(key, es)
  local e = tonumber(es)
  local f, bad = hearth_epoch(key, e)
  if f > e then return false, bad end
  if f < e or bad then redis.call('SET', key, es) end
  return true, bad
end
local function hearth_reply(code, found)
  if found then return {code, found} end
  return code
end
`

func newFencedScript(body string) *redis.Script { return hstate.NewScript(fenceLua + body) }

// setScript: KEYS value, fence; ARGV epoch, value, ttl ms. 1 written, 0 fenced.
var setScript = newFencedScript(`
local ok, bad = hearth_fence(KEYS[2], ARGV[1])
if not ok then return hearth_reply(0, bad) end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return hearth_reply(1, bad)
`)

// setManyScript: KEYS fence, value 1 … value n; ARGV epoch, then value and
// ttl ms for each key. 1 all written, 0 all fenced: one fence guards them all,
// so one check decides for every key, and the per-key command, script run and
// reply of setScript are paid once per chunk.
var setManyScript = newFencedScript(`
local ok, bad = hearth_fence(KEYS[1], ARGV[1])
if not ok then return hearth_reply(0, bad) end
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], ARGV[2*i-2], 'PX', ARGV[2*i-1])
end
return hearth_reply(1, bad)
`)

// setManyChunk bounds the keys of one setManyScript call, so that one call
// holds Redis for well under a millisecond.
const setManyChunk = 256

// extendScript: KEYS value, fence; ARGV epoch, ttl ms. 1 extended (or already
// longer), 0 key gone, -1 fenced.
var extendScript = newFencedScript(`
local ok, bad = hearth_fence(KEYS[2], ARGV[1])
if not ok then return hearth_reply(-1, bad) end
local n = redis.call('EXISTS', KEYS[1])
if redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT') == 1 then n = 1 end
return hearth_reply(n, bad)
`)

// raiseLua raises the fence KEYS[1] to the epoch ARGV[1], like hearth_fence,
// and replies {code, found, fence}: code 1 raised or equal, 0 a newer epoch
// holds it; found describes a foreign value repaired (empty if none); fence is
// the epoch that refused the raise (empty when raised).
const raiseLua = `
local e = tonumber(ARGV[1])
local f, bad = hearth_epoch(KEYS[1], e)
if f > e then return {0, bad or '', string.format('%.0f', f)} end
if f < e or bad then redis.call('SET', KEYS[1], ARGV[1]) end
return {1, bad or '', ''}
`

// raiseScript: KEYS fence; ARGV epoch. See raiseLua.
var raiseScript = hstate.NewScript(raiseLua)

// repairRaiseScript: KEYS fence; ARGV epoch, the fence's value f as a raise
// just saw it, the epoch counter's value c read after that. A fence above
// the counter holds an epoch no Hearth instance was ever issued (the counter
// only grows, and every epoch is issued by raising it), and one also ahead of
// Redis TIME cannot be an epoch issued before the counter lost data in a
// failover (epochs are at most TIME when issued): if the fence still holds
// exactly f, f > c and f > TIME, it is set to c, then raised as raiseScript
// does. The compare-and-set keeps a leader that raised the fence meanwhile
// from being lowered. Replies like raiseScript, plus 1 when it repaired.
var repairRaiseScript = hstate.NewScript(`
local fixed = 0
local v = redis.pcall('GET', KEYS[1])
if v == ARGV[2] and tonumber(ARGV[2]) > tonumber(ARGV[3]) and tonumber(ARGV[2]) > hearth_now_ms() then
  redis.call('SET', KEYS[1], ARGV[3])
  fixed = 1
end
local r = (function()` + raiseLua + `end)()
table.insert(r, fixed)
return r
`)

// replies reads the codes of a pipeline of fence scripts, logging and counting
// each repair of a fence key.
func (s *FencedStore) replies(cmds []*redis.Cmd, fence func(i int) string) ([]int64, error) {
	codes := make([]int64, len(cmds))
	for i, c := range cmds {
		n, found, repaired, err := hstate.ScriptReply(c)
		if err != nil {
			return nil, err
		}
		if repaired {
			s.repairs.Repaired(hstate.KindFence, fence(i), found)
		}
		codes[i] = n
	}
	return codes, nil
}

// Writer is the store term t writes through: every write carries t's epoch,
// and a write Redis refuses ends t (Term.Fenced).
func (s *FencedStore) Writer(t *Term) *Writer { return &Writer{s: s, t: t} }

// Gate is the warmer's gate of a leader-elected Hearth: while lease holds a
// valid term it admits a batch and hands out that term's Writer; otherwise
// it refuses with ErrNotLeader. It reads memory only, never Redis.
func (s *FencedStore) Gate(lease *Lease) warmer.Gate { return termGate{s: s, lease: lease} }

type termGate struct {
	s     *FencedStore
	lease *Lease
}

func (g termGate) Admit(context.Context) (warmer.Store, error) {
	t, ok := g.lease.Current()
	if !ok {
		return nil, ErrNotLeader
	}
	return g.s.Writer(t), nil
}

// Writer is a FencedStore bound to one term (FencedStore.Writer).
type Writer struct {
	s *FencedStore
	t *Term
}

var (
	_ warmer.Store        = (*Writer)(nil)
	_ warmer.CheckedStore = (*Writer)(nil)
)

// Set writes each entry with SET … PX through the fence script, pipelined.
func (w *Writer) Set(ctx context.Context, entries []warmer.Entry) error {
	return w.s.set(ctx, w.t, entries)
}

// Extend pushes each existing key's expiry out (PEXPIRE … GT) through the
// fence script; kept[i] reports whether keys[i] still existed.
func (w *Writer) Extend(ctx context.Context, keys []string, ttls []time.Duration) ([]bool, error) {
	return w.s.extend(ctx, w.t, keys, ttls)
}

// SetChecked is FencedStore.SetChecked with the term's epoch.
func (w *Writer) SetChecked(ctx context.Context, entries []warmer.Entry) ([]warmer.VersionCheck, error) {
	return w.s.setChecked(ctx, w.t, entries)
}

// PTTLs implements warmer.TTLReader.
func (w *Writer) PTTLs(ctx context.Context, keys []string) ([]time.Duration, error) {
	return w.s.PTTLs(ctx, keys)
}

// Set refuses: outside a term nothing is written (write through Writer).
func (s *FencedStore) Set(_ context.Context, entries []warmer.Entry) error {
	if len(entries) == 0 {
		return nil
	}
	return fmt.Errorf("write %d keys: %w (not through a term's writer)", len(entries), ErrNotLeader)
}

// Extend refuses: outside a term nothing is written (write through Writer).
func (s *FencedStore) Extend(_ context.Context, keys []string, _ []time.Duration) ([]bool, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	return nil, fmt.Errorf("extend %d keys: %w (not through a term's writer)", len(keys), ErrNotLeader)
}

// set writes each entry with SET … PX through the fence script, pipelined, with t's epoch.
func (s *FencedStore) set(ctx context.Context, t *Term, entries []warmer.Entry) error {
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
	cmds, err := s.run(ctx, setScript, len(entries), func(i int) ([]string, []any) {
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
func (s *FencedStore) refusedSets(t *Term, n, refused int) error {
	if refused == 0 {
		return nil
	}
	s.fenced.WithLabelValues("set").Add(float64(refused))
	t.Fenced()
	return fmt.Errorf("write %d keys with epoch %d: %d refused: %w", n, t.Epoch, refused, ErrFenced)
}

// setMany writes entries under the single fence key, setManyChunk keys per
// script call, the calls pipelined.
func (s *FencedStore) setMany(ctx context.Context, t *Term, entries []warmer.Entry) error {
	epoch := strconv.FormatInt(t.Epoch, 10)
	chunks := (len(entries) + setManyChunk - 1) / setManyChunk
	// One backing array each for every call's keys and arguments.
	keys, argv := make([]string, 0, chunks+len(entries)), make([]any, 0, chunks+2*len(entries))
	cmds, err := s.run(ctx, setManyScript, chunks, func(i int) ([]string, []any) {
		part := entries[i*setManyChunk : min(len(entries), (i+1)*setManyChunk)]
		k0, a0 := len(keys), len(argv)
		keys, argv = append(keys, s.fence), append(argv, epoch)
		for _, e := range part {
			keys = append(keys, e.Key)
			argv = append(argv, e.Value, max(1, e.TTL.Milliseconds()))
		}
		return keys[k0:len(keys):len(keys)], argv[a0:len(argv):len(argv)]
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

// extend is Writer.Extend with t's epoch.
func (s *FencedStore) extend(ctx context.Context, t *Term, keys []string, ttls []time.Duration) ([]bool, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	epoch := strconv.FormatInt(t.Epoch, 10)
	cmds, err := s.run(ctx, extendScript, len(keys), func(i int) ([]string, []any) {
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
		return nil, fmt.Errorf("extend %d keys with epoch %d: %d refused: %w", len(keys), t.Epoch, refused, ErrFenced)
	}
	return kept, nil
}

// Raise implements Fence: every fence key (one, or one per slot) is raised to
// epoch before the new leader's first write, so that an older leader's write
// is refused everywhere, not only where the new leader has written already.
func (s *FencedStore) Raise(ctx context.Context, epoch int64) error {
	n := 1
	if s.perSlot {
		n = warmer.SlotCount
	}
	e := strconv.FormatInt(epoch, 10)
	key := func(i int) string {
		if s.perSlot {
			return s.slotFence(i)
		}
		return s.ns + ":fence"
	}
	cmds, err := s.run(ctx, raiseScript, n, func(i int) ([]string, []any) {
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
		if r.code != 1 {
			refused = append(refused, i)
			held[i] = r.fence
		}
	}
	if len(refused) == 0 {
		return nil
	}
	return s.repairAbove(ctx, epoch, refused, held, key)
}

type raiseResult struct {
	code  int64
	fence string
	fixed bool
}

// raiseReply reads one {code, found, fence[, fixed]} reply of raiseScript or
// repairRaiseScript, logging and counting a foreign value it repaired.
func (s *FencedStore) raiseReply(c *redis.Cmd, key string) (raiseResult, error) {
	v, err := c.Slice()
	if err != nil {
		return raiseResult{}, err
	}
	if len(v) < 3 {
		return raiseResult{}, fmt.Errorf("unexpected script reply %v", v)
	}
	code, ok1 := v[0].(int64)
	found, ok2 := v[1].(string)
	fence, ok3 := v[2].(string)
	if !ok1 || !ok2 || !ok3 {
		return raiseResult{}, fmt.Errorf("unexpected script reply %v", v)
	}
	if found != "" {
		s.repairs.Repaired(hstate.KindFence, key, found)
	}
	r := raiseResult{code: code, fence: fence}
	if len(v) > 3 {
		n, _ := v[3].(int64)
		r.fixed = n == 1
	}
	return r, nil
}

// repairAbove handles the fences that refused epoch: each one holding more
// than the epoch counter (read after the refusal, so that it counts every
// epoch issued until the fence was seen) was never raised by a Hearth
// instance, so it is set to the counter's value — compare-and-set, see
// repairRaiseScript — and raised again. A raise still refused means a newer
// epoch than this one was issued: ErrFenced, as before.
func (s *FencedStore) repairAbove(ctx context.Context, epoch int64, refused []int, held map[int]string, key func(int) string) error {
	fenced := fmt.Errorf("raise fences to epoch %d: %w", epoch, ErrFenced)
	raw, err := s.client.Get(ctx, s.counter).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("raise fences to epoch %d: read epoch counter %s: %w", epoch, s.counter, err)
	}
	counter, ok := epochValue(raw)
	if !ok {
		// A counter gone or foreign tells nothing: the next campaign's
		// acquisition repairs it.
		return fenced
	}
	var todo []int
	for _, i := range refused {
		if f, ok := epochValue(held[i]); ok && f > counter {
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
	cmds, err := s.run(ctx, repairRaiseScript, len(todo), func(j int) ([]string, []any) {
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
		if r.fixed {
			s.repairs.RepairedWhy(hstate.KindFence, k, held[todo[j]],
				"epoch above the epoch counter's "+c+" and ahead of redis time: never issued; set to "+c)
		}
		if r.code != 1 {
			refusedAgain = true
		}
	}
	if refusedAgain || newer {
		return fenced
	}
	return nil
}

// epochValue parses an epoch as the scripts store it (decimal digits, at most
// 16, no leading zero: see hstate's canonical form).
func epochValue(s string) (int64, bool) {
	if s == "" || len(s) > 16 || strings.Trim(s, "0123456789") != "" || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// PTTLs implements TTLReader.
func (s *FencedStore) PTTLs(ctx context.Context, keys []string) ([]time.Duration, error) {
	return (&warmer.RedisStore{Client: s.client}).PTTLs(ctx, keys)
}

// run sends n invocations of script in one pipeline with EVALSHA; the ones that
// fail with NOSCRIPT (Redis restarted, or a new cluster node) are sent again
// with EVAL, which also caches the script for next time. The scripts are
// idempotent, so a pipeline the client retransmits does no harm.
func (s *FencedStore) run(ctx context.Context, script *redis.Script, n int, args func(i int) ([]string, []any)) ([]*redis.Cmd, error) {
	return hstate.RunScript(ctx, s.client, script, n, args)
}
