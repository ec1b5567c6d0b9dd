package rewarm_test

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/rewarm"
	"github.com/hearth-dev/hearth/store"
)

const rewarmNS = "hearth-rewarm-test"

// warmKeys is what a warm Redis holds in these tests: the declared single key,
// the declared member 1, and product 7, known only from the access log.
var warmKeys = []string{"product:1", "product:7", "top"}

// newRewarmEnv warms a private Redis (the tests flush and restart it) and
// builds a Rewarmer checking it every 100ms.
func newRewarmEnv(t *testing.T) (*testenv.RedisServer, *env, *rewarm.Rewarmer) {
	t.Helper()
	return newRewarmEnvWith(t, nil)
}

// newRewarmEnvWith is newRewarmEnv with the Rewarmer's options adjusted by opt.
func newRewarmEnvWith(t *testing.T, opt func(*rewarm.Options)) (*testenv.RedisServer, *env, *rewarm.Rewarmer) {
	t.Helper()
	srv := testenv.PrivateRedis(t)
	rdb := srv.Client(t)
	e := newEnv(t, rdb, "rw:")
	e.record(t, "rw:product:7")
	ctx := context.Background()
	if err := e.w.RefreshAll(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.prewarm(t)(ctx, "test", nil); err != nil {
		t.Fatal(err)
	}
	if got := e.keys(t); !slices.Equal(got, warmKeys) {
		t.Fatalf("warm keys = %q, want %q", got, warmKeys)
	}
	opts := rewarm.Options{
		Client: rdb, Namespace: rewarmNS, Interval: 100 * time.Millisecond,
		Warmer: e.w, Prewarm: e.prewarm(t), Registerer: e.reg,
	}
	if opt != nil {
		opt(&opts)
	}
	rw, err := rewarm.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return srv, e, rw
}

// waitWarm polls until every warm key is back.
func waitWarm(t *testing.T, e *env, within time.Duration) {
	t.Helper()
	var got []string
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got = e.keys(t); slices.Equal(got, warmKeys) {
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
	run(t, rw)
	if err := e.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, e, 10*time.Second)
	if got, want := promtest.Value(t, e.reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Flush), 1.0; got != want {
		t.Errorf("rewarms{reason=flush} = %g, want %g", got, want)
	}
	if n := e.rdb.Exists(ctx, store.MarkerKey(rewarmNS)).Val(); n != 1 {
		t.Errorf("marker %s not written back", store.MarkerKey(rewarmNS))
	}
}

// TestRewarmAfterRestart: a Redis restart (persistence off: it comes back
// empty, with a new run_id) is re-warmed and counted for reason restart.
func TestRewarmAfterRestart(t *testing.T) {
	srv, e, rw := newRewarmEnv(t)
	run(t, rw)
	srv.Restart(t)
	waitWarm(t, e, 10*time.Second)
	if got, want := promtest.Value(t, e.reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Restart), 1.0; got != want {
		t.Errorf("rewarms{reason=restart} = %g, want %g", got, want)
	}
	if got, want := promtest.Value(t, e.reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Flush), 0.0; got != want {
		t.Errorf("rewarms{reason=flush} = %g, want %g (a restart is not a flush)", got, want)
	}
}

// TestRewarmOnLoss: a loss calls OnLoss as soon as it is seen, the restart
// and the flush that follows it within MinGap (whose re-warm is deferred)
// alike: the daemon has the term renew its lease then, since the lease went
// with the data, rather than at its next renew interval.
func TestRewarmOnLoss(t *testing.T) {
	var losses atomic.Int64
	srv, e, rw := newRewarmEnvWith(t, func(o *rewarm.Options) {
		o.MinGap = time.Hour
		o.OnLoss = func() { losses.Add(1) }
	})
	run(t, rw)
	srv.Restart(t)
	waitWarm(t, e, 10*time.Second)
	testenv.Eventually(t, 10*time.Second, "OnLoss for the restart", func() bool { return losses.Load() == 1 })
	if err := e.rdb.FlushDB(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "OnLoss for the flush within MinGap", func() bool { return losses.Load() == 2 })
	if got := promtest.Value(t, e.reg, "hearth_prewarm_rewarms_suppressed_total", "reason", rewarm.Flush); got != 1 {
		t.Errorf("rewarms_suppressed{reason=flush} = %g, want 1 (the flush came within MinGap)", got)
	}
}

// TestRewarmCutShortFinishedByNextTerm: a re-warm that the term's end cuts
// short (the lease went with the data, and the term renewed at once) is
// finished by the next term's first check, not once MinGap has passed: the
// access-log keys only the re-warm's pre-warm writes would otherwise stay
// cold for the whole gap.
func TestRewarmCutShortFinishedByNextTerm(t *testing.T) {
	var calls atomic.Int64
	cut := make(chan struct{}, 1)
	srv, e, rw := newRewarmEnvWith(t, func(o *rewarm.Options) {
		o.MinGap = time.Hour
		prewarm := o.Prewarm
		o.Prewarm = func(ctx context.Context, reason string, keep func(string) bool) error {
			if calls.Add(1) == 1 {
				cut <- struct{}{}
				<-ctx.Done() // the term ends during the re-warm
				return context.Cause(ctx)
			}
			return prewarm(ctx, reason, keep)
		}
	})
	ctx := context.Background()
	term, end := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rw.Run(term) }()
	testenv.Eventually(t, 10*time.Second, "the baseline marker", func() bool {
		return e.rdb.Exists(ctx, store.MarkerKey(rewarmNS)).Val() == 1
	})
	srv.Restart(t)
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("no re-warm after the restart")
	}
	end()
	if err := <-done; err != nil {
		t.Fatalf("Run after its term = %v", err)
	}
	next, endNext := context.WithCancel(ctx)
	defer endNext()
	go func() { done <- rw.Run(next) }()
	waitWarm(t, e, 10*time.Second)
	if got := promtest.Value(t, e.reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Restart); got != 1 {
		t.Errorf("rewarms{reason=restart} = %g, want 1 (the finished re-warm is the same one)", got)
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
	// The first term takes the baseline (Run's first check).
	testenv.Eventually(t, 10*time.Second, "the baseline marker", func() bool {
		n, _ := e.rdb.Exists(ctx, store.MarkerKey(rewarmNS)).Result()
		return n == 1
	})
	end()
	if err := <-done; err != nil {
		t.Fatalf("Run after its term = %v", err)
	}
	if err := e.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // three intervals without a term
	if got := e.keys(t); len(got) != 0 {
		t.Errorf("re-warmed without a term: keys %q", got)
	}
	if got, want := promtest.Value(t, e.reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Flush), 0.0; got != want {
		t.Errorf("rewarms{reason=flush} = %g, want %g", got, want)
	}
	term, end = context.WithCancel(ctx)
	defer end()
	go func() { done <- rw.Run(term) }()
	waitWarm(t, e, 10*time.Second)
	if got, want := promtest.Value(t, e.reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Flush), 1.0; got != want {
		t.Errorf("rewarms{reason=flush} = %g, want %g", got, want)
	}
	end()
	if err := <-done; err != nil {
		t.Fatalf("Run after the second term = %v", err)
	}
}

// TestRunLeavesNoGoroutine: Run returns only once everything it started has
// stopped — the check loop and the push watch's sessions, one of them just
// reconnecting after a flush — so that a term's end leaves nothing of the
// re-warm running.
func TestRunLeavesNoGoroutine(t *testing.T) {
	_, e, rw := newRewarmEnv(t)
	opt := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rw.Run(ctx) }()
	testenv.Eventually(t, 10*time.Second, "the re-warm baseline", func() bool { return rewarm.Armed(rw) })
	waitTracking(t, e)
	if err := e.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, e, 10*time.Second)
	waitTracking(t, e)
	// The flush ends the watch's session: Run ends while it reconnects.
	if err := e.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	// At once, not eventually: Run waited for them.
	buf := make([]byte, 1<<20)
	for g := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "hearth/rewarm.") {
			t.Errorf("a goroutine of the re-warm outlived Run:\n%s", g)
		}
	}
	goleak.VerifyNone(t, opt)
}
