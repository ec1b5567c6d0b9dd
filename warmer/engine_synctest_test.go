package warmer_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/sourcetest"
	"github.com/hearth-dev/hearth/internal/storetest"
	"github.com/hearth-dev/hearth/sources/protect"
	"github.com/hearth-dev/hearth/warmer"
)

// The engine's pure logic (pacing, the falling-behind projection, stale
// extension) on the in-memory store and the fake source, inside a synctest
// bubble: time moves only when every goroutine waits, so the figures are
// exact and nothing waits on the wall clock. What the warmer does against
// Redis itself is proven by the tests on a real server.

// memWarmer is a warmer over the in-memory store and one source "o", with
// loads limited to maxLoads at a time.
func memWarmer(t *testing.T, src warmer.Source, maxLoads int, log *syncWriter, specs ...*warmer.Spec) (*warmer.Warmer, *storetest.Store, *prometheus.Registry) {
	t.Helper()
	st := storetest.New()
	reg := prometheus.NewRegistry()
	logger := zerolog.Nop()
	if log != nil {
		logger = zerolog.New(log)
	}
	w, err := warmer.New(warmer.Options{
		Store: st, Sources: map[string]warmer.Source{"o": src}, Specs: specs,
		MaxConcurrentLoads: maxLoads, Registerer: reg, Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	return w, st, reg
}

// fakeFamily is family's declaration with its members held by a fake source.
func fakeFamily(t *testing.T, name string, members int) (*warmer.Spec, *sourcetest.Fake) {
	t.Helper()
	spec := family(t, "", name, members)
	spec.Jitter = 0
	src := sourcetest.New("o")
	for _, m := range spec.Members {
		src.Set(m, []byte("v"+m))
	}
	return spec, src
}

// startsAt fails unless load i started exactly i·gap after the first.
func startsAt(t *testing.T, starts []time.Time, n int, gap time.Duration) {
	t.Helper()
	if len(starts) != n {
		t.Fatalf("loads = %d, want %d", len(starts), n)
	}
	for i, s := range starts {
		if d := s.Sub(starts[0]); d != time.Duration(i)*gap {
			t.Errorf("batch %d started %v after the first, want %v", i, d, time.Duration(i)*gap)
		}
	}
}

// A spread run starts its batches evenly over the spread, not all at once:
// the origin sees the family's load as a steady trickle.
func TestPacingSpreadsBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec, src := fakeFamily(t, "spread", 30)
		spec.BatchSize = 5 // 6 batches
		w, st, _ := memWarmer(t, src, 8, nil, spec)
		start := time.Now()
		out, err := w.Refresh(context.Background(), "spread", warmer.RunOptions{Spread: 60 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		startsAt(t, src.Starts(), 6, 10*time.Millisecond)
		if took := time.Since(start); took != 50*time.Millisecond {
			t.Errorf("run took %v, want 50ms (the last batch starts at 5/6 of the spread)", took)
		}
		if out.Written != 30 || len(st.Keys()) != 30 {
			t.Errorf("written %d, %d keys in the store; want 30", out.Written, len(st.Keys()))
		}
		// Without a spread, every batch goes at once.
		src.Reset()
		if _, err := w.Refresh(context.Background(), "spread", warmer.RunOptions{}); err != nil {
			t.Fatal(err)
		}
		startsAt(t, src.Starts(), 6, 0)
	})
}

// A spread that would ask the origin faster than its rate bound is stretched
// to RateHeadroom of the bound, so that the plan can be kept (batches wait for
// their planned time, not for the limiter).
func TestPacingHonoursTheOriginRateExactly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec, fake := fakeFamily(t, "rated", 30)
		spec.BatchSize = 5 // 6 batches
		src := protect.Guard(fake, protect.GuardConfig{Name: "o", Rate: 25, Burst: 1, Logger: zerolog.Nop()})
		w, _, _ := memWarmer(t, src, 8, nil, spec)
		// 6 batches over 60ms would be 100 calls/s; the bound is 25/s, at
		// 80% of it 20/s: 50ms apart.
		if _, err := w.Refresh(context.Background(), "rated", warmer.RunOptions{Spread: 60 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		startsAt(t, fake.Starts(), 6, 50*time.Millisecond)
	})
}

