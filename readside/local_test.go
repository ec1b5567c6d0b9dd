package readside_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/readside"
	"github.com/hearth-dev/hearth/readside/internal/rstest"
)

// countingClient is a client to addr that counts the commands it sends, in
// pipelines too.
type countingClient struct {
	*redis.Client
	n atomic.Int64
}

func newCountingClient(t *testing.T, addr string) *countingClient {
	t.Helper()
	c := &countingClient{Client: redis.NewClient(&redis.Options{Addr: addr})}
	c.AddHook(c)
	t.Cleanup(func() { _ = c.Client.Close() })
	return c
}

func (c *countingClient) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *countingClient) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *countingClient) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

var _ redis.Hook = (*countingClient)(nil)

// sent runs f and returns the commands it sent to Redis.
func (c *countingClient) sent(f func()) int64 {
	before := c.n.Load()
	f()
	return c.n.Load() - before
}

// TestLocalHitWithoutRedis: with the near cache on, a second read of a key
// is answered from memory (no command reaches Redis, the local hit is
// counted); a write by someone else is seen once Local.TTL has passed, and
// not before: the documented staleness bound.
func TestLocalHitWithoutRedis(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	rdb := newCountingClient(t, env.Addr)
	reg := prometheus.NewRegistry()
	clock := newFakeClock(time.Unix(1_800_000_000, 0))
	c := newCache(t, rdb, reg, readside.Options{Namespace: env.Prefix + "ns", TTL: time.Hour, Beta: -1,
		Local: readside.LocalOptions{Size: 10, TTL: 2 * time.Second}, Now: clock.Now})
	o := origin{rdb: env.Client, hash: env.Prefix + "origin"}
	key := env.Prefix + "a"
	get := func() string {
		t.Helper()
		v, err := c.GetOrLoad(ctx, key, o.loader(key))
		if err != nil {
			t.Fatal(err)
		}
		return string(v)
	}
	if v := get(); v != "value of "+key {
		t.Fatalf("first read %q", v)
	}
	var v string
	if n := rdb.sent(func() { v = get() }); n != 0 || v != "value of "+key {
		t.Errorf("second read: %q with %d Redis commands, want the value with none", v, n)
	}
	if got := rstest.Sum(t, reg, "hearth_readside_local_hits_total", "kind", "value"); got != 1 {
		t.Errorf("local hits: %v, want 1", got)
	}
	env.Client.Set(ctx, key, "rewritten", time.Hour)
	clock.Add(1900 * time.Millisecond)
	if v := get(); v != "value of "+key {
		t.Errorf("within Local.TTL: %q, want the local copy", v)
	}
	clock.Add(200 * time.Millisecond)
	if n := rdb.sent(func() { v = get() }); n == 0 || v != "rewritten" {
		t.Errorf("past Local.TTL: %q with %d Redis commands, want Redis's value", v, n)
	}
	if got := o.loads(t, key); got != 1 {
		t.Errorf("loads: %d, want 1", got)
	}
}

// TestLocalNeverPastRedisExpiry: a value with 3 s left in Redis is served
// locally (Local.TTL 1 h) until those 3 s have passed on the injected clock,
// then Redis is asked again.
func TestLocalNeverPastRedisExpiry(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	rdb := newCountingClient(t, env.Addr)
	clock := newFakeClock(time.Unix(1_800_000_000, 0))
	c := newCache(t, rdb, prometheus.NewRegistry(), readside.Options{Namespace: env.Prefix + "ns", Beta: -1,
		Local: readside.LocalOptions{Size: 10, TTL: time.Hour}, Now: clock.Now})
	key := env.Prefix + "short"
	env.Client.Set(ctx, key, "v", 3*time.Second)
	load := func(context.Context) ([]byte, error) { return nil, errors.New("must not load") }
	read := func() int64 {
		t.Helper()
		return rdb.sent(func() {
			if v, err := c.GetOrLoad(ctx, key, load); err != nil || string(v) != "v" {
				t.Fatalf("read: %q, %v", v, err)
			}
		})
	}
	if n := read(); n == 0 {
		t.Fatal("first read sent no command")
	}
	clock.Add(2500 * time.Millisecond)
	if n := read(); n != 0 {
		t.Errorf("2.5 s into a 3 s PTTL: %d Redis commands, want a local hit", n)
	}
	clock.Add(time.Second)
	if n := read(); n == 0 {
		t.Error("3.5 s into a 3 s PTTL: served locally past the value's Redis expiry")
	}
}

