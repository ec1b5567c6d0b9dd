package readside_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/readside"
	"github.com/hearth-dev/hearth/readside/internal/rstest"
)

// always makes every read decide to refresh early (−ln u ≈ 690).
func always() float64 { return 1e-300 }

// secondClient is another process's connection to the test's Redis.
func secondClient(t *testing.T, env *rstest.RedisEnv) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: env.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestEarlyRefreshElsewhereStopsOurs: Caches on their own clients, as
// processes on one Redis, each deciding to refresh a key early on every
// read. While A's early refresh loads, B's decisions find it (the lock),
// load nothing, and stop trying for δ; once A's value has landed, a decision
// C made before it finds the rewritten value and loads nothing either. The
// loaders count their runs: A's two (the first load, the refresh), B's and
// C's none.
func TestEarlyRefreshElsewhereStopsOurs(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns, key := env.Prefix+"ns", env.Prefix+"k"
	regA, regB, regC := prometheus.NewRegistry(), prometheus.NewRegistry(), prometheus.NewRegistry()
	clock := newFakeClock(time.Unix(1_800_000_000, 0)) // A's loads take δ = 30 s exactly
	opts := readside.Options{Namespace: ns, TTL: 24 * time.Hour, Jitter: -1, LockTTL: time.Minute, Rand: always}
	optsA := opts
	optsA.Now = clock.Now
	a := newCache(t, env.Client, regA, optsA)
	b := newCache(t, secondClient(t, env), regB, opts)
	c := newCache(t, secondClient(t, env), regC, opts)
	var loadsA, loadsOthers atomic.Int64
	release := make(chan struct{})
	loadA := func(context.Context) ([]byte, error) {
		if loadsA.Add(1) > 1 {
			<-release // the refresh holds the lock until told
		}
		clock.Add(30 * time.Second)
		return []byte("from a"), nil
	}
	loadOther := func(context.Context) ([]byte, error) { loadsOthers.Add(1); return []byte("from b or c"), nil }
	if _, err := a.GetOrLoad(ctx, key, loadA); err != nil {
		t.Fatal(err)
	}
	// Near expiry: 10 s left of the value and its δ (30 s).
	for _, k := range []string{key, readside.DeltaKey(ns, key)} {
		if err := env.Client.PExpire(ctx, k, 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	clock.Add(24 * time.Hour) // past the expiry A wrote, so that A reads the PTTL again
	if v, err := a.GetOrLoad(ctx, key, loadA); err != nil || string(v) != "from a" {
		t.Fatalf("a: %q, %v", v, err)
	}
	rstest.Eventually(t, 10*time.Second, "a's early refresh loading", func() bool { return loadsA.Load() == 2 })

	if v, err := b.GetOrLoad(ctx, key, loadOther); err != nil || string(v) != "from a" {
		t.Fatalf("b during a's refresh: %q, %v (the current value must be served)", v, err)
	}
	readside.WaitRefresh(b, key)
	if got := rstest.Sum(t, regB, "hearth_readside_early_refreshes_total", "result", "locked"); got != 1 {
		t.Fatalf("b's early refreshes locked: %v, want 1 (a holds the lock)", got)
	}
	for range 20 {
		if v, err := b.GetOrLoad(ctx, key, loadOther); err != nil || string(v) != "from a" {
			t.Fatalf("b during a's refresh: %q, %v (the current value must be served)", v, err)
		}
	}
	// B found the lock held with δ = 30 s: its decisions since were held
	// off (LockTTL 1 min bounds the hold) and sent nothing to Redis.
	if got := rstest.Sum(t, regB, "hearth_readside_early_refreshes_total", "result", "held_off"); got != 20 {
		t.Errorf("b's early refreshes held off: %v, want 20", got)
	}
	if got := rstest.Sum(t, regB, "hearth_readside_early_refreshes_total", "result", "locked"); got != 1 {
		t.Errorf("b's early refreshes locked: %v, want still 1", got)
	}

	close(release)
	rstest.Eventually(t, 10*time.Second, "a's refresh written", func() bool {
		return env.Client.PTTL(ctx, key).Val() > time.Hour && env.Client.Exists(ctx, readside.LockKey(ns, key)).Val() == 0
	})
	readside.RefreshEarly(c, key, loadOther, 10*time.Second) // decided on what it saw before a's value landed
	if got := rstest.Sum(t, regC, "hearth_readside_early_refreshes_total", "result", "done_elsewhere"); got != 1 {
		t.Errorf("c's early refreshes done_elsewhere: %v, want 1", got)
	}
	for _, x := range []*readside.Cache{b, c} {
		for range 20 {
			if v, err := x.GetOrLoad(ctx, key, loadOther); err != nil || string(v) != "from a" {
				t.Fatalf("after a's refresh: %q, %v", v, err)
			}
		}
	}
	for _, x := range []*readside.Cache{a, b, c} {
		if err := x.Close(ctx); err != nil { // waits for background refreshes
			t.Fatal(err)
		}
	}
	if n := loadsOthers.Load(); n != 0 {
		t.Errorf("b and c loaded %d times, want 0: a's early refresh was theirs", n)
	}
	if n := loadsA.Load(); n != 2 {
		t.Errorf("a loaded %d times, want 2 (the first load and one early refresh)", n)
	}
	for name, reg := range map[string]*prometheus.Registry{"a": regA, "b": regB, "c": regC} {
		want := 0.0
		if name == "a" {
			want = 1
		}
		if got := rstest.Sum(t, reg, "hearth_readside_early_refreshes_total", "result", "started"); got != want {
			t.Errorf("%s's early refreshes started: %v, want %v", name, got, want)
		}
	}
}

// lockTries counts the SET NX of one key a client sends.
type lockTries struct {
	key string
	n   atomic.Int64
}

func (h *lockTries) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lockTries) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.see(cmd); return next(ctx, cmd) }
}
func (h *lockTries) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.see(c)
		}
		return next(ctx, cmds)
	}
}
func (h *lockTries) see(cmd redis.Cmder) {
	a := cmd.Args()
	if len(a) >= 2 && strings.EqualFold(cmd.Name(), "set") && a[1] == h.key {
		for _, x := range a[2:] {
			if s, ok := x.(string); ok && strings.EqualFold(s, "nx") {
				h.n.Add(1)
			}
		}
	}
}

