package rewarm_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/rewarm"
	"github.com/hearth-dev/hearth/store"
)

// noPoll is a check interval the tests never reach: whatever re-warms within
// them was triggered by a push.
const noPoll = time.Hour

// TestRewarmPushFlush: with the periodic check out of reach, a FLUSHDB is
// still re-warmed: the client-tracking invalidation (a null key list) makes
// the check run at once, and the detection is counted as a push.
func TestRewarmPushFlush(t *testing.T) {
	_, e, rw := newRewarmEnvWith(t, func(o *rewarm.Options) { o.Interval, o.MinGap = noPoll, 2*time.Second })
	ctx := context.Background()
	run(t, rw)
	waitTracking(t, e)
	for i := range 2 {
		if err := e.rdb.FlushDB(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		waitWarm(t, e, 10*time.Second)
		testenv.Eventually(t, 10*time.Second, "the flush counted as detected by push", func() bool {
			return promtest.Value(t, e.reg, "hearth_prewarm_rewarm_detections_total", "via", rewarm.DetectPush) >= float64(i+1)
		})
		if i == 0 {
			// The watch re-subscribes after a flush: the second one is seen
			// too; if it falls within the minimum gap it is re-warmed once
			// the gap has passed, although no poll comes.
			waitTracking(t, e)
		}
	}
	if got := promtest.Value(t, e.reg, "hearth_prewarm_rewarm_detections_total", "via", rewarm.DetectPoll); got != 0 {
		t.Errorf("detections{via=poll} = %g, want 0 (the poll never ran)", got)
	}
	if got, want := promtest.Value(t, e.reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Flush), 2.0; got != want {
		t.Errorf("rewarms{reason=flush} = %g, want %g", got, want)
	}
}

// TestRewarmPushRestart: a restart drops the watch's connection; once it
// reconnects it makes the check run, which sees the new run_id and re-warms.
func TestRewarmPushRestart(t *testing.T) {
	srv, e, rw := newRewarmEnvWith(t, func(o *rewarm.Options) { o.Interval = noPoll })
	run(t, rw)
	waitTracking(t, e)
	srv.Restart(t)
	waitWarm(t, e, 10*time.Second)
	if got, want := promtest.Value(t, e.reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Restart), 1.0; got != want {
		t.Errorf("rewarms{reason=restart} = %g, want %g", got, want)
	}
	if got, want := promtest.Value(t, e.reg, "hearth_prewarm_rewarm_detections_total", "via", rewarm.DetectPush), 1.0; got != want {
		t.Errorf("detections{via=push} = %g, want %g", got, want)
	}
}

// TestRewarmNoPushPolls: with the push watch off, a flush is seen by the
// periodic check, counted as a poll, and no connection tracks anything.
func TestRewarmNoPushPolls(t *testing.T) {
	_, e, rw := newRewarmEnvWith(t, func(o *rewarm.Options) { o.NoPush = true })
	ctx := context.Background()
	run(t, rw)
	if n := trackingClients(t, e); n != 0 {
		t.Fatalf("%d tracking connections with NoPush", n)
	}
	if err := e.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, e, 10*time.Second)
	testenv.Eventually(t, 10*time.Second, "the flush counted as detected by poll", func() bool {
		return promtest.Value(t, e.reg, "hearth_prewarm_rewarm_detections_total", "via", rewarm.DetectPoll) == 1
	})
	if got := promtest.Value(t, e.reg, "hearth_prewarm_rewarm_detections_total", "via", rewarm.DetectPush); got != 0 {
		t.Errorf("detections{via=push} = %g, want 0", got)
	}
}

// trackingClients counts the connections with client tracking on (flag t).
func trackingClients(t *testing.T, e *env) int {
	t.Helper()
	list, err := e.rdb.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range splitFields(list) {
		if len(f) > 6 && f[:6] == "flags=" && containsByte(f[6:], 't') {
			n++
		}
	}
	return n
}

// waitTracking waits until the watch's tracking connection is on.
func waitTracking(t *testing.T, e *env) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "the push watch tracks the marker", func() bool { return trackingClients(t, e) == 1 })
}

func splitFields(s string) []string {
	var out []string
	start := -1
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ' ' || s[i] == '\n' || s[i] == '\r' {
			if start >= 0 {
				out = append(out, s[start:i])
				start = -1
			}
			continue
		}
		if start < 0 {
			start = i
		}
	}
	return out
}

func containsByte(s string, b byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == b {
			return true
		}
	}
	return false
}