// behindFamily is a family whose run, at 100 ms per batch of 2 and one load
// at a time, takes 2 s, past its TTL of 1.5 s: every key of the second run
// is written 0.5 s after its previous value expired.
func behindFamily(t *testing.T) (*warmer.Spec, *sourcetest.Fake) {
	spec, src := fakeFamily(t, "slow", 40)
	spec.BatchSize = 2
	spec.TTL, spec.Interval, spec.LoadTimeout = 1500*time.Millisecond, 750*time.Millisecond, 500*time.Millisecond
	src.SetDelay(100 * time.Millisecond)
	return spec, src
}

// A run that cannot write its keys before their TTLs run out says so while
// it runs, once, with the family and the shortfall; it is counted, the gauge
// shows by how much, and a run longer than its interval is an overrun.
func TestBehindIsProjectedLoggedAndCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec, src := behindFamily(t)
		log := &syncWriter{w: &bytes.Buffer{}}
		w, st, reg := memWarmer(t, src, 1, log, spec)
		ctx := context.Background()
		if _, err := w.Refresh(ctx, "slow", warmer.RunOptions{}); err != nil { // writes everything once
			t.Fatal(err)
		}
		if got := promtest.Sum(t, reg, "hearth_refresh_behind_total"); got != 0 {
			t.Fatalf("first run (no key written before) counted behind %g times", got)
		}
		// The projection is made while the run goes: a second into the
		// second run the gauge already shows the shortfall, before any key
		// is written late.
		var during float64
		done := make(chan struct{})
		go func() {
			defer close(done)
			time.Sleep(1050 * time.Millisecond)
			during = promtest.Value(t, reg, "hearth_refresh_behind_seconds", "family", "slow")
		}()
		if _, err := w.Refresh(ctx, "slow", warmer.RunOptions{Planned: time.Now()}); err != nil {
			t.Fatal(err)
		}
		<-done
		if during < 0.4 || during > 0.6 {
			t.Errorf("hearth_refresh_behind_seconds a second into the run = %g, want the projected 0.5 s", during)
		}
		if got := promtest.Value(t, reg, "hearth_refresh_behind_total", "family", "slow"); got != 1 {
			t.Errorf("hearth_refresh_behind_total = %g, want 1 (once per run)", got)
		}
		if got := promtest.Value(t, reg, "hearth_refresh_behind_seconds", "family", "slow"); got != 0.5 {
			t.Errorf("hearth_refresh_behind_seconds after the run = %g, want its lateness, 0.5 s", got)
		}
		if got := promtest.Value(t, reg, "hearth_refresh_overruns_total", "family", "slow"); got != 1 {
			t.Errorf("hearth_refresh_overruns_total = %g, want 1", got)
		}
		logs := log.String()
		if n := strings.Count(logs, "refresh run falling behind"); n != 1 {
			t.Errorf("falling-behind warnings = %d, want 1 (while the run went, once):\n%s", n, logs)
		}
		for _, want := range []string{`"family":"slow"`, `"shortfall_ms":`, `"refresh run overran its interval"`, `"overrun_ms":`} {
			if !strings.Contains(logs, want) {
				t.Errorf("logs lack %s:\n%s", want, logs)
			}
		}
		if n := len(st.Writes()); n != 80 {
			t.Errorf("%d writes, want all 40 keys written by each run", n)
		}
	})
}

