package prewarm_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
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
	// Three batches in turn, each write held up longer than the last, so
	// that each is slower than any before it.
	delays := []time.Duration{60 * time.Millisecond, 120 * time.Millisecond, 180 * time.Millisecond}
	c := copyThroughSlowWrites(t, 30, func(int) time.Duration { return 20 * time.Second }, func(batch int) time.Duration { return delays[min(batch, len(delays)-1)] })
	if c.err != nil || c.rep.Copied != len(c.keys) {
		t.Fatalf("copy: %v, %d copied, want %d", c.err, c.rep.Copied, len(c.keys))
	}
	ctx := context.Background()
	for _, k := range c.keys {
		if err := prewarmtest.NoLaterExpiry(ctx, c.green, c.blue, k); err != nil {
			t.Error(err)
		}
		if v := c.green.Get(ctx, k).Val(); v != "blue:"+k {
			t.Errorf("green %s = %q, want blue's value", k, v)
		}
	}
}

// TestCopySkipsKeysAboutToExpire: a source key with less time left than the
// copy's write is allowed (here: less than the slowest write so far, 2 s)
// is not copied with a TTL raised to a floor, which would outlive it: it is
// as good as expired, and counted missing from the source. The keys with
// time to spare are copied, each expiring no later than its source.
func TestCopySkipsKeysAboutToExpire(t *testing.T) {
	c := copyThroughSlowWrites(t, 20,
		func(i int) time.Duration {
			if i >= 10 {
				return 4 * time.Second // read about 2 s from now, with 2 s left: less than the write is allowed
			}
			return 20 * time.Second
		},
		func(batch int) time.Duration {
			if batch == 0 {
				return 2 * time.Second // the first batch's write: the slowest so far for the second
			}
			return 0
		})
	if c.rep.Copied != 10 || c.rep.SourceMissing != 10 {
		t.Errorf("copied %d, missing from the source %d (err %v), want 10 and 10", c.rep.Copied, c.rep.SourceMissing, c.err)
	}
	ctx := context.Background()
	for i, k := range c.keys {
		if i < 10 {
			if err := prewarmtest.NoLaterExpiry(ctx, c.green, c.blue, k); err != nil {
				t.Error(err)
			}
			continue
		}
		if n := c.green.Exists(ctx, k).Val(); n != 0 {
			t.Errorf("green holds %s (PTTL %s), copied from a source key about to expire", k, c.green.PTTL(ctx, k).Val())
		}
	}
}

// copyRun is what copyThroughSlowWrites did.
type copyRun struct {
	rep         prewarm.Report
	err         error
	blue, green *redis.Client
	keys        keyList
}

// copyThroughSlowWrites sets n keys in blue (the shared Redis), key i with
// TTL ttl(i), and copies them --from-only to green (a private Redis) in
// batches of 10, one batch at a time, each batch's write held up by
// delay(batch) first (batch counts the writes from 0).
func copyThroughSlowWrites(t *testing.T, n int, ttl func(i int) time.Duration, delay func(batch int) time.Duration) copyRun {
	t.Helper()
	blue := testenv.Redis(t)
	green := testenv.PrivateRedis(t).Client(t)
	ctx := context.Background()
	w, tpl := familyWarmer(t, green, staticSource(), blue.Prefix+"c:{id}", 10)
	var keys keyList
	for i := range n {
		k := tpl.Key(strconv.Itoa(i + 1))
		keys = append(keys, k)
		if err := blue.Client.Set(ctx, k, "blue:"+k, ttl(i)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	target := prewarm.NewStore(prewarm.StoreOptions{Client: green, Namespace: blue.Prefix + "ns"})
	if _, err := target.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	var batches atomic.Int32
	slow := &slowByBatch{Store: target, delay: func() time.Duration { return delay(int(batches.Add(1)) - 1) }}
	pw := prewarm.New(w, prometheus.NewRegistry(), zerolog.Nop())
	rep, err := pw.Run(ctx, prewarm.Options{AccessLog: keys, TopN: len(keys), Window: time.Hour, Concurrency: 1, Reason: "test",
		Copy: &prewarm.CopySource{Client: blue.Client, Name: "blue", Target: slow, FromOnly: true}})
	return copyRun{rep: rep, err: err, blue: blue.Client, green: green, keys: keys}
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
