package readside_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/readside"
)

// helperEnv names the helper a re-executed test binary runs instead of the
// tests: "stampede" or "holder" (see helper_test.go).
const helperEnv = "READSIDE_TEST_HELPER"

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		if err := runHelper(h); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// lockedRand is a seeded PCG safe for concurrent use.
func lockedRand(seed uint64) func() float64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, seed))
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	}
}

// fakeClock is an injected clock that only moves when told.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() time.Time       { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Add(d time.Duration)  { c.ns.Add(int64(d)) }
func newFakeClock(t time.Time) *fakeClock { c := &fakeClock{}; c.ns.Store(t.UnixNano()); return c }

func newCache(t *testing.T, rdb redis.UniversalClient, reg prometheus.Registerer, o readside.Options) *readside.Cache {
	t.Helper()
	o.Client, o.Registerer = rdb, reg
	c, err := readside.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return c
}

// origin counts loads per key in Redis, so that several processes share it.
type origin struct {
	rdb   *redis.Client
	hash  string
	delay time.Duration
}

func (o origin) loader(key string) readside.Loader {
	return func(ctx context.Context) ([]byte, error) {
		if err := o.rdb.HIncrBy(ctx, o.hash, key, 1).Err(); err != nil {
			return nil, err
		}
		select {
		case <-time.After(o.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return []byte("value of " + key), nil
	}
}

func (o origin) loads(t testing.TB, key string) int {
	t.Helper()
	n, err := o.rdb.HGet(context.Background(), o.hash, key).Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return n
}

func itoa(i int) string { return strconv.Itoa(i) }
