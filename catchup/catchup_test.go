package catchup_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hearth-dev/hearth/catchup"
	"github.com/hearth-dev/hearth/internal/leadertest"
	"github.com/hearth-dev/hearth/internal/sourcetest"
	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/warmer"
)

// catchOrigin answers every member with "fresh-<member>" and records which
// members it was asked for.
type catchOrigin struct{ *sourcetest.Fake }

func newCatchOrigin() *catchOrigin {
	f := sourcetest.New("origin")
	f.Answer(func(m string) (warmer.Result, bool) { return warmer.Result{Value: []byte("fresh-" + m)}, true })
	return &catchOrigin{f}
}

func (o *catchOrigin) loaded() []string {
	out := o.Asked()
	slices.Sort(out)
	return out
}

func familySpec(t *testing.T, prefix string, members ...string) *warmer.Spec {
	t.Helper()
	tpl, err := keytmpl.Parse(prefix + "product:{id}")
	if err != nil {
		t.Fatal(err)
	}
	return &warmer.Spec{
		Name: "product", Template: tpl, Source: "origin",
		TTL: 10 * time.Second, Interval: 5 * time.Second, LoadTimeout: time.Second,
		Members: members, BatchSize: 2, MaxMembers: 100, NegativeValue: []byte{},
		NegativeTTL: time.Second, MaxValueBytes: 1 << 20,
	}
}

