package warmer_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/origintest"
	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/sources/protect"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// rig is a warmer writing to the shared Redis under a test's own prefix.
type rig struct {
	rdb    *redis.Client
	prefix string
	reg    *prometheus.Registry
	w      *warmer.Warmer
}

func newRig(t *testing.T, rdb *redis.Client, prefix string, sources map[string]warmer.Source, specs ...*warmer.Spec) *rig {
	t.Helper()
	reg := prometheus.NewRegistry()
	w, err := warmer.New(warmer.Options{Store: &store.RedisStore{Client: rdb}, Sources: sources, Specs: specs,
		Registerer: reg, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	return &rig{rdb: rdb, prefix: prefix, reg: reg, w: w}
}

// decl is a declaration with short test timings: ttl 4s, interval 2s, load
// timeout 1s, negative ttl 1s, no jitter, no stale extension.
func decl(t *testing.T, name, key, source string) *warmer.Spec {
	t.Helper()
	s := origintest.Spec(t, name, key, "")
	s.Source = source
	return s
}

// get reads a key; ok is false when it does not exist.
func get(t *testing.T, rdb *redis.Client, key string) (string, bool) {
	t.Helper()
	v, err := rdb.Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return "", false
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	return v, true
}

func pgSource(t *testing.T, dsn string) *postgres.Source {
	t.Helper()
	src, err := postgres.New(postgres.Config{Name: "db", DSN: dsn, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	return src
}

func mustExec(t *testing.T, env *testenv.PostgresEnv, sql string, args ...any) {
	t.Helper()
	if _, err := env.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestNegativeCaching(t *testing.T) {
	r := testenv.Redis(t)
	pg := testenv.Postgres(t)
	mustExec(t, pg, `CREATE TABLE items (id text PRIMARY KEY, body text NOT NULL)`)
	mustExec(t, pg, `INSERT INTO items VALUES ('1', 'one'), ('2', 'two')`)
	s := decl(t, "item", r.Prefix+"item:{id}", "db")
	s.Members = []string{"1", "2", "3"}
	s.Query = `SELECT id, body FROM items WHERE id = ANY($1)`
	s.NegativeValue = []byte("<none>")
	rg := newRig(t, r.Client, r.Prefix, map[string]warmer.Source{"db": pgSource(t, pg.DSN)}, s)
	ctx := context.Background()

	out, err := rg.w.Refresh(ctx, "item", warmer.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out.Written != 2 || out.Negative != 1 {
		t.Fatalf("outcome %+v, want 2 written and 1 negative", out)
	}
	key3 := r.Prefix + "item:3"
	t.Run("a missing row becomes the sentinel with a short ttl", func(t *testing.T) {
		v, ok := get(t, r.Client, key3)
		if !ok || v != "<none>" {
			t.Fatalf("%s = %q (exists %v), want the sentinel", key3, v, ok)
		}
		pttl := r.Client.PTTL(ctx, key3).Val()
		// The sentinel lives negative_ttl (1s, no jitter), not the value's 4s.
		if pttl <= 0 || pttl > time.Second {
			t.Errorf("sentinel PTTL = %s, want (0, 1s]", pttl)
		}
		if got, want := strings.Join(rg.w.Negatives("item"), ","), "3"; got != want {
			t.Errorf("Negatives = %q, want %q", got, want)
		}
		if got, want := promtest.Sum(t, rg.reg, "hearth_keys_written_total", "family", "item", "kind", "negative"), 1.0; got != want {
			t.Errorf("keys_written{kind=negative} = %g, want %g", got, want)
		}
	})
	t.Run("the next check replaces it when the row appears", func(t *testing.T) {
		mustExec(t, pg, `INSERT INTO items VALUES ('3', 'three')`)
		out, err := rg.w.RefreshNegatives(ctx, "item")
		if err != nil {
			t.Fatal(err)
		}
		if out.Members != 1 || out.Written != 1 {
			t.Errorf("outcome %+v, want the one negative member asked for and written", out)
		}
		if v, _ := get(t, r.Client, key3); v != "three" {
			t.Errorf("%s = %q, want %q", key3, v, "three")
		}
		if n := rg.w.Negatives("item"); len(n) != 0 {
			t.Errorf("Negatives = %v, want none", n)
		}
		if pttl := r.Client.PTTL(ctx, key3).Val(); pttl < 3*time.Second {
			t.Errorf("value PTTL = %s, want the value's ttl 4s", pttl)
		}
	})
}

// TestMissingRowCostsOneLoadPerNegativeInterval runs the real scheduler: readers
// hammer a missing member's key; the sentinel never lapses, and the origin is
// asked for it once per negative_ttl/2, not once per read.
func TestMissingRowCostsOneLoadPerNegativeInterval(t *testing.T) {
	origintest.NoLeaks(t)
	r := testenv.Redis(t)
	u := origintest.New(t, func(m string, _ int) (int, string) {
		if m == "missing" {
			return http.StatusNotFound, ""
		}
		return http.StatusOK, "v-" + m
	})
	s := decl(t, "thing", r.Prefix+"thing:{id}", "api")
	s.Path = "/v/{id}"
	s.Members = []string{"here", "missing"}
	rg := newRig(t, r.Client, r.Prefix, map[string]warmer.Source{"api": u.Source(t, 2)}, s)
	ctx := context.Background()
	if _, err := rg.w.Refresh(ctx, "thing", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	sched, err := jobs.New(jobs.Options{Refresher: rg.w, Specs: []*warmer.Spec{s}, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := sched.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sched.Close(ctx); err != nil {
			t.Error(err)
		}
	}()

	key := r.Prefix + "thing:missing"
	const window = 3 * time.Second
	before := u.Count("missing")
	reads, misses := 0, 0
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		reads++
		if _, ok := get(t, r.Client, key); !ok {
			misses++
		}
	}
	loads := u.Count("missing") - before
	t.Logf("%d reads, %d misses, %d origin requests for the missing member in %s", reads, misses, loads, window)
	if misses != 0 {
		t.Errorf("%d of %d reads missed: the sentinel lapsed between checks", misses, reads)
	}
	// Re-checked every 500ms, plus the family's own refresh every 2s.
	if limit := int(window/(s.NegativeTTL/2)) + int(window/s.Interval) + 2; loads > limit {
		t.Errorf("origin asked %d times for the missing member in %s, want at most %d", loads, window, limit)
	}
	if loads < 2 {
		t.Errorf("origin asked %d times in %s: the missing member is not re-checked", loads, window)
	}
	if reads < 10*loads {
		t.Errorf("only %d reads for %d loads: the test did not read enough to show the difference", reads, loads)
	}
}

func TestServeStale(t *testing.T) {
	origintest.NoLeaks(t)
	r := testenv.Redis(t)
	var down atomic.Bool
	u := origintest.New(t, func(m string, _ int) (int, string) {
		if down.Load() {
			return http.StatusInternalServerError, "down"
		}
		return http.StatusOK, "v1-" + m
	})
	s := decl(t, "price", r.Prefix+"price:{id}", "api")
	s.Path = "/v/{id}"
	s.Members = []string{"a", "b"}
	s.TTL, s.Interval, s.LoadTimeout = 2*time.Second, time.Second, 500*time.Millisecond
	s.MaxStale = 3 * time.Second
	rg := newRig(t, r.Client, r.Prefix, map[string]warmer.Source{"api": u.Source(t, 2)}, s)
	ctx := context.Background()

	t0 := time.Now()
	if _, err := rg.w.Refresh(ctx, "price", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	down.Store(true)
	sched, err := jobs.New(jobs.Options{Refresher: rg.w, Specs: []*warmer.Spec{s}, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := sched.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sched.Close(ctx) }()

	key := r.Prefix + "price:a"
	// The value must be readable, untouched, until max_stale after the last
	// good load, then expire within a moment; its expiry never reaches past
	// that bound.
	var gone time.Time
	for gone.IsZero() {
		now := time.Now()
		v, ok := get(t, r.Client, key)
		switch {
		case ok && v != "v1-a":
			t.Fatalf("%s = %q while the origin fails, want the old value untouched", key, v)
		case ok:
			if pttl := r.Client.PTTL(ctx, key).Val(); pttl > 0 {
				if expiry := now.Add(pttl); expiry.After(t1.Add(s.MaxStale + 100*time.Millisecond)) {
					t.Fatalf("expiry %s after the last good load, past max_stale %s", expiry.Sub(t0), s.MaxStale)
				}
			}
		case now.Before(t0.Add(s.MaxStale - 100*time.Millisecond)):
			t.Fatalf("%s expired %s after the last good load, before max_stale %s", key, now.Sub(t0), s.MaxStale)
		default:
			gone = now
		}
		if now.After(t1.Add(s.MaxStale + 2*time.Second)) {
			t.Fatalf("%s still readable %s after the last good load (max_stale %s)", key, now.Sub(t0), s.MaxStale)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("value kept %s past its last good load (max_stale %s, ttl %s)", gone.Sub(t0).Round(time.Millisecond), s.MaxStale, s.TTL)
	if got := promtest.Sum(t, rg.reg, "hearth_stale_extensions_total", "family", "price"); got < 2 {
		t.Errorf("hearth_stale_extensions_total = %g, want >= 2", got)
	}
	if got := promtest.Sum(t, rg.reg, "hearth_staleness_seconds", "family", "price"); got < 1 {
		t.Errorf("hearth_staleness_seconds = %g, want >= 1 while the origin fails", got)
	}
	if got := promtest.Sum(t, rg.reg, "hearth_load_failures_total", "family", "price", "reason", "origin"); got < 2 {
		t.Errorf("hearth_load_failures_total{reason=origin} = %g, want >= 2", got)
	}

	down.Store(false)
	testenv.Eventually(t, 3*time.Second, "the value comes back when the origin does", func() bool {
		v, _ := get(t, r.Client, key)
		return v == "v1-a"
	})
	testenv.Eventually(t, 3*time.Second, "staleness back to 0", func() bool {
		return promtest.Sum(t, rg.reg, "hearth_staleness_seconds", "family", "price") == 0
	})
}

// TestBreakerOpenServesStale: with the source's breaker open, a refresh keeps
// the values alive without calling the origin at all.
func TestBreakerOpenServesStale(t *testing.T) {
	origintest.NoLeaks(t)
	r := testenv.Redis(t)
	var down atomic.Bool
	u := origintest.New(t, func(m string, _ int) (int, string) {
		if down.Load() {
			return http.StatusBadGateway, ""
		}
		return http.StatusOK, "v-" + m
	})
	s := decl(t, "p", r.Prefix+"p:{id}", "api")
	s.Path = "/v/{id}"
	s.Members = []string{"a", "b"}
	s.MaxStale = time.Minute
	guard := protect.Guard(u.Source(t, 2), protect.GuardConfig{Name: "api", BreakerFailures: 2, BreakerOpenFor: time.Minute})
	rg := newRig(t, r.Client, r.Prefix, map[string]warmer.Source{"api": guard}, s)
	ctx := context.Background()
	if _, err := rg.w.Refresh(ctx, "p", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	down.Store(true)
	for range 2 {
		if _, err := rg.w.Refresh(ctx, "p", warmer.RunOptions{}); err == nil {
			t.Fatal("refresh against a failing origin reported no error")
		}
	}
	calls := u.Total()
	extended := promtest.Sum(t, rg.reg, "hearth_stale_extensions_total", "family", "p")
	for range 3 {
		_, err := rg.w.Refresh(ctx, "p", warmer.RunOptions{})
		if !errors.Is(err, warmer.ErrBreakerOpen) {
			t.Fatalf("err = %v, want ErrBreakerOpen", err)
		}
	}
	if got := u.Total(); got != calls {
		t.Errorf("origin called %d times with the breaker open", got-calls)
	}
	if got := promtest.Sum(t, rg.reg, "hearth_stale_extensions_total", "family", "p") - extended; got != 6 {
		t.Errorf("%g stale extensions in 3 refreshes of 2 members with the breaker open, want 6", got)
	}
	if got := promtest.Sum(t, rg.reg, "hearth_load_failures_total", "family", "p", "reason", "breaker_open"); got != 6 {
		t.Errorf("load_failures{reason=breaker_open} = %g, want 6", got)
	}
	if v, _ := get(t, r.Client, r.Prefix+"p:a"); v != "v-a" {
		t.Errorf("value = %q, want the old one", v)
	}
}
