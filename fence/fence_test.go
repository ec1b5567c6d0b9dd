package fence_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/internal/leadertest"
	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/store"
)

func TestFencedStore(t *testing.T) {
	for _, perSlot := range []bool{false, true} {
		t.Run(fmt.Sprintf("per slot %v", perSlot), func(t *testing.T) {
			testFencing(t, perSlot)
		})
	}
}

// testFencing plays Kleppmann's scenario: a leader is admitted to write, pauses
// past its lease, a new leader takes over and writes; the old leader's write
// arrives afterwards and must be refused by Redis.
func testFencing(t *testing.T, perSlot bool) {
	ctx := context.Background()
	env := leadertest.New(t)
	// Long leases: a must not notice by renewing that its lease is gone; only
	// the fence tells it.
	a := env.Instance(30*time.Second, 20*time.Millisecond, perSlot)
	b := env.Instance(30*time.Second, 20*time.Millisecond, perSlot)
	key, other := env.Prefix+"product:1", env.Prefix+"product:2"

	ta := leadertest.Campaign(t, a.Lease, 5*time.Second)
	aw, err := a.Gate().Admit(ctx)
	if err != nil {
		t.Fatalf("admit leader: %v", err)
	}
	if err := aw.Set(ctx, []store.Entry{{Key: key, Value: []byte("a1"), TTL: time.Minute}}); err != nil {
		t.Fatalf("leader write: %v", err)
	}

	// a's lease vanishes behind its back (its pause outlasted the lease);
	// b takes over. a still holds actx, admitted before the pause.
	env.Client.Del(ctx, env.NS+":{lease}")
	tb := leadertest.Campaign(t, b.Lease, 5*time.Second)
	if tb.Epoch <= ta.Epoch {
		t.Fatalf("epoch %d after %d", tb.Epoch, ta.Epoch)
	}
	bw, err := b.Gate().Admit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := bw.Set(ctx, []store.Entry{{Key: key, Value: []byte("b1"), TTL: time.Minute}}); err != nil {
		t.Fatalf("new leader write: %v", err)
	}

	t.Run("old leader's write is refused", func(t *testing.T) {
		// other is a key b never wrote: the fence raised at takeover guards it.
		err := aw.Set(ctx, []store.Entry{{Key: key, Value: []byte("a2"), TTL: time.Minute}, {Key: other, Value: []byte("a2"), TTL: time.Minute}})
		if !errors.Is(err, leader.ErrFenced) {
			t.Fatalf("stale write: err = %v, want ErrFenced", err)
		}
		if got, want := env.Client.Get(ctx, key).Val(), "b1"; got != want {
			t.Errorf("%s = %q, want the new leader's %q", key, got, want)
		}
		if n := env.Client.Exists(ctx, other).Val(); n != 0 {
			t.Errorf("%s written by the fenced leader", other)
		}
		if got, want := promtest.Value(t, a.Reg, "hearth_fenced_writes_total", "op", "set"), 2.0; got != want {
			t.Errorf("hearth_fenced_writes_total = %g, want %g", got, want)
		}
		if !errors.Is(ta.Err(), leader.ErrFenced) {
			t.Errorf("old term ended with %v, want ErrFenced", ta.Err())
		}
	})

	t.Run("old leader's stale extension is refused", func(t *testing.T) {
		before := env.Client.PTTL(ctx, key).Val()
		_, err := aw.Extend(ctx, []string{key}, []time.Duration{time.Hour})
		if !errors.Is(err, leader.ErrFenced) {
			t.Fatalf("stale extend: err = %v, want ErrFenced", err)
		}
		if after := env.Client.PTTL(ctx, key).Val(); after > before {
			t.Errorf("ttl extended from %s to %s by the fenced leader", before, after)
		}
	})

	t.Run("new leader extends", func(t *testing.T) {
		kept, err := bw.Extend(ctx, []string{key, other}, []time.Duration{time.Hour, time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if !kept[0] || kept[1] {
			t.Errorf("kept = %v, want [true false]", kept)
		}
		if ttl := env.Client.PTTL(ctx, key).Val(); ttl <= time.Minute {
			t.Errorf("ttl %s not extended", ttl)
		}
	})

	t.Run("a write without a term is refused before it is sent", func(t *testing.T) {
		err := b.Store.Set(ctx, []store.Entry{{Key: other, Value: []byte("x"), TTL: time.Minute}})
		if !errors.Is(err, leader.ErrNotLeader) {
			t.Fatalf("err = %v, want ErrNotLeader", err)
		}
		if n := env.Client.Exists(ctx, other).Val(); n != 0 {
			t.Errorf("%s written without a term", other)
		}
	})
	_ = tb.Release(ctx)
}

func TestFencingSurvivesRedisRestart(t *testing.T) {
	ctx := context.Background()
	srv := testenv.PrivateRedis(t)
	client := srv.Client(t)
	newInstance := func() (*leader.Lease, *fence.FencedStore) {
		store := fence.NewFencedStore(fence.FencedStoreOptions{Client: client, Namespace: "hearth"})
		l, err := leader.NewLease(leader.LeaseOptions{Client: client, Namespace: "hearth", Duration: time.Second, RetryPeriod: 20 * time.Millisecond, Fence: store, Registerer: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		return l, store
	}
	a, astore := newInstance()
	b, bstore := newInstance()
	ta := leadertest.Campaign(t, a, 5*time.Second)
	aw := astore.Writer(ta)
	if err := aw.Set(ctx, []store.Entry{{Key: "k", Value: []byte("a"), TTL: time.Minute}}); err != nil {
		t.Fatal(err)
	}

	// Redis comes back empty: no lease, no epoch counter, no fence, no scripts.
	srv.Restart(t)
	leadertest.WaitDone(t, ta, 5*time.Second)
	tb := leadertest.Campaign(t, b, 5*time.Second)
	if tb.Epoch <= ta.Epoch {
		t.Fatalf("epoch went back from %d to %d after the restart", ta.Epoch, tb.Epoch)
	}
	bw := bstore.Writer(tb)
	if err := bw.Set(ctx, []store.Entry{{Key: "k", Value: []byte("b"), TTL: time.Minute}}); err != nil {
		t.Fatalf("write after restart (EVALSHA falls back to EVAL): %v", err)
	}
	if err := aw.Set(ctx, []store.Entry{{Key: "k", Value: []byte("a-stale"), TTL: time.Minute}}); !errors.Is(err, leader.ErrFenced) {
		t.Fatalf("old leader after restart: err = %v, want ErrFenced", err)
	}
	if got := client.Get(ctx, "k").Val(); got != "b" {
		t.Errorf("k = %q, want %q", got, "b")
	}
}

// TestFencedWriteOfManyKeys: a write of more keys than one script call
// carries (single fence key) lands every key with its own value and TTL for
// the leader, and is refused key for key, none written, for a leader an
// election passed by; a fenced key answer counts every refused key.
func TestFencedWriteOfManyKeys(t *testing.T) {
	ctx := context.Background()
	env := leadertest.New(t)
	a := env.Instance(30*time.Second, 20*time.Millisecond, false)
	b := env.Instance(30*time.Second, 20*time.Millisecond, false)
	const n = 600 // three calls: 256 + 256 + 88
	entries := func(tag string) []store.Entry {
		out := make([]store.Entry, n)
		for i := range out {
			out[i] = store.Entry{Key: fmt.Sprintf("%smany:%d", env.Prefix, i), Value: []byte(tag + strconv.Itoa(i)),
				TTL: time.Minute + time.Duration(i)*time.Second}
		}
		return out
	}
	check := func(tag string) {
		t.Helper()
		for i, e := range entries(tag) {
			if got := env.Client.Get(ctx, e.Key).Val(); got != string(e.Value) {
				t.Fatalf("%s = %q, want %q", e.Key, got, e.Value)
			}
			if ttl := env.Client.PTTL(ctx, e.Key).Val(); ttl > e.TTL || ttl < e.TTL-10*time.Second {
				t.Fatalf("key %d: ttl %s, want about %s", i, ttl, e.TTL)
			}
		}
	}
	leadertest.Campaign(t, a.Lease, 5*time.Second)
	aw, err := a.Gate().Admit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := aw.Set(ctx, entries("a")); err != nil {
		t.Fatalf("leader write: %v", err)
	}
	check("a")

	env.Client.Del(ctx, env.NS+":{lease}")
	leadertest.Campaign(t, b.Lease, 5*time.Second)
	err = aw.Set(ctx, entries("stale"))
	if !errors.Is(err, leader.ErrFenced) {
		t.Fatalf("old leader's write: err = %v, want ErrFenced", err)
	}
	check("a")
	if got := promtest.Value(t, a.Reg, "hearth_fenced_writes_total", "op", "set"); got != n {
		t.Errorf("hearth_fenced_writes_total = %g, want %d", got, n)
	}
	bw, err := b.Gate().Admit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := bw.Set(ctx, entries("b")); err != nil {
		t.Fatalf("new leader write: %v", err)
	}
	check("b")
}
