package readside_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/readside"
	"github.com/hearth-dev/hearth/readside/internal/rstest"
)

func TestMissThenHitAndNegative(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	ns := env.Prefix + "ns"
	c := newCache(t, env.Client, reg, readside.Options{Namespace: ns, TTL: time.Minute, Jitter: 0.2})
	o := origin{rdb: env.Client, hash: env.Prefix + "origin"}

	t.Run("miss loads, writes the value's bytes untouched with a jittered TTL and δ beside it", func(t *testing.T) {
		key := env.Prefix + "a"
		for range 3 {
			v, err := c.GetOrLoad(ctx, key, o.loader(key))
			if err != nil || string(v) != "value of "+key {
				t.Fatalf("got %q, %v", v, err)
			}
		}
		if got := o.loads(t, key); got != 1 {
			t.Errorf("loads: %d, want 1", got)
		}
		if got, _ := env.Client.Get(ctx, key).Result(); got != "value of "+key {
			t.Errorf("stored %q", got)
		}
		ttl := env.Client.PTTL(ctx, key).Val()
		if ttl < 53*time.Second || ttl > 66*time.Second {
			t.Errorf("TTL %s, want 1m ± 10%%", ttl)
		}
		if d, err := env.Client.Get(ctx, readside.DeltaKey(ns, key)).Int(); err != nil || d < 1 {
			t.Errorf("δ key: %d, %v", d, err)
		}
		if n := env.Client.Exists(ctx, readside.LockKey(ns, key)).Val(); n != 0 {
			t.Error("lock left behind")
		}
		if got := rstest.Sum(t, reg, "hearth_readside_hits_total", "kind", "value"); got != 2 {
			t.Errorf("hits: %v, want 2", got)
		}
	})
	t.Run("Hearth's sentinel is not found, without a load", func(t *testing.T) {
		key := env.Prefix + "gone"
		env.Client.Set(ctx, key, "", time.Minute)
		_, err := c.GetOrLoad(ctx, key, o.loader(key))
		if !errors.Is(err, readside.ErrNotFound) {
			t.Fatalf("err %v, want ErrNotFound", err)
		}
		if got := o.loads(t, key); got != 0 {
			t.Errorf("loads: %d, want 0", got)
		}
	})
	t.Run("a loader's ErrNotFound writes the sentinel", func(t *testing.T) {
		key := env.Prefix + "none"
		runs := 0
		load := func(context.Context) ([]byte, error) { runs++; return nil, readside.ErrNotFound }
		for range 2 {
			if _, err := c.GetOrLoad(ctx, key, load); !errors.Is(err, readside.ErrNotFound) {
				t.Fatalf("err %v", err)
			}
		}
		if runs != 1 {
			t.Errorf("runs %d, want 1", runs)
		}
		if v, err := env.Client.Get(ctx, key).Result(); err != nil || v != "" {
			t.Errorf("sentinel %q, %v", v, err)
		}
	})
}

// TestPanickingLoader: every waiting caller gets ErrPanic, the process lives,
// the lock is released and the next call loads.
func TestPanickingLoader(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	ns, key := env.Prefix+"ns", env.Prefix+"p"
	c := newCache(t, env.Client, reg, readside.Options{Namespace: ns})
	start := make(chan struct{})
	panicky := func(context.Context) ([]byte, error) { <-start; panic("boom") }
	var wg sync.WaitGroup
	errs := make([]error, 10)
	for i := range errs {
		wg.Add(1) // not wg.Go: this module builds with Go 1.24
		go func() { defer wg.Done(); _, errs[i] = c.GetOrLoad(ctx, key, panicky) }()
	}
	rstest.Eventually(t, 10*time.Second, "callers waiting", func() bool {
		return rstest.Sum(t, reg, "hearth_readside_misses_total") == 10
	})
	close(start)
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, readside.ErrPanic) {
			t.Errorf("caller %d: %v, want ErrPanic", i, err)
		}
	}
	if got := rstest.Sum(t, reg, "hearth_readside_loads_total", "result", "panic"); got != 1 {
		t.Errorf("panicked loads: %v, want 1", got)
	}
	if n := env.Client.Exists(ctx, readside.LockKey(ns, key)).Val(); n != 0 {
		t.Error("lock left behind after a panic")
	}
	v, err := c.GetOrLoad(ctx, key, func(context.Context) ([]byte, error) { return []byte("ok"), nil })
	if err != nil || string(v) != "ok" {
		t.Errorf("next call: %q, %v", v, err)
	}
}