// TestDeltaExcludesLockWait: δ is the loader's own run time. B misses while
// A holds the key's lock, waits (its clock moves 10 s meanwhile, A's failing
// load moves it), then takes the lock and loads in 30 ms of its clock: the δ
// written is 30 ms, not the 10 s it waited.
func TestDeltaExcludesLockWait(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns, key := env.Prefix+"ns", env.Prefix+"k"
	clock := newFakeClock(time.Unix(1_800_000_000, 0))
	rdbB := secondClient(t, env)
	tries := &lockTries{key: readside.LockKey(ns, key)}
	rdbB.AddHook(tries)
	regB := prometheus.NewRegistry()
	a := newCache(t, env.Client, nil, readside.Options{Namespace: ns})
	b := newCache(t, rdbB, regB, readside.Options{Namespace: ns, Now: clock.Now})

	holding, fail := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		_, err := a.GetOrLoad(ctx, key, func(context.Context) ([]byte, error) {
			close(holding)
			<-fail
			clock.Add(10 * time.Second) // B's wait, as B's clock sees it
			return nil, errors.New("origin down")
		})
		aDone <- err
	}()
	<-holding
	var loadsB atomic.Int64
	bDone := make(chan error, 1)
	go func() {
		v, err := b.GetOrLoad(ctx, key, func(context.Context) ([]byte, error) {
			loadsB.Add(1)
			clock.Add(30 * time.Millisecond)
			return []byte("v"), nil
		})
		if err == nil && string(v) != "v" {
			err = errors.New("b got " + string(v))
		}
		bDone <- err
	}()
	rstest.Eventually(t, 10*time.Second, "b waiting behind a's lock", func() bool { return tries.n.Load() >= 2 })
	close(fail)
	if err := <-aDone; err == nil {
		t.Fatal("a's failing load returned no error")
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	if n := loadsB.Load(); n != 1 {
		t.Fatalf("b loaded %d times, want 1", n)
	}
	if got := env.Client.Get(ctx, readside.DeltaKey(ns, key)).Val(); got != "30" {
		t.Errorf("δ written %q, want 30 (ms: the load alone, not the 10 s lock wait)", got)
	}
	if got := rstest.Sum(t, regB, "hearth_readside_lock_wait_seconds", "result", "acquired"); got != 1 {
		t.Errorf("b's lock waits ended by acquiring: %v, want 1", got)
	}
}

