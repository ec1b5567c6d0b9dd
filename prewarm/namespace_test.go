package prewarm_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/sourcetest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/prewarm"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// staticSource answers every member with "v:<member>".
func staticSource() *sourcetest.Fake {
	f := sourcetest.New("s")
	f.Answer(func(m string) (warmer.Result, bool) { return warmer.Result{Value: []byte("v:" + m)}, true })
	return f
}

type keyList []string

func (l keyList) EachTopKey(_ context.Context, _ time.Duration, n int, fn func(string)) error {
	for _, k := range l[:min(n, len(l))] {
		fn(k)
	}
	return nil
}

// TestPrewarmNeverWritesNamespaceKeys is the defence behind validation: even
// with a declaration whose template reaches into Hearth's namespace (built
// here without config, which rejects it), access-log keys naming Hearth's own
// keys are skipped, counted and never written, and the other keys still load.
func TestPrewarmNeverWritesNamespaceKeys(t *testing.T) {
	rd := testenv.Redis(t)
	ctx := context.Background()
	ns := rd.Prefix + "ns"
	spec := func(name, key string) *warmer.Spec {
		tpl, err := keytmpl.Parse(key)
		if err != nil {
			t.Fatal(err)
		}
		return &warmer.Spec{Name: name, Template: tpl.WithNamespace(ns), Source: "s", TTL: time.Minute,
			Interval: 30 * time.Second, LoadTimeout: time.Second, Members: []string{"seed"}, MaxMembers: 100,
			BatchSize: 10, NegativeTTL: time.Second, MaxValueBytes: 1 << 10}
	}
	reg := prometheus.NewRegistry()
	w, err := warmer.New(warmer.Options{
		Store: &store.RedisStore{Client: rd.Client}, Sources: map[string]warmer.Source{"s": staticSource()},
		Specs:              []*warmer.Spec{spec("inside", ns+"{id}"), spec("app", rd.Prefix+"app:{id}")},
		MaxConcurrentLoads: 4, Registerer: reg, Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	log := keyList{ns + ":warm", ns + ":fence", ns, ns + ":access:1700000000", rd.Prefix + "app:1", rd.Prefix + "app:2"}
	rep, err := prewarm.New(w, reg, zerolog.Nop()).Run(ctx, prewarm.Options{AccessLog: log, TopN: 100, Window: time.Hour, Concurrency: 2, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rep.Skipped[prewarm.SkipNamespace], 4; got != want {
		t.Errorf("skipped[namespace] = %d, want %d: %v", got, want, rep.Skipped)
	}
	if got := promtest.Value(t, reg, "hearth_prewarm_keys_total", "outcome", "skipped_"+prewarm.SkipNamespace); got != 4 {
		t.Errorf("hearth_prewarm_keys_total{outcome=skipped_namespace} = %g, want 4", got)
	}
	for _, k := range log[:4] {
		if n := rd.Client.Exists(ctx, k).Val(); n != 0 {
			t.Errorf("%s was written: Hearth's own key overwritten from the access log", k)
		}
	}
	var written []string
	for _, k := range []string{rd.Prefix + "app:1", rd.Prefix + "app:2"} {
		if rd.Client.Get(ctx, k).Val() != "" {
			written = append(written, k)
		}
	}
	if !slices.Equal(written, []string(log[4:])) {
		t.Errorf("application keys written = %q, want %q", written, log[4:])
	}
}