// TestCancelledCaller: a caller that gives up returns at once; the load it
// started goes on for the other caller, and runs once.
func TestCancelledCaller(t *testing.T) {
	env := rstest.Redis(t)
	reg := prometheus.NewRegistry()
	key := env.Prefix + "c"
	c := newCache(t, env.Client, reg, readside.Options{Namespace: env.Prefix + "ns"})
	release := make(chan struct{})
	runs := 0
	load := func(ctx context.Context) ([]byte, error) {
		runs++
		select {
		case <-release:
			return []byte("v"), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	ctx1, cancel := context.WithCancel(context.Background())
	err1 := make(chan error, 1)
	go func() { _, err := c.GetOrLoad(ctx1, key, load); err1 <- err }()
	rstest.Eventually(t, 10*time.Second, "first caller loading", func() bool {
		return rstest.Sum(t, reg, "hearth_readside_misses_total") == 1
	})
	res2 := make(chan []byte, 1)
	go func() { v, _ := c.GetOrLoad(context.Background(), key, load); res2 <- v }()
	rstest.Eventually(t, 10*time.Second, "second caller waiting", func() bool {
		return rstest.Sum(t, reg, "hearth_readside_misses_total") == 2
	})
	cancel()
	if err := <-err1; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v, want context.Canceled", err)
	}
	close(release)
	if v := <-res2; string(v) != "v" {
		t.Errorf("other caller got %q, want v", v)
	}
	if runs != 1 {
		t.Errorf("loader runs %d, want 1", runs)
	}
}

// TestSlowLoaderKeepsOthersLock: a loader slower than LockTTL loses its lock
// to another process; when it finishes, its release leaves the new holder's
// lock (another token) in place.
func TestSlowLoaderKeepsOthersLock(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns, key := env.Prefix+"ns", env.Prefix+"slow"
	opts := readside.Options{Namespace: ns, LockTTL: 300 * time.Millisecond, LockWait: 10 * time.Second}
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	a := newCache(t, env.Client, regA, opts)
	b := newCache(t, redis.NewClient(&redis.Options{Addr: env.Addr}), regB, opts)
	releaseA, releaseB := make(chan struct{}), make(chan struct{})
	startedB := make(chan struct{})
	doneA := make(chan error, 1)
	go func() {
		_, err := a.GetOrLoad(ctx, key, func(context.Context) ([]byte, error) { <-releaseA; return []byte("a"), nil })
		doneA <- err
	}()
	var tokenA string
	rstest.Eventually(t, 10*time.Second, "A holds the lock", func() bool {
		tokenA = env.Client.Get(ctx, readside.LockKey(ns, key)).Val()
		return tokenA != ""
	})
	doneB := make(chan error, 1)
	go func() {
		_, err := b.GetOrLoad(ctx, key, func(context.Context) ([]byte, error) {
			close(startedB)
			<-releaseB
			return []byte("b"), nil
		})
		doneB <- err
	}()
	<-startedB // B took the lock after A's lapsed
	tokenB := env.Client.Get(ctx, readside.LockKey(ns, key)).Val()
	if tokenB == "" || tokenB == tokenA {
		t.Fatalf("B's token %q, A's %q", tokenB, tokenA)
	}
	close(releaseA)
	if err := <-doneA; err != nil {
		t.Fatal(err)
	}
	if got := env.Client.Get(ctx, readside.LockKey(ns, key)).Val(); got != tokenB {
		t.Errorf("after A finished the lock holds %q, want B's %q", got, tokenB)
	}
	close(releaseB)
	if err := <-doneB; err != nil {
		t.Fatal(err)
	}
	if n := env.Client.Exists(ctx, readside.LockKey(ns, key)).Val(); n != 0 {
		t.Error("B did not release its own lock")
	}
}

// TestFallbacks: a lock held by someone else for longer than LockWait.
func TestFallbacks(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns := env.Prefix + "ns"
	reg := prometheus.NewRegistry()
	c := newCache(t, env.Client, reg, readside.Options{Namespace: ns, LockWait: 100 * time.Millisecond, StaleFor: time.Hour})
	ok := func(context.Context) ([]byte, error) { return []byte("loaded"), nil }
	for _, tc := range []struct {
		fallback readside.Fallback
		stale    bool
		want     string
		wantErr  error
	}{
		{readside.FallbackLoad, false, "loaded", nil},
		{readside.FallbackStale, true, "old", nil},
		{readside.FallbackStale, false, "", readside.ErrLockWait},
		{readside.FallbackFail, true, "", readside.ErrLockWait},
	} {
		t.Run(tc.fallback.String(), func(t *testing.T) {
			key := env.Prefix + "fb:" + tc.fallback.String() + ":" + itoa(len(t.Name()))
			// A holder's lock as another reader takes it: an owner token, LockTTL.
			env.Client.Set(ctx, readside.LockKey(ns, key), holderToken, 5*time.Second)
			if tc.stale {
				env.Client.Set(ctx, readside.StaleKey(ns, key), frame("old", time.Now(), 1), time.Minute)
			}
			v, err := c.GetOrLoad(ctx, key, ok, readside.WithFallback(tc.fallback))
			if !errors.Is(err, tc.wantErr) || string(v) != tc.want {
				t.Errorf("got %q, %v; want %q, %v", v, err, tc.want, tc.wantErr)
			}
			if got := env.Client.Get(ctx, readside.LockKey(ns, key)).Val(); got != holderToken {
				t.Errorf("the holder's lock became %q", got)
			}
		})
	}
	if got := rstest.Sum(t, reg, "hearth_readside_fallbacks_total", "reason", "lock_timeout"); got != 4 {
		t.Errorf("fallbacks: %v, want 4", got)
	}
	if got := rstest.Sum(t, reg, "hearth_readside_stale_served_total", "reason", "fallback"); got != 1 {
		t.Errorf("stale served: %v, want 1", got)
	}
}

// TestStaleOnLoaderError: the stale copy outlives the value by StaleFor and is
// served when the loader fails; without it the error is returned.
func TestStaleOnLoaderError(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns, key := env.Prefix+"ns", env.Prefix+"s"
	reg := prometheus.NewRegistry()
	c := newCache(t, env.Client, reg, readside.Options{Namespace: ns, TTL: time.Minute, StaleFor: time.Hour, Jitter: -1})
	if _, err := c.GetOrLoad(ctx, key, func(context.Context) ([]byte, error) { return []byte("good"), nil }); err != nil {
		t.Fatal(err)
	}
	if ttl := env.Client.PTTL(ctx, readside.StaleKey(ns, key)).Val(); ttl < 60*time.Minute {
		t.Errorf("stale copy TTL %s, want TTL + StaleFor", ttl)
	}
	env.Client.Del(ctx, key) // expired
	failing := func(context.Context) ([]byte, error) { return nil, errors.New("origin down") }
	v, err := c.GetOrLoad(ctx, key, failing)
	if err != nil || string(v) != "good" {
		t.Fatalf("got %q, %v; want the stale copy", v, err)
	}
	if got := rstest.Sum(t, reg, "hearth_readside_stale_served_total", "reason", "loader_error"); got != 1 {
		t.Errorf("stale served: %v, want 1", got)
	}
	env.Client.Del(ctx, readside.StaleKey(ns, key)) // past the bound
	if _, err := c.GetOrLoad(ctx, key, failing); err == nil {
		t.Error("no error past the stale bound")
	}
}

// TestXFetchDistribution: with δ = 10 s (the loader advances the injected
// clock by exactly that) and β = 1, a read with r left refreshes early with
// probability exp(−r/δβ), drawn from a seeded RNG.
func TestXFetchDistribution(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns, key := env.Prefix+"ns", env.Prefix+"x"
	reg := prometheus.NewRegistry()
	clock := newFakeClock(time.Unix(1_800_000_000, 0))
	const delta = 10 * time.Second
	c := newCache(t, env.Client, reg, readside.Options{Namespace: ns, TTL: time.Hour, Jitter: -1, Beta: 1,
		Now: clock.Now, Rand: lockedRand(42)})
	if _, err := c.GetOrLoad(ctx, key, func(context.Context) ([]byte, error) {
		clock.Add(delta)
		return []byte("v"), nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := env.Client.Get(ctx, readside.DeltaKey(ns, key)).Val(); got != "10000" {
		t.Fatalf("δ stored %q, want 10000", got)
	}
	// Past the expiry this process wrote (an hour on): each phase below
	// moves past the expiry last seen, so that its first read is a full one
	// and learns the PTTL the test sets.
	clock.Add(time.Hour)
	block := make(chan struct{})
	blocked := func(context.Context) ([]byte, error) { <-block; return []byte("refreshed"), nil }
	decided := func() float64 {
		return rstest.Sum(t, reg, "hearth_readside_early_refreshes_total")
	}
	const n = 3000
	for _, r := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second} {
		// The reader decides on the expiry it last read in full: move past
		// it, so that this phase's first read learns r.
		clock.Add(time.Minute)
		env.Client.PExpire(ctx, key, r)
		before := decided()
		for i := range n {
			if i%20 == 0 {
				// Reset r often: reads take real time, and on a loaded
				// machine r would shrink through the run.
				env.Client.PExpire(ctx, key, r)
			}
			v, err := c.GetOrLoad(ctx, key, blocked)
			if err != nil || string(v) != "v" {
				t.Fatalf("read: %q, %v (the current value must be served)", v, err)
			}
		}
		got := (decided() - before) / n
		p := math.Exp(-float64(r) / float64(delta))
		sigma := math.Sqrt(p * (1 - p) / n)
		t.Logf("r = %s: early refresh fraction %.4f, expected %.4f (σ %.4f)", r, got, p, sigma)
		if math.Abs(got-p) > 4*sigma+0.005 {
			t.Errorf("r = %s: fraction %.4f, want %.4f ± 4σ", r, got, p)
		}
	}
	if got := rstest.Sum(t, reg, "hearth_readside_early_refreshes_total", "result", "started"); got != 1 {
		t.Errorf("refreshes started: %v, want 1 (one in flight at a time)", got)
	}
	close(block)
	rstest.Eventually(t, 10*time.Second, "refresh written", func() bool {
		return env.Client.Get(ctx, key).Val() == "refreshed"
	})
	if got := rstest.Sum(t, reg, "hearth_readside_misses_total"); got != 1 {
		t.Errorf("misses: %v, want 1", got)
	}
}

// TestXFetchRefreshesBeforeExpiry: readers of a key with a short TTL keep
// finding it: it is refreshed in the background before it expires.
func TestXFetchRefreshesBeforeExpiry(t *testing.T) { xfetchBeforeExpiry(t, readside.LocalOptions{}) }

// TestXFetchRefreshesBeforeExpiryLocal: the same with a near cache whose
// Local.TTL (1 h) never ends a copy before its Redis expiry: almost every
// read is a local hit, and the refreshes that pre-empt each expiry are
// decided on those local hits.
func TestXFetchRefreshesBeforeExpiryLocal(t *testing.T) {
	xfetchBeforeExpiry(t, readside.LocalOptions{Size: 10, TTL: time.Hour})
}

func xfetchBeforeExpiry(t *testing.T, local readside.LocalOptions) {
	env := rstest.Redis(t)
	ctx := context.Background()
	key := env.Prefix + "live"
	reg := prometheus.NewRegistry()
	c := newCache(t, env.Client, reg, readside.Options{Namespace: env.Prefix + "ns", TTL: 1500 * time.Millisecond, Beta: 3, Jitter: -1, Local: local})
	o := origin{rdb: env.Client, hash: env.Prefix + "origin", delay: 100 * time.Millisecond}
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := c.GetOrLoad(ctx, key, o.loader(key)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // a reader's pace, not a wait for an outcome
	}
	if got := rstest.Sum(t, reg, "hearth_readside_early_refreshes_total", "result", "started"); got < 2 {
		t.Errorf("early refreshes: %v, want ≥ 2 in 4 s of a 1.5 s TTL", got)
	}
	if got := rstest.Sum(t, reg, "hearth_readside_misses_total"); got != 1 {
		t.Errorf("misses: %v, want 1 (the first read): every expiry was pre-empted", got)
	}
	if local.Size > 0 {
		lh, rh := rstest.Sum(t, reg, "hearth_readside_local_hits_total"), rstest.Sum(t, reg, "hearth_readside_hits_total")
		t.Logf("local hits %v, Redis hits %v", lh, rh)
		if lh < 10*rh {
			t.Errorf("local hits %v, Redis hits %v: want most reads from memory", lh, rh)
		}
	}
}

// TestForeignDelta: a δ that is no number of milliseconds is ignored and
// counted; the value is served and no early refresh is started.
func TestForeignDelta(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns := env.Prefix + "ns"
	reg := prometheus.NewRegistry()
	c := newCache(t, env.Client, reg, readside.Options{Namespace: ns, Rand: func() float64 { return 1e-300 }})
	for i, bad := range []string{"NaN", "-5", "1e9", "inf", "99999999999"} {
		key := env.Prefix + "fd" + itoa(i)
		env.Client.Set(ctx, key, "v", time.Minute)
		env.Client.Set(ctx, readside.DeltaKey(ns, key), bad, time.Minute)
		if v, err := c.GetOrLoad(ctx, key, nil); err != nil || string(v) != "v" {
			t.Fatalf("δ %q: %q, %v", bad, v, err)
		}
	}
	if got := rstest.Sum(t, reg, "hearth_readside_foreign_values_total", "what", "delta"); got != 5 {
		t.Errorf("foreign δ counted: %v, want 5", got)
	}
	if got := rstest.Sum(t, reg, "hearth_readside_early_refreshes_total"); got != 0 {
		t.Errorf("early refreshes: %v, want 0", got)
	}
}

// TestAccessRecording: sampled reads land in Hearth's bucket, ZINCRBY'd by
// the sample weight, with the safety-net TTL.
func TestAccessRecording(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns := env.Prefix + "ns"
	clock := newFakeClock(time.Unix(1_800_000_030, 0))
	c, err := readside.New(readside.Options{Client: env.Client, Namespace: ns, AccessSample: 1, Now: clock.Now,
		AccessFlush: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	load := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	for range 7 {
		if _, err := c.GetOrLoad(ctx, env.Prefix+"hot", load); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.GetOrLoad(ctx, env.Prefix+"cold", load); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	bucket := ns + ":access:1800000000" // the minute holding :30
	if got := env.Client.ZScore(ctx, bucket, env.Prefix+"hot").Val(); got != 7 {
		t.Errorf("hot: %v, want 7", got)
	}
	if got := env.Client.ZScore(ctx, bucket, env.Prefix+"cold").Val(); got != 1 {
		t.Errorf("cold: %v, want 1", got)
	}
	if ttl := env.Client.TTL(ctx, bucket).Val(); ttl <= 23*time.Hour {
		t.Errorf("bucket TTL %s, want the 24h safety net", ttl)
	}
}

func TestLockKeyInKeySlot(t *testing.T) {
	for _, key := range []string{"product:7", "{user:1}:cart", "a{b", "a{}b", "}{x}", "{", "", "x}y{z}", "ünï{cödé}"} {
		for _, k := range []string{readside.LockKey("hearth", key), readside.DeltaKey("hearth", key), readside.StaleKey("hearth", key)} {
			if got, want := readside.HashSlot(k), readside.HashSlot(key); got != want {
				t.Errorf("%q: slot %d, key %q slot %d", k, got, key, want)
			}
		}
	}
	// The examples of docs/readside.md (its Python sketch prints the same).
	for key, want := range map[string]string{"product:7": "hearth:rs:lock:{9kd}:product:7", "{user:1}:cart": "hearth:rs:lock:{3as}:{user:1}:cart"} {
		if got := readside.LockKey("hearth", key); got != want {
			t.Errorf("LockKey(%q) = %q, want %q", key, got, want)
		}
	}
	// Redis's own examples (cluster spec).
	for key, want := range map[string]int{"foo": 12182, "bar": 5061, "{user1000}.following": readside.HashSlot("user1000")} {
		if got := readside.HashSlot(key); got != want {
			t.Errorf("HashSlot(%q) = %d, want %d", key, got, want)
		}
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, o := range []readside.Options{
		{},
		{Client: rdb, Namespace: "a{b}"},
		{Client: rdb, Beta: math.NaN()},
		{Client: rdb, Jitter: math.Inf(1)},
		{Client: rdb, TTL: -time.Second},
		{Client: rdb, AccessBucket: 1500 * time.Millisecond},
		{Client: rdb, Fallback: 9},
		{Client: rdb, Local: readside.LocalOptions{Size: -1}},
		{Client: rdb, Local: readside.LocalOptions{Size: 10, TTL: -time.Second}},
	} {
		if _, err := readside.New(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

// TestEarlyRefreshDoubleChecks: an early refresh that gets the lock after
// another process has already refreshed the value (it has more TTL left than
// the read that decided saw) does not load again.
func TestEarlyRefreshDoubleChecks(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	key := env.Prefix + "dc"
	reg := prometheus.NewRegistry()
	c := newCache(t, env.Client, reg, readside.Options{Namespace: env.Prefix + "ns", TTL: time.Hour})
	runs := 0
	load := func(context.Context) ([]byte, error) { runs++; return []byte("v"), nil }
	if _, err := c.GetOrLoad(ctx, key, load); err != nil {
		t.Fatal(err)
	}
	readside.RefreshEarly(c, key, load, time.Second) // decided at 1 s left; now 1 h left
	if runs != 1 {
		t.Errorf("loads %d, want 1: a value refreshed meanwhile was loaded again", runs)
	}
	if got := rstest.Sum(t, reg, "hearth_readside_early_refreshes_total", "result", "done_elsewhere"); got != 1 {
		t.Errorf("done_elsewhere: %v, want 1", got)
	}
	readside.RefreshEarly(c, key, load, 2*time.Hour) // nothing rewrote it since
	if runs != 2 {
		t.Errorf("loads %d, want 2", runs)
	}
	if n := env.Client.Exists(ctx, readside.LockKey(env.Prefix+"ns", key)).Val(); n != 0 {
		t.Error("lock left behind")
	}
}

// TestCacheReadsTotal: every GetOrLoad counts once in hearth_cache_reads_total,
// the counter Hearth's miss-rate alert and dashboard panel read: a hit when
// Redis or the near cache answered (a value or the sentinel), a miss when
// the call had to fill.
func TestCacheReadsTotal(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns := env.Prefix + "ns"
	reg, regLocal := prometheus.NewRegistry(), prometheus.NewRegistry()
	c := newCache(t, env.Client, reg, readside.Options{Namespace: ns})
	local := newCache(t, env.Client, regLocal, readside.Options{Namespace: ns, Local: readside.LocalOptions{Size: 10, TTL: time.Minute}})
	ok := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	gone := func(context.Context) ([]byte, error) { return nil, readside.ErrNotFound }
	a, b := env.Prefix+"a", env.Prefix+"b"
	for _, step := range []struct {
		c    *readside.Cache
		key  string
		load readside.Loader
	}{
		{c, a, ok},       // miss: loads
		{c, a, ok},       // hit
		{c, b, gone},     // miss: writes the sentinel
		{c, b, gone},     // hit: the sentinel
		{local, a, ok},   // hit from Redis
		{local, a, ok},   // hit from the near cache
		{local, b, gone}, // hit from Redis: the sentinel
		{local, b, gone}, // hit from the near cache: the sentinel
	} {
		if _, err := step.c.GetOrLoad(ctx, step.key, step.load); err != nil && !errors.Is(err, readside.ErrNotFound) {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		reg             *prometheus.Registry
		name            string
		hit, miss, near float64
	}{{reg, "redis only", 2, 2, 0}, {regLocal, "near cache", 4, 0, 2}} {
		hit := rstest.Sum(t, tc.reg, "hearth_cache_reads_total", "result", "hit")
		miss := rstest.Sum(t, tc.reg, "hearth_cache_reads_total", "result", "miss")
		if hit != tc.hit || miss != tc.miss {
			t.Errorf("%s: hearth_cache_reads_total hit %v, miss %v; want %v, %v", tc.name, hit, miss, tc.hit, tc.miss)
		}
		if got := rstest.Sum(t, tc.reg, "hearth_readside_misses_total"); got != miss {
			t.Errorf("%s: hearth_readside_misses_total %v, want it equal to result=miss (%v)", tc.name, got, miss)
		}
		if got := rstest.Sum(t, tc.reg, "hearth_readside_local_hits_total"); got != tc.near {
			t.Errorf("%s: near cache hits %v, want %v", tc.name, got, tc.near)
		}
	}
}

// TestNewReportsMetricConflict: an application that exports its own
// hearth_cache_reads_total (as the docs asked before readside exported it)
// gets an error naming it from New, not a panic, and nothing half-registered.
func TestNewReportsMetricConflict(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	reg := prometheus.NewRegistry()
	own := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hearth_cache_reads_total", Help: "the application's own"}, []string{"result"})
	reg.MustRegister(own)
	own.WithLabelValues("hit")
	_, err := readside.New(readside.Options{Client: rdb, Registerer: reg})
	if err == nil || !strings.Contains(err.Error(), "hearth_cache_reads_total") || !strings.Contains(err.Error(), "Registerer") {
		t.Fatalf("New on a registry that has hearth_cache_reads_total: %v, want an error naming Options.Registerer and the metric", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "hearth_readside_") {
			t.Errorf("%s left registered by a failed New", mf.GetName())
		}
	}
}
