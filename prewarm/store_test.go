package prewarm_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/prewarm"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

func entries(prefix, value string, keys ...string) []store.Entry {
	out := make([]store.Entry, len(keys))
	for i, k := range keys {
		out[i] = store.Entry{Key: prefix + k, Value: []byte(value), TTL: time.Minute}
	}
	return out
}

// TestPrewarmStoreFillsAbsentOnly: without a leader in that Redis, a present
// value (fresher than the pre-warm's) is never replaced unless Overwrite; an
// absent key is filled with a TTL.
func TestPrewarmStoreFillsAbsentOnly(t *testing.T) {
	rd := testenv.Redis(t)
	ctx := context.Background()
	for _, perSlot := range []bool{false, true} {
		t.Run(fmt.Sprintf("per slot %v", perSlot), func(t *testing.T) {
			p := fmt.Sprintf("%sslot%v:", rd.Prefix, perSlot)
			if err := rd.Client.Set(ctx, p+"a", "fresh", time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			nx := prewarm.NewStore(prewarm.StoreOptions{Client: rd.Client, Namespace: p + "hearth", PerSlot: &perSlot})
			pf, err := nx.Prepare(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if pf.Fenced {
				t.Fatalf("Prepare = %+v in a Redis without leader state, want unfenced", pf)
			}
			res, err := nx.SetEach(ctx, entries(p, "old", "a", "b"))
			if err != nil {
				t.Fatal(err)
			}
			if got, want := fmt.Sprint(res), fmt.Sprint([]store.SetOutcome{store.SetPresent, store.SetWritten}); got != want {
				t.Errorf("outcomes %s, want %s", got, want)
			}
			if got := rd.Client.Get(ctx, p+"a").Val(); got != "fresh" {
				t.Errorf("present value replaced: %q, want fresh", got)
			}
			if got := rd.Client.Get(ctx, p+"b").Val(); got != "old" {
				t.Errorf("absent key = %q, want old", got)
			}
			if ttl := rd.Client.PTTL(ctx, p+"b").Val(); ttl <= 0 || ttl > time.Minute {
				t.Errorf("filled key's TTL %s, want (0, 1m]", ttl)
			}

			ow := prewarm.NewStore(prewarm.StoreOptions{Client: rd.Client, Namespace: p + "hearth", PerSlot: &perSlot, Overwrite: true})
			if _, err := ow.Prepare(ctx); err != nil {
				t.Fatal(err)
			}
			if err := ow.Set(ctx, entries(p, "new", "a")); err != nil {
				t.Fatal(err)
			}
			if got := rd.Client.Get(ctx, p+"a").Val(); got != "new" {
				t.Errorf("with Overwrite: %q, want new", got)
			}
		})
	}
}

// TestPrewarmStoreFencedByLeader: with a Hearth leader running against the
// Redis, the pre-warm's writes carry the newest epoch and go through the
// fence: they land (set-if-absent still holds) while that leader leads, and
// once another leader has taken over, a write carrying the older epoch is
// refused by Redis, present or absent key alike.
func TestPrewarmStoreFencedByLeader(t *testing.T) {
	for _, perSlot := range []bool{false, true} {
		t.Run(fmt.Sprintf("per slot %v", perSlot), func(t *testing.T) {
			rd := testenv.Redis(t)
			ctx := context.Background()
			ns := rd.Prefix + "hearth"
			a := newLeader(t, rd.Client, ns, perSlot)
			ta, err := a.Campaign(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := rd.Client.Set(ctx, rd.Prefix+"fresh", "leader's", time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			for _, overwrite := range []bool{false, true} {
				s := prewarm.NewStore(prewarm.StoreOptions{Client: rd.Client, Namespace: ns, PerSlot: &perSlot, Overwrite: overwrite})
				pf, err := s.Prepare(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if !pf.Fenced || pf.Epoch != ta.Epoch || pf.Leader != a.ID() {
					t.Fatalf("Prepare = %+v, want fenced by epoch %d of leader %s", pf, ta.Epoch, a.ID())
				}
				res, err := s.SetEach(ctx, entries(rd.Prefix, "pre-warm", "fresh", fmt.Sprint("absent-", overwrite)))
				if err != nil {
					t.Fatal(err)
				}
				want := []store.SetOutcome{store.SetPresent, store.SetWritten}
				if overwrite {
					want[0] = store.SetWritten
				}
				if got := fmt.Sprint(res); got != fmt.Sprint(want) {
					t.Errorf("overwrite %v under leader %d: outcomes %s, want %s", overwrite, ta.Epoch, got, fmt.Sprint(want))
				}
			}
			if got := rd.Client.Get(ctx, rd.Prefix+"fresh").Val(); got != "pre-warm" {
				t.Fatalf("--overwrite under the current leader: %q, want pre-warm", got)
			}

			// The pre-warm has read epoch E; a new leader takes over.
			late := prewarm.NewStore(prewarm.StoreOptions{Client: rd.Client, Namespace: ns, PerSlot: &perSlot, Overwrite: true})
			if _, err := late.Prepare(ctx); err != nil {
				t.Fatal(err)
			}
			if err := ta.Release(ctx); err != nil {
				t.Fatal(err)
			}
			b := newLeader(t, rd.Client, ns, perSlot)
			tb, err := b.Campaign(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if tb.Epoch <= ta.Epoch {
				t.Fatalf("new epoch %d not above %d", tb.Epoch, ta.Epoch)
			}
			if err := rd.Client.Set(ctx, rd.Prefix+"fresh", "new leader's", time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			res, err := late.SetEach(ctx, entries(rd.Prefix, "late", "fresh", "gone"))
			if err != nil {
				t.Fatal(err)
			}
			if got, want := fmt.Sprint(res), fmt.Sprint([]store.SetOutcome{store.SetFenced, store.SetFenced}); got != want {
				t.Errorf("older epoch after a takeover: outcomes %s, want %s", got, want)
			}
			if got := rd.Client.Get(ctx, rd.Prefix+"fresh").Val(); got != "new leader's" {
				t.Errorf("fenced write landed: %q", got)
			}
			if n := rd.Client.Exists(ctx, rd.Prefix+"gone").Val(); n != 0 {
				t.Error("fenced write created an absent key")
			}
			if err := late.Set(ctx, entries(rd.Prefix, "late", "x")); err == nil {
				t.Error("Set of a fenced write returned no error")
			}
		})
	}
}

// TestStoreBoundToTerm: a store bound to the running term's epoch (the
// daemon's copy from another Redis; it reads no leader state) fills absent
// keys only, and once another leader has taken over its writes are refused.
func TestStoreBoundToTerm(t *testing.T) {
	rd := testenv.Redis(t)
	ctx := context.Background()
	ns := rd.Prefix + "hearth"
	a := newLeader(t, rd.Client, ns, false)
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rd.Client.Set(ctx, rd.Prefix+"fresh", "leader's", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	s := prewarm.NewStore(prewarm.StoreOptions{Client: rd.Client, Namespace: ns})
	s.Bind(ta.Epoch)
	res, err := s.SetEach(ctx, entries(rd.Prefix, "copy", "fresh", "absent"))
	if got, want := fmt.Sprint(res), fmt.Sprint([]store.SetOutcome{store.SetPresent, store.SetWritten}); err != nil || got != want {
		t.Errorf("bound to the leader's term: outcomes %s (%v), want %s", got, err, want)
	}
	if err := ta.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := newLeader(t, rd.Client, ns, false).Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	res, err = s.SetEach(ctx, entries(rd.Prefix, "copy", "later"))
	if got, want := fmt.Sprint(res), fmt.Sprint([]store.SetOutcome{store.SetFenced}); err != nil || got != want {
		t.Errorf("after a takeover: outcomes %s (%v), want %s", got, err, want)
	}
	if got := rd.Client.Get(ctx, rd.Prefix+"fresh").Val(); got != "leader's" {
		t.Errorf("a present key was overwritten: %q", got)
	}
}

// TestPrewarmStoreForeignState: Hearth's own keys are untrusted. A foreign
// epoch counter and lease are ignored (the epoch comes from what is valid); a
// fence holding NaN or a non-number counts as absent and never lets an
// older epoch compare past it; a fence without any lease or counter (the
// counter was lost) refuses the writes rather than letting them through.
func TestPrewarmStoreForeignState(t *testing.T) {
	rd := testenv.Redis(t)
	ctx := context.Background()
	ns := rd.Prefix + "hearth"
	perSlot := false
	open := func() *prewarm.Store {
		t.Helper()
		s := prewarm.NewStore(prewarm.StoreOptions{Client: rd.Client, Namespace: ns, PerSlot: &perSlot})
		if _, err := s.Prepare(ctx); err != nil {
			t.Fatal(err)
		}
		return s
	}
	set := func(k, v string) {
		t.Helper()
		if err := rd.Client.Set(ctx, k, v, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}

	// Only a fence: refused.
	set(ns+":fence", "1700000000000")
	if res, err := open().SetEach(ctx, entries(rd.Prefix, "v", "k1")); err != nil || res[0] != store.SetFenced {
		t.Errorf("fence without a counter: %v %v, want fenced", res, err)
	}
	// A foreign counter and lease: still refused, the fence is not passed.
	set(ns+":{lease}:epoch", "nan")
	set(ns+":{lease}", "9e999:x/1")
	if res, err := open().SetEach(ctx, entries(rd.Prefix, "v", "k2")); err != nil || res[0] != store.SetFenced {
		t.Errorf("foreign counter and lease: %v %v, want fenced", res, err)
	}
	// A valid counter at the fence's epoch: written.
	set(ns+":{lease}:epoch", "1700000000000")
	if res, err := open().SetEach(ctx, entries(rd.Prefix, "v", "k3")); err != nil || res[0] != store.SetWritten {
		t.Errorf("counter at the fence: %v %v, want written", res, err)
	}
	// A fence holding nan counts as absent.
	set(ns+":fence", "nan")
	if res, err := open().SetEach(ctx, entries(rd.Prefix, "v", "k4")); err != nil || res[0] != store.SetWritten {
		t.Errorf("nan fence: %v %v, want written", res, err)
	}
	if got := rd.Client.Get(ctx, ns+":fence").Val(); got != "nan" {
		t.Errorf("the pre-warm changed the fence to %q: only a leader writes it", got)
	}
	// A fence of another type counts as absent too.
	if err := rd.Client.Del(ctx, ns+":fence").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rd.Client.LPush(ctx, ns+":fence", "x").Err(); err != nil {
		t.Fatal(err)
	}
	if res, err := open().SetEach(ctx, entries(rd.Prefix, "v", "k5")); err != nil || res[0] != store.SetWritten {
		t.Errorf("list fence: %v %v, want written", res, err)
	}
}

func newLeader(t *testing.T, c *redis.Client, ns string, perSlot bool) *leader.Lease {
	t.Helper()
	store := fence.NewFencedStore(fence.FencedStoreOptions{Client: c, Namespace: ns, PerSlot: &perSlot})
	l, err := leader.NewLease(leader.LeaseOptions{Client: c, Namespace: ns, Duration: 30 * time.Second, RetryPeriod: 50 * time.Millisecond, Fence: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// TestPrewarmReportsPresent: a pre-warm through the set-if-absent store
// counts a key that already held a value as present (warm, not written,
// covered), and leaves its value; a one-shot warmer keeps no member state.
func TestPrewarmReportsPresent(t *testing.T) {
	rd := testenv.Redis(t)
	ctx := context.Background()
	tp, err := keytmpl.Parse(rd.Prefix + "p:{id}")
	if err != nil {
		t.Fatal(err)
	}
	s := &warmer.Spec{Name: "p", Template: tp, Source: "s", TTL: time.Minute, Interval: 30 * time.Second, LoadTimeout: time.Second,
		NegativeTTL: time.Second, NegativeValue: []byte{}, BatchSize: 2, MaxMembers: 100, MaxStale: time.Minute}
	if err := rd.Client.Set(ctx, rd.Prefix+"p:2", "fresher", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	for _, oneShot := range []bool{true, false} {
		reg := prometheus.NewRegistry()
		store := prewarm.NewStore(prewarm.StoreOptions{Client: rd.Client, Namespace: rd.Prefix + "hearth"})
		if _, err := store.Prepare(ctx); err != nil {
			t.Fatal(err)
		}
		w, err := warmer.New(warmer.Options{Store: store, Sources: map[string]warmer.Source{"s": staticSource()},
			Specs: []*warmer.Spec{s}, Registerer: reg, OneShot: oneShot})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := prewarm.New(w, reg, zerolog.Nop()).Run(ctx, prewarm.Options{AccessLog: keyList{rd.Prefix + "p:1", rd.Prefix + "p:2", rd.Prefix + "p:3"}, TopN: 10})
		if err != nil {
			t.Fatal(err)
		}
		wantWritten := 2
		if !oneShot {
			wantWritten = 0 // the first run filled p:1 and p:3
		}
		if rep.Wanted != 3 || rep.Written != wantWritten || rep.Present != 3-wantWritten || rep.Failed != 0 || rep.Coverage != 1 {
			t.Errorf("one-shot %v: report %+v, want wanted 3, written %d, present %d, coverage 1", oneShot, rep, wantWritten, 3-wantWritten)
		}
		if got := rd.Client.Get(ctx, rd.Prefix+"p:2").Val(); got != "fresher" {
			t.Fatalf("present value replaced: %q", got)
		}
		oneOff := promtest.Sum(t, reg, "hearth_warmer_state_members", "family", "p", "kind", "one_off")
		if oneShot && oneOff != 0 {
			t.Errorf("a one-shot warmer keeps state for %g one-off members, want 0", oneOff)
		}
		if !oneShot && oneOff != 3 {
			t.Errorf("a long-lived warmer keeps state for %g one-off members, want 3", oneOff)
		}
	}
}

// TestPrewarmStoreFindsASlotFence: on a Cluster a fence is one key per hash
// slot; one left without lease or counter (they were lost) is found among the
// 16,384 names, and the writes are fenced: refused in its slot, written in the
// others, which it does not guard. (A single node stands in for the Cluster:
// the names and the script are the same.)
func TestPrewarmStoreFindsASlotFence(t *testing.T) {
	rd := testenv.Redis(t)
	ctx := context.Background()
	ns := rd.Prefix + "hearth"
	perSlot := true
	open := func() (*prewarm.Store, prewarm.Fence) {
		t.Helper()
		s := prewarm.NewStore(prewarm.StoreOptions{Client: rd.Client, Namespace: ns, PerSlot: &perSlot, Overwrite: true})
		pf, err := s.Prepare(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s, pf
	}
	if _, pf := open(); pf.Fenced {
		t.Fatalf("no leader state at all: %+v, want unfenced", pf)
	}
	guarded, other := rd.Prefix+"a", rd.Prefix+"b"
	if slot.Of(guarded) == slot.Of(other) {
		t.Fatal("test keys share a slot")
	}
	fence := ns + ":fence:{" + slot.Tag(slot.Of(guarded)) + "}"
	if err := rd.Client.Set(ctx, fence, "1700000000000", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s, pf := open()
	if !pf.Fenced || pf.Epoch != 0 {
		t.Fatalf("a slot's fence without lease or counter: %+v, want fenced with epoch 0", pf)
	}
	res, err := s.SetEach(ctx, append(entries("", "v", guarded), entries("", "v", other)...))
	if err != nil {
		t.Fatal(err)
	}
	if res[0] != store.SetFenced || res[1] != store.SetWritten {
		t.Errorf("outcomes = %v, want fenced in the fence's slot, written in the other", res)
	}
	if n := rd.Client.Exists(ctx, guarded).Val(); n != 0 {
		t.Errorf("the key the fence guards was written")
	}
}