// TestLocalNegativeBound: the not-found sentinel is cached locally too, but
// never past NegativeTTL (here 2 s, below Local.TTL and the sentinel's own
// 1 h PTTL), and a loader's ErrNotFound is remembered the same way.
func TestLocalNegativeBound(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	rdb := newCountingClient(t, env.Addr)
	reg := prometheus.NewRegistry()
	clock := newFakeClock(time.Unix(1_800_000_000, 0))
	c := newCache(t, rdb, reg, readside.Options{Namespace: env.Prefix + "ns", NegativeTTL: 2 * time.Second, Jitter: -1,
		Local: readside.LocalOptions{Size: 10, TTL: time.Minute}, Now: clock.Now})
	runs := 0
	load := func(context.Context) ([]byte, error) { runs++; return nil, readside.ErrNotFound }
	notFound := func(key string) int64 {
		t.Helper()
		return rdb.sent(func() {
			if _, err := c.GetOrLoad(ctx, key, load); !errors.Is(err, readside.ErrNotFound) {
				t.Fatalf("read %s: %v, want ErrNotFound", key, err)
			}
		})
	}
	hearths := env.Prefix + "gone"
	env.Client.Set(ctx, hearths, "", time.Hour)
	loaded := env.Prefix + "none"
	notFound(hearths)
	notFound(loaded)
	clock.Add(1500 * time.Millisecond)
	if n := notFound(hearths) + notFound(loaded); n != 0 {
		t.Errorf("within NegativeTTL: %d Redis commands, want local hits", n)
	}
	if got := rstest.Sum(t, reg, "hearth_readside_local_hits_total", "kind", "negative"); got != 2 {
		t.Errorf("negative local hits: %v, want 2", got)
	}
	clock.Add(time.Second)
	if n := notFound(hearths); n == 0 {
		t.Error("past NegativeTTL: Hearth's sentinel still served locally")
	}
	if n := notFound(loaded); n == 0 {
		t.Error("past NegativeTTL: the loaded sentinel still served locally")
	}
	if runs != 1 {
		t.Errorf("loader runs: %d, want 1", runs)
	}
}

// TestLocalBounded: a near cache of 2 keys holds the 2 read last; the
// first of 3 was evicted and costs a Redis round trip again.
func TestLocalBounded(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	rdb := newCountingClient(t, env.Addr)
	c := newCache(t, rdb, prometheus.NewRegistry(), readside.Options{Namespace: env.Prefix + "ns", Beta: -1,
		Local: readside.LocalOptions{Size: 2, TTL: time.Hour}})
	o := origin{rdb: env.Client, hash: env.Prefix + "origin"}
	read := func(i int) int64 {
		t.Helper()
		key := env.Prefix + "k" + itoa(i)
		return rdb.sent(func() {
			if _, err := c.GetOrLoad(ctx, key, o.loader(key)); err != nil {
				t.Fatal(err)
			}
		})
	}
	for i := range 3 {
		read(i)
	}
	if n := read(2) + read(1); n != 0 {
		t.Errorf("the 2 keys read last: %d Redis commands, want local hits", n)
	}
	if n := read(0); n == 0 {
		t.Error("the first of 3 keys is still held by a near cache of 2")
	}
}

// TestLocalHitsStillRefreshEarly: reads served from memory still run
// XFetch's test against the Redis expiry their copy carries; one near the
// expiry starts the background refresh, the current value is served
// meanwhile, and the refreshed value replaces the local copy.
func TestLocalHitsStillRefreshEarly(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns, key := env.Prefix+"ns", env.Prefix+"x"
	rdb := newCountingClient(t, env.Addr)
	reg := prometheus.NewRegistry()
	clock := newFakeClock(time.Unix(1_800_000_000, 0))
	var u atomic.Value
	u.Store(0.999999)
	c := newCache(t, rdb, reg, readside.Options{Namespace: ns, TTL: time.Hour, Jitter: -1, Beta: 1,
		Local: readside.LocalOptions{Size: 10, TTL: time.Hour}, Now: clock.Now,
		Rand: func() float64 { return u.Load().(float64) }})
	// A value Hearth's protocol says took δ = 1 s to load, 10 s left.
	env.Client.Set(ctx, key, "v1", 10*time.Second)
	env.Client.Set(ctx, readside.DeltaKey(ns, key), "1000", 10*time.Second)
	refreshed := make(chan struct{})
	load := func(context.Context) ([]byte, error) { close(refreshed); return []byte("v2"), nil }
	if v, err := c.GetOrLoad(ctx, key, load); err != nil || string(v) != "v1" {
		t.Fatalf("first read %q, %v", v, err)
	}
	// 9.5 s later, 0.5 s left: −δ·β·ln(0.1) = 2.3 s ≥ 0.5 s, refresh.
	// Redis's own clock moves too (the refresh double-checks its PTTL).
	clock.Add(9500 * time.Millisecond)
	env.Client.PExpire(ctx, key, 400*time.Millisecond)
	u.Store(0.1)
	var v []byte
	var err error
	rdb.sent(func() { v, err = c.GetOrLoad(ctx, key, load) })
	if err != nil || string(v) != "v1" {
		t.Fatalf("read near expiry: %q, %v, want the current value", v, err)
	}
	if got := rstest.Sum(t, reg, "hearth_readside_local_hits_total"); got != 1 {
		t.Fatalf("local hits: %v, want 1 (the read near expiry came from memory)", got)
	}
	select {
	case <-refreshed:
	case <-time.After(10 * time.Second):
		t.Fatal("no early refresh started from a local hit")
	}
	rstest.Eventually(t, 10*time.Second, "refresh stored", func() bool {
		return env.Client.Get(ctx, key).Val() == "v2" &&
			rstest.Sum(t, reg, "hearth_readside_early_refreshes_total", "result", "started") == 1
	})
	u.Store(0.999999)
	rstest.Eventually(t, 10*time.Second, "refreshed value served locally", func() bool {
		var v []byte
		n := rdb.sent(func() { v, _ = c.GetOrLoad(ctx, key, load) })
		return n == 0 && string(v) == "v2"
	})
	if got := rstest.Sum(t, reg, "hearth_readside_hits_total"); got != 1 {
		t.Errorf("Redis hits: %v, want 1 (the first read only)", got)
	}
}