// A run that falls behind and then speeds up (the origin recovered) says it
// caught up, and ends with the gauge at 0 when no key was written late.
func TestBehindCatchesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec, src := behindFamily(t)
		spec.Members = family(t, "", "slow", 300).Members // 150 batches
		spec.TTL = 6 * time.Second
		log := &syncWriter{w: &bytes.Buffer{}}
		w, _, reg := memWarmer(t, src, 1, log, spec)
		ctx := context.Background()
		src.SetDelay(10 * time.Millisecond)
		if _, err := w.Refresh(ctx, "slow", warmer.RunOptions{}); err != nil { // 1.5 s
			t.Fatal(err)
		}
		// At 150 ms a batch the second run would take 22 s, past the 6 s
		// TTLs; after 1.2 s the origin is fast again and the run ends in
		// time, 2.6 s after it began (projected at 1 s and 2 s).
		src.SetDelay(150 * time.Millisecond)
		go func() {
			time.Sleep(1200 * time.Millisecond)
			src.SetDelay(10 * time.Millisecond)
		}()
		if _, err := w.Refresh(ctx, "slow", warmer.RunOptions{Planned: time.Now()}); err != nil {
			t.Fatal(err)
		}
		logs := log.String()
		if !strings.Contains(logs, "refresh run falling behind") {
			t.Errorf("no falling-behind warning while the origin was slow:\n%s", logs)
		}
		if !strings.Contains(logs, "refresh run caught up") {
			t.Errorf("no caught-up note once the origin was fast again:\n%s", logs)
		}
		if got := promtest.Value(t, reg, "hearth_refresh_behind_seconds", "family", "slow"); got != 0 {
			t.Errorf("hearth_refresh_behind_seconds = %g, want 0: every key was written in time", got)
		}
		if got := promtest.Value(t, reg, "hearth_refresh_behind_total", "family", "slow"); got != 1 {
			t.Errorf("hearth_refresh_behind_total = %g, want 1: the run was projected behind", got)
		}
	})
}

// A run that keeps up is neither counted behind nor an overrun.
func TestOnTimeIsNotBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec, src := behindFamily(t)
		spec.TTL, spec.Interval, spec.LoadTimeout = 20*time.Second, 10*time.Second, 2*time.Second
		src.SetDelay(60 * time.Millisecond)
		w, _, reg := memWarmer(t, src, 1, nil, spec)
		for range 2 {
			if _, err := w.Refresh(context.Background(), "slow", warmer.RunOptions{Planned: time.Now()}); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range []string{"hearth_refresh_behind_total", "hearth_refresh_behind_seconds", "hearth_refresh_overruns_total"} {
			if got := promtest.Sum(t, reg, name); got != 0 {
				t.Errorf("%s = %g, want 0", name, got)
			}
		}
	})
}

// While the origin fails, each run keeps the members' last values alive,
// untouched, until exactly MaxStale after their last good load, and never
// past it; when the origin comes back the values are fresh again.
func TestServeStaleUpToMaxStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec, src := fakeFamily(t, "price", 2)
		spec.TTL, spec.Interval, spec.MaxStale = 10*time.Second, 5*time.Second, time.Minute
		w, st, reg := memWarmer(t, src, 8, nil, spec)
		ctx := context.Background()
		key := spec.Template.Key(spec.Members[0])
		if _, err := w.Refresh(ctx, "price", warmer.RunOptions{}); err != nil {
			t.Fatal(err)
		}
		lastGood := time.Now()
		old, _ := st.Get(key)
		src.Fail(errors.New("origin down"))
		for time.Since(lastGood) < 90*time.Second {
			if _, err := w.Refresh(ctx, "price", warmer.RunOptions{}); err == nil {
				t.Fatal("a run against a failing origin reported success")
			}
			// Check every second until the next run.
			for range 5 {
				age := time.Since(lastGood)
				v, ok := st.Get(key)
				switch {
				case age < spec.MaxStale && !ok:
					t.Fatalf("%s expired %v after its last good load, before max_stale %v", key, age, spec.MaxStale)
				case ok && !bytes.Equal(v, old):
					t.Fatalf("%s = %q while the origin fails, want the old value %q", key, v, old)
				case age >= spec.MaxStale && ok:
					t.Fatalf("%s still there %v after its last good load, past max_stale %v", key, age, spec.MaxStale)
				}
				if ttl, ok := st.TTL(key); ok && time.Now().Add(ttl).After(lastGood.Add(spec.MaxStale)) {
					t.Fatalf("%s expires %v after its last good load, past max_stale", key, time.Since(lastGood)+ttl)
				}
				time.Sleep(time.Second)
			}
		}
		if got := promtest.Value(t, reg, "hearth_stale_extensions_total", "family", "price"); got != 2*12 {
			t.Errorf("hearth_stale_extensions_total = %g, want 24 (both members, each run at 0, 5, …, 55 s)", got)
		}
		src.Fail(nil)
		src.Set(spec.Members[0], []byte("fresh"))
		if _, err := w.Refresh(ctx, "price", warmer.RunOptions{}); err != nil {
			t.Fatal(err)
		}
		if v, _ := st.Get(key); string(v) != "fresh" {
			t.Errorf("%s = %q once the origin is back, want its value", key, v)
		}
	})
}

