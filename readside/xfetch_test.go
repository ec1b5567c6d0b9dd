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

// TestEarlyRefreshElsewhereStopsOurs: two Caches on their own clients, as
// two processes on one Redis, both deciding to refresh a key early on every
// read. While A's early refresh loads, B's decisions find it (the lock) and
// load nothing; once A's value has landed, a decision B made before it finds
// the rewritten value and loads nothing either. The loaders count their
// runs: A's two (the first load, the refresh), B's none.
func TestEarlyRefreshElsewhereStopsOurs(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns, key := env.Prefix+"ns", env.Prefix+"k"
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	clock := newFakeClock(time.Unix(1_800_000_000, 0)) // A's loads take δ = 1 s exactly
	a := newCache(t, env.Client, regA, readside.Options{Namespace: ns, TTL: time.Hour, Jitter: -1, Now: clock.Now, Rand: always})
	b := newCache(t, secondClient(t, env), regB, readside.Options{Namespace: ns, TTL: time.Hour, Jitter: -1, Rand: always})
	var loadsA, loadsB atomic.Int64
	release := make(chan struct{})
	loadA := func(context.Context) ([]byte, error) {
		if loadsA.Add(1) > 1 {
			<-release // the refresh holds the lock until told
		}
		clock.Add(time.Second)
		return []byte("from a"), nil
	}
	loadB := func(context.Context) ([]byte, error) { loadsB.Add(1); return []byte("from b"), nil }
	if _, err := a.GetOrLoad(ctx, key, loadA); err != nil {
		t.Fatal(err)
	}
	// Near expiry: 10 s left of the value and its δ (1 s).
	for _, k := range []string{key, readside.DeltaKey(ns, key)} {
		if err := env.Client.PExpire(ctx, k, 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := a.GetOrLoad(ctx, key, loadA); err != nil || string(v) != "from a" {
		t.Fatalf("a: %q, %v", v, err)
	}
	rstest.Eventually(t, 10*time.Second, "a's early refresh loading", func() bool { return loadsA.Load() == 2 })

	for range 20 {
		if v, err := b.GetOrLoad(ctx, key, loadB); err != nil || string(v) != "from a" {
			t.Fatalf("b during a's refresh: %q, %v (the current value must be served)", v, err)
		}
	}
	readside.RefreshEarly(b, key, loadB, 10*time.Second) // and waits for B's refresh, if any, to end
	if n := loadsB.Load(); n != 0 {
		t.Fatalf("b loaded %d times while a's early refresh was loading, want 0", n)
	}

	close(release)
	rstest.Eventually(t, 10*time.Second, "a's refresh written", func() bool {
		return env.Client.PTTL(ctx, key).Val() > time.Minute && env.Client.Exists(ctx, readside.LockKey(ns, key)).Val() == 0
	})
	readside.RefreshEarly(b, key, loadB, 10*time.Second) // decided on what it saw before a's value landed
	for range 20 {
		if v, err := b.GetOrLoad(ctx, key, loadB); err != nil || string(v) != "from a" {
			t.Fatalf("b after a's refresh: %q, %v", v, err)
		}
	}
	readside.RefreshEarly(b, key, loadB, 10*time.Second)
	if n := loadsB.Load(); n != 0 {
		t.Errorf("b loaded %d times after a's early refresh, want 0", n)
	}
	if n := loadsA.Load(); n != 2 {
		t.Errorf("a loaded %d times, want 2 (the first load and one early refresh)", n)
	}
	if got := rstest.Sum(t, regB, "hearth_readside_early_refreshes_total", "result", "started"); got != 0 {
		t.Errorf("b's early refreshes started: %v, want 0", got)
	}
	if got := rstest.Sum(t, regB, "hearth_readside_early_refreshes_total", "result", "done_elsewhere"); got < 1 {
		t.Errorf("b's early refreshes done_elsewhere: %v, want ≥ 1", got)
	}
	if got := rstest.Sum(t, regA, "hearth_readside_early_refreshes_total", "result", "started"); got != 1 {
		t.Errorf("a's early refreshes started: %v, want 1", got)
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
