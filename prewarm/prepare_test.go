package prewarm_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/prewarm"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// TestPrewarmPreparesTheOriginFirst: a pre-warm has its origin open the
// connections its loads will use while it reads the access log, once, for as
// many loads as it runs at once, before the first load starts; a copy from
// another Redis leaves the origin alone (it may be down: --from-only).
func TestPrewarmPreparesTheOriginFirst(t *testing.T) {
	rd := testenv.Redis(t)
	ctx := context.Background()
	src := staticSource()
	w, tpl := familyWarmer(t, rd.Client, src, rd.Prefix+"p:{id}", 5)
	var keys keyList
	for i := range 20 {
		keys = append(keys, tpl.Key(string(rune('a'+i))))
	}
	pw := prewarm.New(w, prometheus.NewRegistry(), zerolog.Nop())
	rep, err := pw.Run(ctx, prewarm.Options{AccessLog: keys, TopN: 20, Window: time.Hour, Concurrency: 3, Reason: "test"})
	if err != nil || rep.Written != 20 {
		t.Fatalf("pre-warm: %v, %d written, want 20", err, rep.Written)
	}
	ns, before := src.Prepared()
	if !slices.Equal(ns, []int{3}) || !slices.Equal(before, []int{0}) {
		t.Errorf("origin prepared for %v loads with %v loads already started, want once for 3 before any", ns, before)
	}

	target := prewarm.NewStore(prewarm.StoreOptions{Client: rd.Client, Namespace: rd.Prefix + "ns"})
	if _, err := target.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	rep, err = pw.Run(ctx, prewarm.Options{AccessLog: keys, TopN: 20, Window: time.Hour, Concurrency: 3, Reason: "test",
		Copy: &prewarm.CopySource{Client: rd.Client, Name: "blue", Target: target, FromOnly: true}})
	if err != nil || rep.Present != 20 {
		t.Fatalf("copy: %v, %d present, want 20 (copied onto themselves, left alone)", err, rep.Present)
	}
	if ns, _ := src.Prepared(); len(ns) != 1 {
		t.Errorf("a copy prepared the origin: %v", ns)
	}
}

// familyWarmer is an engine with one family, template key, loaded from src
// (source "s") in batches of batch, writing to rdb.
func familyWarmer(t *testing.T, rdb *redis.Client, src warmer.Source, key string, batch int) (*warmer.Warmer, keytmpl.Template) {
	t.Helper()
	tpl, err := keytmpl.Parse(key)
	if err != nil {
		t.Fatal(err)
	}
	spec := &warmer.Spec{Name: "f", Template: tpl, Source: "s", TTL: time.Minute, Interval: 30 * time.Second,
		LoadTimeout: time.Second, MaxMembers: 100, BatchSize: batch, NegativeTTL: time.Second, MaxValueBytes: 1 << 10}
	w, err := warmer.New(warmer.Options{
		Store: &store.RedisStore{Client: rdb}, Sources: map[string]warmer.Source{"s": src},
		Specs: []*warmer.Spec{spec}, MaxConcurrentLoads: 8, Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return w, tpl
}
