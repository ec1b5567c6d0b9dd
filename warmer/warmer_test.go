package warmer_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/sourcetest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// origin is the shared fake origin (internal/sourcetest), whose rows,
// failures and calls the test controls.
type origin struct{ *sourcetest.Fake }

func newOrigin() *origin { return &origin{sourcetest.New("db")} }

func (o *origin) set(member string, v []byte) { o.Set(member, v) }

func (o *origin) setFail(err error) { o.Fail(err) }

type fixture struct {
	env *testenv.RedisEnv
	reg *prometheus.Registry
	w   *warmer.Warmer
	now *clock
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func family(t *testing.T, prefix, name string, members int) *warmer.Spec {
	t.Helper()
	tp, err := keytmpl.Parse(prefix + name + ":{id}")
	if err != nil {
		t.Fatal(err)
	}
	s := &warmer.Spec{
		Name: name, Template: tp, Source: "o",
		TTL: 10 * time.Second, Jitter: 0.2, Interval: 5 * time.Second, LoadTimeout: 2 * time.Second,
		BatchSize: 7, NegativeTTL: 2 * time.Second, NegativeValue: []byte{},
		MaxStale: time.Minute, MaxValueBytes: 1 << 10,
	}
	for i := range members {
		s.Members = append(s.Members, strconv.Itoa(i))
	}
	return s
}

func newFixture(t *testing.T, src warmer.Source, specs ...*warmer.Spec) *fixture {
	t.Helper()
	f := &fixture{env: testenv.Redis(t), reg: prometheus.NewRegistry(), now: &clock{t: time.Now()}}
	w, err := warmer.New(warmer.Options{
		Store:   &store.RedisStore{Client: f.env.Client},
		Sources: map[string]warmer.Source{"o": src}, Specs: specs,
		MaxConcurrentLoads: 4, Registerer: f.reg, Logger: zerolog.Nop(), Now: f.now.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.w = w
	return f
}

func TestRefreshWritesEveryMemberByteForByte(t *testing.T) {
	o := newOrigin()
	env := testenv.Redis(t)
	spec := family(t, env.Prefix, "product", 50)
	for i := range 50 {
		o.set(strconv.Itoa(i), []byte(fmt.Sprintf("v%d\x00\xff\r\n", i)))
	}
	f := newFixture(t, o, spec)
	out, err := f.w.Refresh(context.Background(), "product", warmer.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := out.Written, 50; got != want {
		t.Fatalf("written = %d, want %d", got, want)
	}
	if got, want := o.Calls(), 8; got != want { // ceil(50/7): batched, never one load per key
		t.Errorf("origin loads = %d, want %d", got, want)
	}
	ctx := context.Background()
	for i := range 50 {
		key := spec.Template.Key(strconv.Itoa(i))
		got, err := f.env.Client.Get(ctx, key).Result()
		if err != nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		if want := fmt.Sprintf("v%d\x00\xff\r\n", i); got != want {
			t.Errorf("GET %s = %q, want %q", key, got, want)
		}
		ttl := f.env.Client.PTTL(ctx, key).Val()
		if ttl < spec.MinTTL()-time.Second || ttl > spec.MaxTTL() {
			t.Errorf("PTTL %s = %s, want within [%s, %s]", key, ttl, spec.MinTTL(), spec.MaxTTL())
		}
	}
	if got := promtest.Value(t, f.reg, "hearth_keys_written_total", "family", "product", "kind", "value"); got != 50 {
		t.Errorf("hearth_keys_written_total = %g, want 50", got)
	}
}

func TestJitterSpreadsTTLs(t *testing.T) {
	o := newOrigin()
	env := testenv.Redis(t)
	spec := family(t, env.Prefix, "j", 200)
	spec.BatchSize = 200
	for _, m := range spec.Members {
		o.set(m, []byte("x"))
	}
	f := newFixture(t, o, spec)
	if _, err := f.w.Refresh(context.Background(), "j", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	lo, hi := time.Hour, time.Duration(0)
	for _, m := range spec.Members {
		ttl := f.env.Client.PTTL(context.Background(), spec.Template.Key(m)).Val()
		lo, hi = min(lo, ttl), max(hi, ttl)
	}
	// 200 uniform draws over ±10% of 10s: the spread is far above 1s unless
	// jitter is missing.
	if hi-lo < time.Second {
		t.Errorf("TTL spread %s..%s: jitter not applied", lo, hi)
	}
}

func TestMissingMemberBecomesSentinelUntilItAppears(t *testing.T) {
	o := newOrigin()
	env := testenv.Redis(t)
	spec := family(t, env.Prefix, "p", 2)
	spec.NegativeValue = []byte("<none>")
	o.set("0", []byte("zero"))
	f := newFixture(t, o, spec)
	ctx := context.Background()
	out, err := f.w.Refresh(ctx, "p", warmer.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := out.Negative, 1; got != want {
		t.Fatalf("negative = %d, want %d", got, want)
	}
	key := spec.Template.Key("1")
	if got, want := f.env.Client.Get(ctx, key).Val(), "<none>"; got != want {
		t.Errorf("GET %s = %q, want sentinel %q", key, got, want)
	}
	if ttl := f.env.Client.PTTL(ctx, key).Val(); ttl > spec.NegativeTTL*11/10 || ttl <= 0 {
		t.Errorf("sentinel PTTL = %s, want short (≈ %s)", ttl, spec.NegativeTTL)
	}
	o.set("1", []byte("one"))
	if _, err := f.w.Refresh(ctx, "p", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, want := f.env.Client.Get(ctx, key).Val(), "one"; got != want {
		t.Errorf("after the row appeared GET %s = %q, want %q", key, got, want)
	}
}

func TestOriginFailureKeepsValuesAliveUpToMaxStale(t *testing.T) {
	o := newOrigin()
	env := testenv.Redis(t)
	spec := family(t, env.Prefix, "s", 3)
	spec.MaxStale = 30 * time.Second
	for _, m := range spec.Members {
		o.set(m, []byte("good-"+m))
	}
	f := newFixture(t, o, spec)
	ctx := context.Background()
	if _, err := f.w.Refresh(ctx, "s", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	key := spec.Template.Key("1")
	// Let the TTL run down a little so that an extension is visible.
	if err := f.env.Client.PExpire(ctx, key, 3*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	o.setFail(errors.New("connection refused"))
	f.now.Add(5 * time.Second)
	out, err := f.w.Refresh(ctx, "s", warmer.RunOptions{})
	if err == nil {
		t.Fatal("refresh with a failing origin returned no error")
	}
	if got, want := out.Extended, 3; got != want {
		t.Errorf("extended = %d, want %d", got, want)
	}
	if got, want := f.env.Client.Get(ctx, key).Val(), "good-1"; got != want {
		t.Errorf("value after failure = %q, want the old %q", got, want)
	}
	if ttl := f.env.Client.PTTL(ctx, key).Val(); ttl < 5*time.Second {
		t.Errorf("PTTL after failure = %s, want extended past 5s", ttl)
	}
	if got := promtest.Value(t, f.reg, "hearth_stale_extensions_total", "family", "s"); got != 3 {
		t.Errorf("hearth_stale_extensions_total = %g, want 3", got)
	}

	// Past max_stale since the last good load, values are no longer kept alive.
	if err := f.env.Client.PExpire(ctx, key, 3*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	f.now.Add(30 * time.Second)
	out, _ = f.w.Refresh(ctx, "s", warmer.RunOptions{})
	if got, want := out.Extended, 0; got != want {
		t.Errorf("extended past max_stale = %d, want %d", got, want)
	}
	if ttl := f.env.Client.PTTL(ctx, key).Val(); ttl > 3*time.Second {
		t.Errorf("PTTL past max_stale = %s, want not extended (≤ 3s)", ttl)
	}
	if got, want := f.env.Client.Get(ctx, key).Val(), "good-1"; got != want {
		t.Errorf("value past max_stale = %q, want untouched %q until it expires", got, want)
	}
}

func TestFailedDeclarationDoesNotStopOthers(t *testing.T) {
	good, bad := newOrigin(), newOrigin()
	env := testenv.Redis(t)
	a := family(t, env.Prefix, "a", 3)
	b := family(t, env.Prefix, "b", 3)
	b.Source = "bad"
	for _, m := range a.Members {
		good.set(m, []byte("ok"))
	}
	bad.setFail(errors.New("boom"))
	reg := prometheus.NewRegistry()
	w, err := warmer.New(warmer.Options{
		Store:   &store.RedisStore{Client: env.Client},
		Sources: map[string]warmer.Source{"o": good, "bad": bad}, Specs: []*warmer.Spec{a, b},
		Registerer: reg, Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	err = w.RefreshAll(context.Background())
	if err == nil {
		t.Fatal("RefreshAll hid the failing declaration")
	}
	if n := env.Client.Exists(context.Background(), a.Template.Key("0"), a.Template.Key("1"), a.Template.Key("2")).Val(); n != 3 {
		t.Errorf("healthy declaration wrote %d of 3 keys", n)
	}
	if got := promtest.Value(t, reg, "hearth_refresh_runs_total", "family", "b", "result", "error"); got != 1 {
		t.Errorf("runs{b,error} = %g, want 1", got)
	}
	if got := promtest.Value(t, reg, "hearth_refresh_runs_total", "family", "a", "result", "ok"); got != 1 {
		t.Errorf("runs{a,ok} = %g, want 1", got)
	}
}

func TestOversizedValueKeepsOldValue(t *testing.T) {
	o := newOrigin()
	env := testenv.Redis(t)
	spec := family(t, env.Prefix, "big", 2)
	spec.MaxValueBytes = 8
	o.set("0", []byte("small"))
	o.set("1", []byte("fine"))
	f := newFixture(t, o, spec)
	ctx := context.Background()
	if _, err := f.w.Refresh(ctx, "big", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	o.set("0", []byte("far too large for the bound"))
	out, err := f.w.Refresh(ctx, "big", warmer.RunOptions{})
	if !errors.Is(err, warmer.ErrTooLarge) {
		t.Fatalf("err = %v, want ErrTooLarge", err)
	}
	if got, want := out.Written, 1; got != want {
		t.Errorf("written = %d, want %d (the other member)", got, want)
	}
	if got, want := env.Client.Get(ctx, spec.Template.Key("0")).Val(), "small"; got != want {
		t.Errorf("value = %q, want old %q kept", got, want)
	}
	if got := promtest.Value(t, f.reg, "hearth_load_failures_total", "family", "big", "reason", "too_large"); got != 1 {
		t.Errorf("failures{too_large} = %g, want 1", got)
	}
}

func TestSpreadPacesBatches(t *testing.T) {
	o := newOrigin()
	env := testenv.Redis(t)
	spec := family(t, env.Prefix, "paced", 20)
	spec.BatchSize = 5
	for _, m := range spec.Members {
		o.set(m, []byte("v"))
	}
	w, err := warmer.New(warmer.Options{
		Store: &store.RedisStore{Client: env.Client}, Sources: map[string]warmer.Source{"o": o},
		Specs: []*warmer.Spec{spec}, Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	spread := 400 * time.Millisecond
	if _, err := w.Refresh(context.Background(), "paced", warmer.RunOptions{Spread: spread}); err != nil {
		t.Fatal(err)
	}
	starts := o.Starts()
	if got, want := len(starts), 4; got != want {
		t.Fatalf("loads = %d, want %d", got, want)
	}
	gap := spread / 4
	for i := 1; i < len(starts); i++ {
		if d := starts[i].Sub(starts[0]); d < time.Duration(i)*gap-5*time.Millisecond {
			t.Errorf("batch %d started %s after the first, want ≥ %s", i, d, time.Duration(i)*gap)
		}
	}
}

func TestDrainStopsFurtherBatches(t *testing.T) {
	o := newOrigin()
	env := testenv.Redis(t)
	spec := family(t, env.Prefix, "drain", 20)
	spec.BatchSize = 5
	for _, m := range spec.Members {
		o.set(m, []byte("v"))
	}
	f := newFixture(t, o, spec)
	drain := make(chan struct{})
	close(drain)
	out, _ := f.w.Refresh(context.Background(), "drain", warmer.RunOptions{Spread: time.Hour, Drain: drain})
	if out.Written != 0 || o.Calls() != 0 {
		t.Errorf("a drained run loaded %d times and wrote %d keys, want none", o.Calls(), out.Written)
	}
}

// panicker is an origin with a bug.
type panicker struct{}

func (panicker) Load(context.Context, *warmer.Spec, []string) ([]warmer.Result, error) {
	panic("index out of range")
}
func (panicker) Ping(context.Context) error { return nil }

func TestPanickingSourceFailsItsBatchNotTheDaemon(t *testing.T) {
	env := testenv.Redis(t)
	spec := family(t, env.Prefix, "p", 3)
	ctx := context.Background()
	key := spec.Template.Key("0")
	if err := env.Client.Set(ctx, key, "old", 2*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	w, err := warmer.New(warmer.Options{
		Store: &store.RedisStore{Client: env.Client}, Sources: map[string]warmer.Source{"o": panicker{}},
		Specs: []*warmer.Spec{spec}, Registerer: reg, Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.Refresh(ctx, "p", warmer.RunOptions{})
	if !errors.Is(err, warmer.ErrOrigin) {
		t.Fatalf("err = %v, want ErrOrigin from the recovered panic", err)
	}
	if got, want := env.Client.Get(ctx, key).Val(), "old"; got != want {
		t.Errorf("value = %q, want %q kept", got, want)
	}
	if ttl := env.Client.PTTL(ctx, key).Val(); ttl <= 2*time.Second {
		t.Errorf("PTTL = %s: the old value was not kept alive", ttl)
	}
	if got := promtest.Value(t, reg, "hearth_loads_in_flight"); got != 0 {
		t.Errorf("hearth_loads_in_flight = %g after the panic, want 0", got)
	}
}
