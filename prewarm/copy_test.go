package prewarm_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/prewarmtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/prewarm"
	"github.com/hearth-dev/hearth/store"
)

// TestCopyScanPatternEscaped: the source SCAN's MATCH pattern takes a
// template's literal parts literally: a prefix holding glob characters
// matches only itself.
func TestCopyScanPatternEscaped(t *testing.T) {
	env := testenv.Redis(t)
	ctx := context.Background()
	p := env.Prefix
	for _, k := range []string{p + "g[1]*?:5", p + "g1x:5", p + "gX*?:5", p + `g\[1]*?:5`} {
		if err := env.Client.Set(ctx, k, "v", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	it := env.Client.Scan(ctx, 0, prewarm.GlobEscape(p+"g[1]*?:")+"*", 1000).Iterator()
	for it.Next(ctx) {
		got = append(got, it.Val())
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != p+"g[1]*?:5" {
		t.Errorf("escaped pattern matched %q, want only %q", got, p+"g[1]*?:5")
	}
}

// TestCopyNeverOutlivesItsSource: a copy from another Redis whose write is
// held up far longer than the read took still expires no later than its
// source: the time the write took beyond what the TTL allowed for is taken
// off each copy afterwards, counted from the copy's own expiry.
func TestCopyNeverOutlivesItsSource(t *testing.T) {
	blue := testenv.Redis(t)
	green := testenv.PrivateRedis(t).Client(t)
	ctx := context.Background()
	w, tpl := familyWarmer(t, green, staticSource(), blue.Prefix+"c:{id}", 10)
	var keys keyList
	for i := range 30 {
		k := tpl.Key(strconv.Itoa(i + 1))
		keys = append(keys, k)
		if err := blue.Client.Set(ctx, k, "blue:"+k, 20*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	target := prewarm.NewStore(prewarm.StoreOptions{Client: green, Namespace: blue.Prefix + "ns"})
	if _, err := target.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	// Three batches in turn, each write held up longer than the last, so
	// that each is slower than any before it.
	delays := []time.Duration{60 * time.Millisecond, 120 * time.Millisecond, 180 * time.Millisecond}
	var n atomic.Int32
	slow := &slowByBatch{Store: target, delay: func() time.Duration { return delays[min(int(n.Add(1))-1, len(delays)-1)] }}
	pw := prewarm.New(w, prometheus.NewRegistry(), zerolog.Nop())
	rep, err := pw.Run(ctx, prewarm.Options{AccessLog: keys, TopN: len(keys), Window: time.Hour, Concurrency: 1, Reason: "test",
		Copy: &prewarm.CopySource{Client: blue.Client, Name: "blue", Target: slow, FromOnly: true}})
	if err != nil || rep.Copied != len(keys) {
		t.Fatalf("copy: %v, %d copied, want %d", err, rep.Copied, len(keys))
	}
	for _, k := range keys {
		if err := prewarmtest.NoLaterExpiry(ctx, green, blue.Client, k); err != nil {
			t.Error(err)
		}
		if v := green.Get(ctx, k).Val(); v != "blue:"+k {
			t.Errorf("green %s = %q, want blue's value", k, v)
		}
	}
}

// slowByBatch holds up each write by delay(), asked once per write.
type slowByBatch struct {
	*prewarm.Store
	delay func() time.Duration
}

func (s *slowByBatch) SetEach(ctx context.Context, entries []store.Entry) ([]store.SetOutcome, error) {
	time.Sleep(s.delay())
	return s.Store.SetEach(ctx, entries)
}

// TestCopySkipsKeysAboutToExpire: a source key with less time left than the
// copy's write is allowed (here: less than the slowest write so far, 2 s)
// is not copied with a TTL raised to a floor, which would outlive it: it is
// as good as expired, and counted missing from the source. The keys with
// time to spare are copied, each expiring no later than its source.
func TestCopySkipsKeysAboutToExpire(t *testing.T) {
	blue := testenv.Redis(t)
	green := testenv.PrivateRedis(t).Client(t)
	ctx := context.Background()
	w, tpl := familyWarmer(t, green, staticSource(), blue.Prefix+"x:{id}", 10)
	var keys keyList
	for i := range 20 {
		k := tpl.Key(strconv.Itoa(i + 1))
		keys = append(keys, k)
		ttl := 20 * time.Second
		if i >= 10 {
			ttl = 4 * time.Second // read about 2 s from now, with 2 s left: less than the write is allowed
		}
		if err := blue.Client.Set(ctx, k, "blue:"+k, ttl).Err(); err != nil {
			t.Fatal(err)
		}
	}
	target := prewarm.NewStore(prewarm.StoreOptions{Client: green, Namespace: blue.Prefix + "ns"})
	if _, err := target.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	slow := &slowByBatch{Store: target, delay: func() time.Duration {
		if n.Add(1) == 1 {
			return 2 * time.Second // the first batch's write: the slowest so far for the second
		}
		return 0
	}}
	pw := prewarm.New(w, prometheus.NewRegistry(), zerolog.Nop())
	rep, err := pw.Run(ctx, prewarm.Options{AccessLog: keys, TopN: len(keys), Window: time.Hour, Concurrency: 1, Reason: "test",
		Copy: &prewarm.CopySource{Client: blue.Client, Name: "blue", Target: slow, FromOnly: true}})
	if rep.Copied != 10 || rep.SourceMissing != 10 {
		t.Errorf("copied %d, missing from the source %d (err %v), want 10 and 10", rep.Copied, rep.SourceMissing, err)
	}
	for i, k := range keys {
		if i < 10 {
			if err := prewarmtest.NoLaterExpiry(ctx, green, blue.Client, k); err != nil {
				t.Error(err)
			}
			continue
		}
		if n := green.Exists(ctx, k).Val(); n != 0 {
			t.Errorf("green holds %s (PTTL %s), copied from a source key about to expire", k, green.PTTL(ctx, k).Val())
		}
	}
}
