package warmer_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hearth-dev/hearth/warmer"
)

// catchOrigin is an in-process Source that records which members it was asked for.
type catchOrigin struct {
	mu    sync.Mutex
	asked []string
}

func (o *catchOrigin) Load(_ context.Context, _ *warmer.Spec, members []string) ([]warmer.Result, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]warmer.Result, len(members))
	for i, m := range members {
		o.asked = append(o.asked, m)
		out[i] = warmer.Result{Member: m, Value: []byte("fresh-" + m)}
	}
	return out, nil
}

func (o *catchOrigin) Ping(context.Context) error { return nil }

func (o *catchOrigin) loaded() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := slices.Clone(o.asked)
	slices.Sort(out)
	return out
}

func familySpec(t *testing.T, prefix string, members ...string) *warmer.Spec {
	t.Helper()
	tpl, err := warmer.ParseTemplate(prefix + "product:{id}")
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
	env := newLeaseEnv(t)
	inst := env.instance(2*time.Second, 20*time.Millisecond, false)
	src := &catchOrigin{}
	spec := familySpec(t, env.prefix, "fresh", "expiring", "missing", "persistent")
	w, err := warmer.New(warmer.Options{
		Store: inst.store, Gate: inst.lease, Sources: map[string]warmer.Source{"origin": src},
		Specs: []*warmer.Spec{spec}, Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	key := func(m string) string { return env.prefix + "product:" + m }
	env.client.Set(ctx, key("fresh"), "old", 9*time.Second)
	env.client.Set(ctx, key("expiring"), "old", 1500*time.Millisecond)
	env.client.Set(ctx, key("persistent"), "old", 0)

	t.Run("a standby catches nothing up", func(t *testing.T) {
		res, err := w.CatchUp(ctx, nil)
		if !errors.Is(err, warmer.ErrNotLeader) {
			t.Errorf("err = %v, want ErrNotLeader", err)
		}
		if got := src.loaded(); len(got) != 0 || res.Refreshed != 0 {
			t.Errorf("standby loaded %v, refreshed %d", got, res.Refreshed)
		}
	})

	term := campaign(t, inst.lease, 5*time.Second)
	defer term.Release(ctx)

	// The next run is 2s away: keys with less than 2s + the 1s load timeout
	// left would expire before it, and only those.
	res, err := w.CatchUp(ctx, func(*warmer.Spec) time.Duration { return 2 * time.Second })
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
		if got := env.client.Get(ctx, key(m)).Val(); got != want {
			t.Errorf("%s = %q, want %q", key(m), got, want)
		}
	}
	if ttl := env.client.PTTL(ctx, key("expiring")).Val(); ttl < 5*time.Second {
		t.Errorf("caught-up key has ttl %s", ttl)
	}
}
