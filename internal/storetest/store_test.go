package storetest_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hearth-dev/hearth/internal/storetest"
	"github.com/hearth-dev/hearth/store"
)

// The fake passes the suite every Store passes (the RedisStore's run is in
// warmer/store_conformance_test.go).
func TestFakeConformance(t *testing.T) {
	st := storetest.New()
	storetest.Run(t, st, "c:", func(t *testing.T, key string) ([]byte, time.Duration, bool) {
		v, ok := st.Get(key)
		ttl, _ := st.TTL(key)
		return v, ttl, ok
	})
}

// Keys expire on the clock of the bubble they are used in, as Redis's do on
// its own: a test of TTL-driven logic waits for nothing.
func TestFakeExpiresOnFakeTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := storetest.New()
		ctx := context.Background()
		if err := st.Set(ctx, []store.Entry{{Key: "k", Value: []byte("v"), TTL: time.Hour}, {Key: "p", Value: []byte("v")}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(59 * time.Minute)
		if _, ok := st.Get("k"); !ok {
			t.Fatal("k gone before its TTL ran out")
		}
		if kept, err := st.Extend(ctx, []string{"k", "p"}, []time.Duration{time.Hour, time.Hour}); err != nil || !kept[0] || !kept[1] {
			t.Fatalf("Extend = %v, %v; want both kept", kept, err)
		}
		if ttl, _ := st.TTL("p"); ttl != 0 {
			t.Errorf("a key without expiry got one from Extend (GT never adds one): %v", ttl)
		}
		time.Sleep(59 * time.Minute)
		if _, ok := st.Get("k"); !ok {
			t.Fatal("k gone before its extended TTL ran out")
		}
		time.Sleep(2 * time.Minute)
		if _, ok := st.Get("k"); ok {
			t.Error("k still there after its extended TTL ran out")
		}
		if kept, _ := st.Extend(ctx, []string{"k"}, []time.Duration{time.Hour}); kept[0] {
			t.Error("Extend kept an expired key")
		}
		if got := st.Keys(); len(got) != 1 || got[0] != "p" {
			t.Errorf("Keys = %v, want [p]", got)
		}
	})
}

// A failing store writes nothing and says so; it recovers when told.
func TestFakeFail(t *testing.T) {
	st := storetest.New()
	ctx := context.Background()
	down := errors.New("connection refused")
	st.Fail(down)
	if err := st.Set(ctx, []store.Entry{{Key: "k", Value: []byte("v"), TTL: time.Minute}}); !errors.Is(err, down) {
		t.Fatalf("Set while failing = %v, want %v", err, down)
	}
	if _, err := st.Extend(ctx, []string{"k"}, []time.Duration{time.Minute}); !errors.Is(err, down) {
		t.Fatalf("Extend while failing = %v, want %v", err, down)
	}
	if len(st.Writes()) != 0 || len(st.Keys()) != 0 {
		t.Fatalf("a failing store wrote %v", st.Writes())
	}
	st.Fail(nil)
	if err := st.Set(ctx, []store.Entry{{Key: "k", Value: []byte("v"), TTL: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	if w := st.Writes(); len(w) != 1 || w[0].Key != "k" || w[0].TTL != time.Minute {
		t.Errorf("Writes = %v, want the one write", w)
	}
}
