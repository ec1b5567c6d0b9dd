package warmer_test

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// recorder is an origin that answers every member, after a delay, and
// records the batches it was asked for, in order.
type recorder struct {
	mu    sync.Mutex
	delay time.Duration
	asked [][]string
}

func (r *recorder) Load(ctx context.Context, _ *warmer.Spec, members []string) ([]warmer.Result, error) {
	r.mu.Lock()
	r.asked = append(r.asked, slices.Clone(members))
	r.mu.Unlock()
	if r.delay > 0 {
		select {
		case <-time.After(r.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out := make([]warmer.Result, 0, len(members))
	for _, m := range members {
		out = append(out, warmer.Result{Member: m, Value: []byte("v" + m)})
	}
	return out, nil
}

func (r *recorder) Ping(context.Context) error { return nil }

func (r *recorder) order() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, b := range r.asked {
		out = append(out, b...)
	}
	r.asked = nil
	return out
}

// serialWarmer is a warmer with one load at a time, so that its loads come
// in the order the run starts its batches.
func serialWarmer(t *testing.T, env *testenv.RedisEnv, src warmer.Source, now func() time.Time, log *syncWriter, spec *warmer.Spec) (*warmer.Warmer, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	logger := zerolog.Nop()
	if log != nil {
		logger = zerolog.New(log)
	}
	w, err := warmer.New(warmer.Options{
		Store:   &store.RedisStore{Client: env.Client},
		Sources: map[string]warmer.Source{"o": src}, Specs: []*warmer.Spec{spec},
		MaxConcurrentLoads: 1, Registerer: reg, Logger: logger, Now: now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return w, reg
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

// A run writes the members written longest ago first (never written before
// all), not in member order: when capacity is short, the keys closest to
// expiry are the ones refreshed.
func TestRefreshWritesOldestFirst(t *testing.T) {
	env := testenv.Redis(t)
	spec := family(t, env.Prefix, "old", 0)
	spec.Members = []string{"a", "b", "c", "d", "e"}
	spec.BatchSize = 1
	src := &recorder{}
	clk := &clock{t: time.Now()}
	w, _ := serialWarmer(t, env, src, clk.Now, nil, spec)
	ctx := context.Background()
	if _, err := w.Refresh(ctx, "old", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, want := src.order(), []string{"a", "b", "c", "d", "e"}; !slices.Equal(got, want) {
		t.Fatalf("first run (nothing written yet) loaded %v, want member order %v", got, want)
	}
	// b, then a, are written again later than the others (an admin refresh,
	// a change notification).
	clk.Add(time.Second)
	if _, err := w.RefreshMembers(ctx, "old", []string{"b"}); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Second)
	if _, err := w.RefreshMembers(ctx, "old", []string{"a"}); err != nil {
		t.Fatal(err)
	}
	src.order()
	clk.Add(time.Second)
	if _, err := w.Refresh(ctx, "old", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, want := src.order(), []string{"c", "d", "e", "b", "a"}; !slices.Equal(got, want) {
		t.Errorf("second run loaded %v, want oldest write first %v", got, want)
	}
}