// hammer runs fn(i) perSecond times a second, pipelined in 10 ms rounds, for
// d, and returns how many times it ran.
func hammer(t *testing.T, rdb *redis.Client, perSecond int, d time.Duration, fn func(p redis.Pipeliner, i int)) int {
	t.Helper()
	ctx := context.Background()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); <-tick.C {
		p := rdb.Pipeline()
		for range perSecond / 100 {
			fn(p, n)
			n++
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// TestRewarmPushIgnoresLookalikes: 7,400 writes a second to keys that only
// share the marker's prefix (<ns>:warmX), and a flood of foreign PUBLISHes
// on __redis__:invalidate naming the marker, make no check at all (before,
// BCAST PREFIX matched them: 21,547 INFO and 22,441 EVALSHA in 8 s); the
// foreign messages are counted, and a real FLUSHDB afterwards is still seen
// by push and re-warmed.
func TestRewarmPushIgnoresLookalikes(t *testing.T) {
	_, e, rw := newRewarmEnvWith(t, func(o *rewarm.Options) { o.Interval, o.MinGap = noPoll, time.Millisecond })
	ctx := context.Background()
	run(t, rw)
	waitTracking(t, e)
	time.Sleep(200 * time.Millisecond) // the opening check and its marker write settle
	marker := store.MarkerKey(rewarmNS)
	before := testenv.CommandCalls(t, e.rdb, "info", "evalsha")
	writes := hammer(t, e.rdb, 7400, 3*time.Second, func(p redis.Pipeliner, i int) {
		p.Set(ctx, marker+"X"+strconv.Itoa(i%100), i, 0)
	})
	published := hammer(t, e.rdb, 1000, time.Second, func(p redis.Pipeliner, _ int) {
		p.Publish(ctx, "__redis__:invalidate", marker)
	})
	time.Sleep(200 * time.Millisecond)
	after := testenv.CommandCalls(t, e.rdb, "info", "evalsha")
	if d := after["info"] - before["info"]; d > 2 {
		t.Errorf("%d INFO calls during %d writes to look-alike keys and %d foreign publishes, want none (checks)", d, writes, published)
	}
	if d := after["evalsha"] - before["evalsha"]; d > 2 {
		t.Errorf("%d EVALSHA calls during the flood, want none", d)
	}
	testenv.Eventually(t, 10*time.Second, "the foreign publishes counted as ignored", func() bool {
		return promtest.Value(t, e.reg, "hearth_prewarm_rewarm_ignored_invalidations_total") == float64(published)
	})
	if err := e.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, e, 10*time.Second)
	if got := promtest.Value(t, e.reg, "hearth_prewarm_rewarm_detections_total", "via", rewarm.DetectPush); got != 1 {
		t.Errorf("detections{via=push} = %g after the flush, want 1", got)
	}
}

// TestRewarmChecksPaced: a DEL of the marker 1,000 times a second (each a
// real invalidation of it) makes at most one check per MinCheckGap, and the
// losses are still re-warmed.
func TestRewarmChecksPaced(t *testing.T) {
	_, e, rw := newRewarmEnvWith(t, func(o *rewarm.Options) { o.Interval, o.MinGap = noPoll, time.Millisecond })
	ctx := context.Background()
	run(t, rw)
	waitTracking(t, e)
	marker := store.MarkerKey(rewarmNS)
	const d = 3 * time.Second
	before := testenv.CommandCalls(t, e.rdb, "info")
	t0 := time.Now()
	hammer(t, e.rdb, 1000, d, func(p redis.Pipeliner, _ int) { p.Del(ctx, marker) })
	elapsed := time.Since(t0)
	checks := testenv.CommandCalls(t, e.rdb, "info")["info"] - before["info"]
	if limit := int64(elapsed/rewarm.MinCheckGap) + 2; checks > limit {
		t.Errorf("%d checks (INFO) in %v of marker deletions, want at most %d (one per %v)", checks, elapsed, limit, rewarm.MinCheckGap)
	}
	if checks == 0 {
		t.Errorf("no check at all while the marker was deleted: the push watch saw nothing")
	}
	waitWarm(t, e, 10*time.Second)
	t.Logf("%d checks in %v", checks, elapsed)
}

// TestRewarmPushSessionsPaced: a FLUSHDB 100 times a second ends the watch's
// session each time, and the watch reconnects at once after a drop, but its
// sessions that reach Redis (each a SUBSCRIBE) start at least MinCheckGap
// apart; the flushes are still re-warmed.
func TestRewarmPushSessionsPaced(t *testing.T) {
	_, e, rw := newRewarmEnvWith(t, func(o *rewarm.Options) { o.Interval, o.MinGap = noPoll, time.Millisecond })
	ctx := context.Background()
	run(t, rw)
	waitTracking(t, e)
	const d = 2 * time.Second
	before := testenv.CommandCalls(t, e.rdb, "subscribe")
	t0 := time.Now()
	hammer(t, e.rdb, 100, d, func(p redis.Pipeliner, _ int) { p.FlushDB(ctx) })
	elapsed := time.Since(t0)
	sessions := testenv.CommandCalls(t, e.rdb, "subscribe")["subscribe"] - before["subscribe"]
	if limit := int64(elapsed/rewarm.MinCheckGap) + 2; sessions > limit {
		t.Errorf("%d watch sessions (SUBSCRIBE) in %v of flushes, want at most %d (one per %v)", sessions, elapsed, limit, rewarm.MinCheckGap)
	}
	if sessions == 0 {
		t.Errorf("the watch never reconnected during the flushes")
	}
	waitWarm(t, e, 10*time.Second)
	t.Logf("%d sessions in %v", sessions, elapsed)
}

// TestRewarmPushRestartGated: a leader whose term ended during the outage
// (the watch runs only within a term) writes nothing while Redis restarts;
// the next term's first check re-warms the restart.
func TestRewarmPushRestartGated(t *testing.T) {
	srv, e, rw := newRewarmEnvWith(t, func(o *rewarm.Options) { o.Interval = noPoll })
	term, end := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rw.Run(term) }()
	waitTracking(t, e)
	end()
	if err := <-done; err != nil {
		t.Fatalf("Run after its term = %v", err)
	}
	srv.Restart(t)
	time.Sleep(300 * time.Millisecond)
	if got := e.keys(t); len(got) != 0 {
		t.Fatalf("keys written while not leading: %q", got)
	}
	term, end = context.WithCancel(context.Background())
	defer end()
	go func() { done <- rw.Run(term) }()
	waitWarm(t, e, 10*time.Second)
	if got, want := promtest.Value(t, e.reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Restart), 1.0; got != want {
		t.Errorf("rewarms{reason=restart} = %g, want %g", got, want)
	}
	end()
	if err := <-done; err != nil {
		t.Fatalf("Run after the second term = %v", err)
	}
}