func TestCatchUp(t *testing.T) {
	ctx := context.Background()
	env := leadertest.New(t)
	inst := env.Instance(2*time.Second, 20*time.Millisecond, false)
	src := newCatchOrigin()
	spec := familySpec(t, env.Prefix, "fresh", "expiring", "missing", "persistent")
	w, err := warmer.New(warmer.Options{
		Store: inst.Store, Gate: inst.Gate(), Sources: map[string]warmer.Source{"origin": src},
		Specs: []*warmer.Spec{spec}, Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	key := func(m string) string { return env.Prefix + "product:" + m }
	env.Client.Set(ctx, key("fresh"), "old", 9*time.Second)
	env.Client.Set(ctx, key("expiring"), "old", 1500*time.Millisecond)
	env.Client.Set(ctx, key("persistent"), "old", 0)

	t.Run("a standby catches nothing up", func(t *testing.T) {
		res, err := catchup.Run(ctx, w, catchup.Options{})
		if !errors.Is(err, leader.ErrNotLeader) {
			t.Errorf("err = %v, want ErrNotLeader", err)
		}
		if got := src.loaded(); len(got) != 0 || res.Refreshed != 0 {
			t.Errorf("standby loaded %v, refreshed %d", got, res.Refreshed)
		}
	})

	term := leadertest.Campaign(t, inst.Lease, 5*time.Second)
	defer term.Release(ctx)

	// The next run is 2s away: keys with less than 2s + the 1s load timeout
	// (+ slack) left would expire before it, and only those.
	res, err := catchup.Run(ctx, w, catchup.Options{Schedule: schedule{"product": time.Now().Add(2 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := src.loaded(), []string{"expiring", "missing"}; !slices.Equal(got, want) {
		t.Errorf("loaded %v, want %v", got, want)
	}
	if res.Checked != 4 || res.Due != 2 || res.Refreshed != 2 || res.Failed != 0 {
		t.Errorf("result %+v, want 4 checked, 2 due, 2 refreshed", res)
	}
	for m, want := range map[string]string{"fresh": "old", "expiring": "fresh-expiring", "missing": "fresh-missing", "persistent": "old"} {
		if got := env.Client.Get(ctx, key(m)).Val(); got != want {
			t.Errorf("%s = %q, want %q", key(m), got, want)
		}
	}
	if ttl := env.Client.PTTL(ctx, key("expiring")).Val(); ttl < 5*time.Second {
		t.Errorf("caught-up key has ttl %s", ttl)
	}
}

// schedule is a fixed catchup.Schedule: a declaration absent from it is not
// scheduled.
type schedule map[string]time.Time

func (s schedule) NextRun(name string) (time.Time, bool) {
	t, ok := s[name]
	return t, ok
}

func TestHorizon(t *testing.T) {
	spec := &warmer.Spec{Name: "p", Interval: 4 * time.Second, LoadTimeout: time.Second}
	now := time.Unix(1000, 0)
	const slack = 250 * time.Millisecond
	for _, tc := range []struct {
		name           string
		next           time.Time
		known          bool
		spread         float64
		batch, batches int
		want           time.Duration
	}{
		// Not scheduled yet: a whole interval, the whole spread, the load.
		{"unknown", time.Time{}, false, 0.5, 0, 4, 4*time.Second + 2*time.Second + time.Second + slack},
		{"unknown, no spread", time.Time{}, false, 0, 0, 1, 4*time.Second + time.Second + slack},
		// Next run in 1s; 4 batches paced over 2s, 500ms apart.
		{"first batch", now.Add(time.Second), true, 0.5, 0, 4, time.Second + 500*time.Millisecond + time.Second + slack},
		{"last batch", now.Add(time.Second), true, 0.5, 3, 4, time.Second + 2*time.Second + time.Second + slack},
		// A single batch is not paced: it goes out when the run starts.
		{"one batch", now.Add(time.Second), true, 0.5, 0, 1, time.Second + time.Second + slack},
		{"no pacing", now.Add(time.Second), true, 0, 3, 4, time.Second + time.Second + slack},
		// A spread no config should hold counts as the whole interval.
		{"NaN spread", time.Time{}, false, math.NaN(), 0, 4, 4*time.Second + 4*time.Second + time.Second + slack},
		{"negative spread", now.Add(time.Second), true, -3, 3, 4, time.Second + 4*time.Second + time.Second + slack},
		// A next run in the past (a late timer) is now.
		{"next run passed", now.Add(-time.Second), true, 0.5, 0, 4, 500*time.Millisecond + time.Second + slack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := catchup.Horizon(spec, now, tc.next, tc.known, tc.spread, tc.batch, tc.batches); got != tc.want {
				t.Errorf("Horizon = %s, want %s", got, tc.want)
			}
		})
	}
}

// catchUpEnv is a leader's warmer over one family, its keys in the shared Redis.
type catchUpEnv struct {
	env  *leadertest.Env
	src  *catchOrigin
	w    *warmer.Warmer
	spec *warmer.Spec
}

func newCatchUpEnv(t *testing.T, batch int, members ...string) *catchUpEnv {
	t.Helper()
	env := leadertest.New(t)
	inst := env.Instance(5*time.Second, 20*time.Millisecond, false)
	src := newCatchOrigin()
	spec := familySpec(t, env.Prefix, members...)
	spec.TTL, spec.Interval, spec.BatchSize = 8*time.Second, 4*time.Second, batch
	w, err := warmer.New(warmer.Options{
		Store: inst.Store, Gate: inst.Gate(), Sources: map[string]warmer.Source{"origin": src},
		Specs: []*warmer.Spec{spec}, Registerer: prometheus.NewRegistry(), MaxConcurrentLoads: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	term := leadertest.Campaign(t, inst.Lease, 5*time.Second)
	t.Cleanup(func() { _ = term.Release(context.Background()) })
	return &catchUpEnv{env: env, src: src, w: w, spec: spec}
}

func (e *catchUpEnv) set(t *testing.T, ttls map[string]time.Duration) {
	t.Helper()
	for m, ttl := range ttls {
		if err := e.env.Client.Set(context.Background(), e.env.Prefix+"product:"+m, "old", ttl).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCatchUpHorizon: a key is due when it would expire before this
// instance's schedule rewrites it, batch by batch; a declaration whose next
// run is unknown assumes the whole interval and spread.
func TestCatchUpHorizon(t *testing.T) {
	ctx := context.Background()
	t.Run("next run known: each batch its own horizon", func(t *testing.T) {
		// Three batches paced over 2s (667ms apart), the next run in 1s:
		// batch 0 is rewritten within 1s+667ms+1s (+250ms slack) = 2.92s,
		// batch 2 within 1s+2s+1s (+slack) = 4.25s.
		e := newCatchUpEnv(t, 2, "a0", "a1", "b0", "b1", "c0", "c1")
		e.set(t, map[string]time.Duration{
			"a0": 3500 * time.Millisecond, // batch 0, outlives its horizon
			"a1": 2 * time.Second,         // batch 0, would expire first
			"b0": 7 * time.Second, "b1": 7 * time.Second,
			"c0": 3500 * time.Millisecond, // batch 2: the same TTL is due here
			"c1": 7 * time.Second,
		})
		res, err := catchup.Run(ctx, e.w, catchup.Options{Schedule: schedule{"product": time.Now().Add(time.Second)}, Spread: 0.5})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := e.src.loaded(), []string{"a1", "c0"}; !slices.Equal(got, want) {
			t.Errorf("loaded %v, want %v", got, want)
		}
		if res.Checked != 6 || res.Due != 2 || res.Refreshed != 2 || res.Unscheduled != 0 {
			t.Errorf("result %+v, want 6 checked, 2 due, 2 refreshed", res)
		}
	})
	t.Run("next run unknown: interval + spread + load timeout", func(t *testing.T) {
		// 4s interval + 2s spread + 1s load timeout (+ slack) = 7.25s: a key
		// with 6s left may expire before a schedule opened after the catch-up
		// reaches it, one with 7.8s left may not.
		e := newCatchUpEnv(t, 2, "a0", "a1", "b0")
		e.set(t, map[string]time.Duration{"a0": 6 * time.Second, "a1": 7800 * time.Millisecond})
		res, err := catchup.Run(ctx, e.w, catchup.Options{Spread: 0.5})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := e.src.loaded(), []string{"a0", "b0"}; !slices.Equal(got, want) {
			t.Errorf("loaded %v, want %v", got, want)
		}
		if res.Unscheduled != 1 || res.Due != 2 {
			t.Errorf("result %+v, want 1 unscheduled, 2 due", res)
		}
	})
}

// TestCatchUpHottestFirst: due keys are loaded soonest-to-expire first,
// missing ones before all, across declarations.
func TestCatchUpHottestFirst(t *testing.T) {
	ctx := context.Background()
	env := leadertest.New(t)
	inst := env.Instance(5*time.Second, 20*time.Millisecond, false)
	src := newCatchOrigin() // records the order of its loads
	product := familySpec(t, env.Prefix, "p1", "p2", "p3")
	price := familySpec(t, env.Prefix+"x", "q1", "q2")
	price.Name = "price"
	for _, s := range []*warmer.Spec{product, price} {
		s.BatchSize = 1
	}
	w, err := warmer.New(warmer.Options{
		Store: inst.Store, Gate: inst.Gate(), Sources: map[string]warmer.Source{"origin": src},
		Specs: []*warmer.Spec{product, price}, Registerer: prometheus.NewRegistry(), MaxConcurrentLoads: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	term := leadertest.Campaign(t, inst.Lease, 5*time.Second)
	defer term.Release(ctx)
	set := time.Now()
	for k, ttl := range map[string]time.Duration{
		"product:p1": 3 * time.Second, "product:p3": 1 * time.Second,
		"xproduct:q1": 2 * time.Second, "xproduct:q2": 4 * time.Second,
	} {
		env.Client.Set(ctx, env.Prefix+k, "old", ttl)
	}
	setDone := time.Now() // each key ends between set and setDone, plus its TTL
	// p2 is missing. Every key is due: the schedule is unknown.
	rec := &batchRecorder{Engine: w}
	if _, err := catchup.Run(ctx, rec, catchup.Options{}); err != nil {
		t.Fatal(err)
	}
	if got, want := src.Asked(), []string{"p2", "p3", "q1", "p1", "q2"}; !slices.Equal(got, want) {
		t.Errorf("loaded in order %v, want %v", got, want)
	}
	// Each batch carries its TTL end, by which the warmer watches the
	// catch-up for falling behind: the missing key's is already past.
	if len(rec.batches) != 5 {
		t.Fatalf("batches %+v, want 5", rec.batches)
	}
	if d := time.Unix(0, rec.batches[0].Due); d.After(time.Now()) {
		t.Errorf("the missing key's batch is due at %s, in the future", d)
	}
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second} {
		due := time.Unix(0, rec.batches[i+1].Due)
		// PTTL counts whole milliseconds, from Redis's clock of its command.
		if due.After(setDone.Add(want+2*time.Millisecond)) || due.Before(set.Add(want-time.Second)) {
			t.Errorf("batch %d (%v) due %s after its key was set, want within a second below its TTL, %s", i+1, rec.batches[i+1].Members, due.Sub(set), want)
		}
	}
}

// batchRecorder is an Engine that keeps the batches a catch-up asks for.
type batchRecorder struct {
	catchup.Engine
	batches []warmer.Batch
}

func (r *batchRecorder) RefreshBatches(ctx context.Context, batches []warmer.Batch) ([]warmer.Outcome, error) {
	r.batches = append(r.batches, batches...)
	return r.Engine.RefreshBatches(ctx, batches)
}