// A catch-up's batches are watched as a run's are: when the keys it races
// will expire before it reaches them (20 batches of 100 ms each, every key
// due in 1 s), it warns while it goes, marked as a catch-up, and is counted;
// one whose keys have time enough is not.
func TestCatchUpBehindIsLoggedAndCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spec, src := behindFamily(t)
		log := &syncWriter{w: &bytes.Buffer{}}
		w, st, reg := memWarmer(t, src, 1, log, spec)
		batches := func(due time.Duration) []warmer.Batch {
			var out []warmer.Batch
			for i := 0; i < len(spec.Members); i += 2 {
				out = append(out, warmer.Batch{Name: "slow", Members: spec.Members[i : i+2], Due: time.Now().Add(due).UnixNano()})
			}
			return out
		}
		if _, err := w.RefreshBatches(context.Background(), batches(10*time.Second)); err != nil {
			t.Fatal(err)
		}
		if got := promtest.Sum(t, reg, "hearth_refresh_behind_total"); got != 0 {
			t.Fatalf("a catch-up with time enough counted behind %g times:\n%s", got, log.String())
		}
		outs, err := w.RefreshBatches(context.Background(), batches(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if len(outs) != 20 || outs[19].Written != 2 {
			t.Fatalf("outcomes %+v, want 20 batches, all written", outs)
		}
		if got := promtest.Value(t, reg, "hearth_refresh_behind_total", "family", "slow"); got != 1 {
			t.Errorf("hearth_refresh_behind_total = %g, want 1", got)
		}
		if got := promtest.Value(t, reg, "hearth_refresh_behind_seconds", "family", "slow"); got != 1 {
			t.Errorf("hearth_refresh_behind_seconds = %g, want the last batch's lateness, 1 s", got)
		}
		logs := log.String()
		if n := strings.Count(logs, "refresh run falling behind"); n != 1 {
			t.Errorf("falling-behind warnings = %d, want 1:\n%s", n, logs)
		}
		for _, want := range []string{`"family":"slow"`, `"run":"catch-up"`, `"shortfall_ms":`} {
			if !strings.Contains(logs, want) {
				t.Errorf("logs lack %s:\n%s", want, logs)
			}
		}
		if n := len(st.Writes()); n != 80 {
			t.Errorf("%d writes, want every key written by each catch-up", n)
		}
		// Batches with no deadline (a traffic-driven promotion) are not
		// watched: they leave the gauge and the counter as they were.
		if _, err := w.RefreshBatches(context.Background(), []warmer.Batch{{Name: "slow", Members: spec.Members[:2]}}); err != nil {
			t.Fatal(err)
		}
		if got := promtest.Value(t, reg, "hearth_refresh_behind_seconds", "family", "slow"); got != 1 {
			t.Errorf("after a promotion, hearth_refresh_behind_seconds = %g, want the catch-up's 1 s still", got)
		}
		if got := promtest.Value(t, reg, "hearth_refresh_behind_total", "family", "slow"); got != 1 {
			t.Errorf("after a promotion, hearth_refresh_behind_total = %g, want 1", got)
		}
	})
}
