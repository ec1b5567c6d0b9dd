package warmer_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/prewarmtest"
	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

const rewarmNS = "hearth-rewarm-test"

// warmKeys is what a warm Redis holds in these tests: the declared single key,
// the declared member 1, and product 7, known only from the access log.
var warmKeys = []string{"product:1", "product:7", "top"}

// newRewarmEnv warms a private Redis (the tests flush and restart it) and
// opens a Rewarmer checking it every 100ms.
func newRewarmEnv(t *testing.T) (*testenv.RedisServer, *prewarmtest.Env, *warmer.Rewarmer) {
	t.Helper()
	return newRewarmEnvWith(t, nil)
}

// newRewarmEnvWith is newRewarmEnv with the Rewarmer's options adjusted by opt.
func newRewarmEnvWith(t *testing.T, opt func(*warmer.RewarmOptions)) (*testenv.RedisServer, *prewarmtest.Env, *warmer.Rewarmer) {
	t.Helper()
	srv := testenv.PrivateRedis(t)
	rdb := srv.Client(t)
	e := prewarmtest.New(t, rdb, "rw:", 20, 100, "")
	e.Record(t, "rw:product:7")
	ctx := context.Background()
	if err := e.W.RefreshAll(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.PW.Run(ctx, e.Options(10)); err != nil {
		t.Fatal(err)
	}
	if got := e.Keys(t); !slices.Equal(got, warmKeys) {
		t.Fatalf("warm keys = %q, want %q", got, warmKeys)
	}
	opts := warmer.RewarmOptions{
		Client: rdb, Namespace: rewarmNS, Interval: 100 * time.Millisecond,
		Warmer: e.W, Prewarm: e.PW.Rewarm(e.Options(10)), Registerer: e.Reg,
	}
	if opt != nil {
		opt(&opts)
	}
	rw, err := warmer.NewRewarmer(opts)
	if err != nil {
		t.Fatal(err)
	}
	return srv, e, rw
}

// waitWarm polls until every warm key is back.
func waitWarm(t *testing.T, e *prewarmtest.Env, within time.Duration) {
	t.Helper()
	var got []string
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got = e.Keys(t); slices.Equal(got, warmKeys) {
			return
		}
	}
	t.Fatalf("keys after %s = %q, want %q back", within, got, warmKeys)
}

// TestRewarmAfterFlush: FLUSHDB under a running rewarmer brings every key back,
// the access-log ones included, and counts a re-warm for reason flush.
func TestRewarmAfterFlush(t *testing.T) {
	_, e, rw := newRewarmEnv(t)
	ctx := context.Background()
	if err := rw.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer rw.Close(ctx)
	if err := e.RDB.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, e, 10*time.Second)
	if got, want := promtest.Value(t, e.Reg, "hearth_prewarm_rewarms_total", "reason", warmer.RewarmFlush), 1.0; got != want {
		t.Errorf("rewarms{reason=flush} = %g, want %g", got, want)
	}
	if n := e.RDB.Exists(ctx, store.MarkerKey(rewarmNS)).Val(); n != 1 {
		t.Errorf("marker %s not written back", store.MarkerKey(rewarmNS))
	}
}

// TestRewarmAfterRestart: a Redis restart (persistence off: it comes back
// empty, with a new run_id) is re-warmed and counted for reason restart.
func TestRewarmAfterRestart(t *testing.T) {
	srv, e, rw := newRewarmEnv(t)
	ctx := context.Background()
	if err := rw.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer rw.Close(ctx)
	srv.Restart(t)
	waitWarm(t, e, 10*time.Second)
	if got, want := promtest.Value(t, e.Reg, "hearth_prewarm_rewarms_total", "reason", warmer.RewarmRestart), 1.0; got != want {
		t.Errorf("rewarms{reason=restart} = %g, want %g", got, want)
	}
	if got, want := promtest.Value(t, e.Reg, "hearth_prewarm_rewarms_total", "reason", warmer.RewarmFlush), 0.0; got != want {
		t.Errorf("rewarms{reason=flush} = %g, want %g (a restart is not a flush)", got, want)
	}
}

// TestRewarmPerTerm: the watch runs only within a leader term (Run); a loss
// while no term runs (a standby, or a FLUSHALL that also took the lease) is
// re-warmed by the next term's first check, against the baseline the last
// term took.
func TestRewarmPerTerm(t *testing.T) {
	_, e, rw := newRewarmEnv(t)
	ctx := context.Background()
	term, end := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rw.Run(term) }()
	// The first term takes the baseline (Open's first check).
	testenv.Eventually(t, 10*time.Second, "the baseline marker", func() bool {
		n, _ := e.RDB.Exists(ctx, store.MarkerKey(rewarmNS)).Result()
		return n == 1
	})
	end()
	if err := <-done; err != nil {
		t.Fatalf("Run after its term = %v", err)
	}
	if err := e.RDB.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // three intervals without a term
	if got := e.Keys(t); len(got) != 0 {
		t.Errorf("re-warmed without a term: keys %q", got)
	}
	if got, want := promtest.Value(t, e.Reg, "hearth_prewarm_rewarms_total", "reason", warmer.RewarmFlush), 0.0; got != want {
		t.Errorf("rewarms{reason=flush} = %g, want %g", got, want)
	}
	term, end = context.WithCancel(ctx)
	defer end()
	go func() { done <- rw.Run(term) }()
	waitWarm(t, e, 10*time.Second)
	if got, want := promtest.Value(t, e.Reg, "hearth_prewarm_rewarms_total", "reason", warmer.RewarmFlush), 1.0; got != want {
		t.Errorf("rewarms{reason=flush} = %g, want %g", got, want)
	}
	end()
	if err := <-done; err != nil {
		t.Fatalf("Run after the second term = %v", err)
	}
}