// xfetchKey is one key read through a cache whose clock and XFetch draw (u,
// 0.999999: no early refresh) the test moves, loaded once by load (counted
// in loads, δ = 1 s, TTL an hour, β 1, no jitter).
type xfetchKey struct {
	env   *rstest.RedisEnv
	ctx   context.Context
	key   string
	rdb   *countingClient
	reg   *prometheus.Registry
	clock *fakeClock
	u     *atomic.Value
	c     *readside.Cache
	loads *atomic.Int64
	load  readside.Loader
}

func newXFetchKey(t *testing.T) *xfetchKey {
	t.Helper()
	env := rstest.Redis(t)
	f := &xfetchKey{env: env, ctx: context.Background(), key: env.Prefix + "k", rdb: newCountingClient(t, env.Addr),
		reg: prometheus.NewRegistry(), clock: newFakeClock(time.Unix(1_800_000_000, 0)), u: &atomic.Value{}, loads: &atomic.Int64{}}
	f.u.Store(0.999999)
	f.c = newCache(t, f.rdb, f.reg, readside.Options{Namespace: env.Prefix + "ns", TTL: time.Hour, Jitter: -1, Beta: 1, Now: f.clock.Now,
		Rand: func() float64 { return f.u.Load().(float64) }})
	f.load = func(context.Context) ([]byte, error) {
		f.loads.Add(1)
		f.clock.Add(time.Second) // δ = 1 s: the full reads start 1 s before expiry
		return []byte("v"), nil
	}
	if _, err := f.c.GetOrLoad(f.ctx, f.key, f.load); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestPlainGetFarFromExpiry: a read far from the expiry this process last
// saw sends one GET, and XFetch decides on that expiry; within δ·β of it,
// the read asks for the PTTL and δ again (three commands), so the refresh
// before expiry still happens; a key another process deleted is still a miss.
func TestPlainGetFarFromExpiry(t *testing.T) {
	f := newXFetchKey(t)
	env, ctx, key, rdb, reg, clock, u, c, loads, load := f.env, f.ctx, f.key, f.rdb, f.reg, f.clock, f.u, f.c, f.loads, f.load
	for i := range 5 {
		if n := rdb.sent(func() { _, _ = c.GetOrLoad(ctx, key, load) }); n != 1 {
			t.Fatalf("read %d an hour from expiry: %d commands, want 1 (a plain GET)", i, n)
		}
	}
	// 20 s before the expiry this process saw (its write's, an hour after
	// the load ended), Redis's own PTTL set to 19 s: XFetch decides on the
	// expiry seen, over a plain GET.
	clock.Add(time.Hour - 20*time.Second)
	env.Client.PExpire(ctx, key, 19*time.Second)
	if n := rdb.sent(func() { _, _ = c.GetOrLoad(ctx, key, load) }); n != 1 {
		t.Fatalf("read 20 s before the expiry seen: %d commands, want 1 (a plain GET)", n)
	}
	// Within δ·β (1 s) of the expiry seen: read in full, which learns Redis's
	// own expiry (19 s on).
	clock.Add(19500 * time.Millisecond) // 0.5 s before it
	if n := rdb.sent(func() { _, _ = c.GetOrLoad(ctx, key, load) }); n != 3 {
		t.Fatalf("read near the expiry seen: %d commands, want 3 (value, PTTL, δ)", n)
	}
	if n := rdb.sent(func() { _, _ = c.GetOrLoad(ctx, key, load) }); n != 1 {
		t.Fatalf("read after the full read: %d commands, want 1 (the expiry it learnt is 19 s on)", n)
	}
	u.Store(1e-12) // −δ·β·ln(u) ≈ 27.6 s ≥ 19 s: refresh
	if v, err := c.GetOrLoad(ctx, key, load); err != nil || string(v) != "v" {
		t.Fatalf("read near expiry: %q, %v", v, err)
	}
	readside.WaitRefresh(c, key)
	if n := loads.Load(); n != 2 {
		t.Fatalf("loads %d, want 2: no early refresh near expiry", n)
	}
	u.Store(0.999999)
	if n := rdb.sent(func() { _, _ = c.GetOrLoad(ctx, key, load) }); n != 1 {
		t.Errorf("read after the refresh: %d commands, want 1 (its write set the expiry an hour on)", n)
	}
	env.Client.Del(ctx, key)
	if _, err := c.GetOrLoad(ctx, key, load); err != nil {
		t.Fatal(err)
	}
	if n := loads.Load(); n != 3 {
		t.Errorf("loads %d, want 3: a deleted key read by plain GET must miss and load", n)
	}
	if got := rstest.Sum(t, reg, "hearth_readside_misses_total"); got != 2 {
		t.Errorf("misses %v, want 2", got)
	}
}

// A process that decides on the expiry it remembers, after another process
// (or Hearth) rewrote the key, starts no load: its refresh re-reads the key
// in full first, finds it rewritten (done_elsewhere), and its reads are plain
// GETs again from the new expiry it learnt.
func TestStaleExpiryDecisionLoadsNothing(t *testing.T) {
	f := newXFetchKey(t)
	env, ctx, key, rdb, reg, clock, u, c, loads, load := f.env, f.ctx, f.key, f.rdb, f.reg, f.clock, f.u, f.c, f.loads, f.load
	// Another writer refreshes the key for a day (its δ key stays).
	if err := env.Client.Set(ctx, key, "elsewhere", 24*time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	// 11 s before the expiry this process saw (its write's, an hour after
	// the load ended), XFetch fires (−δ·β·ln(u) ≈ 27.6 s ≥ 11 s) on a plain
	// GET.
	clock.Add(time.Hour - 11*time.Second)
	u.Store(1e-12)
	if v, err := c.GetOrLoad(ctx, key, load); err != nil || string(v) != "elsewhere" {
		t.Fatalf("read: %q, %v (the current value must be served)", v, err)
	}
	readside.WaitRefresh(c, key)
	if got := rstest.Sum(t, reg, "hearth_readside_early_refreshes_total", "result", "done_elsewhere"); got != 1 {
		t.Fatalf("early refreshes done_elsewhere: %v, want 1", got)
	}
	if n := loads.Load(); n != 1 {
		t.Fatalf("loads %d, want 1: a key rewritten elsewhere is not loaded again", n)
	}
	if v := env.Client.Get(ctx, key).Val(); v != "elsewhere" {
		t.Fatalf("value %q, want the other writer's", v)
	}
	// The refresh's full read learnt the new expiry, a day on: plain GETs,
	// and XFetch no longer fires.
	for i := range 5 {
		if n := rdb.sent(func() { _, _ = c.GetOrLoad(ctx, key, load) }); n != 1 {
			t.Fatalf("read %d after done_elsewhere: %d commands, want 1 (a plain GET)", i, n)
		}
	}
	readside.WaitRefresh(c, key)
	if n := loads.Load(); n != 1 {
		t.Fatalf("loads %d after the new expiry was learnt, want 1", n)
	}
}
