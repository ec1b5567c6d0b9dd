package rewarm_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/rewarm"
	"github.com/hearth-dev/hearth/store"
)

// TestRewarmCoalesced: a second flush within the minimum gap after a re-warm
// is counted as suppressed, not re-warmed at once, and not lost: one re-warm
// runs once the gap has passed.
func TestRewarmCoalesced(t *testing.T) {
	const gap = 5 * time.Second
	_, e, rw := newRewarmEnvWith(t, func(o *rewarm.Options) { o.MinGap = gap })
	ctx := context.Background()
	run(t, rw)
	if err := e.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	waitWarm(t, e, 10*time.Second)
	if got := promtest.Value(t, e.reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Flush); got != 1 {
		t.Fatalf("rewarms{flush} after the first flush = %g, want 1", got)
	}
	if err := e.rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, gap, "the second flush counted as suppressed", func() bool {
		return promtest.Value(t, e.reg, "hearth_prewarm_rewarms_suppressed_total", "reason", rewarm.Flush) >= 1
	})
	if got := promtest.Value(t, e.reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Flush); got != 1 {
		t.Errorf("rewarms{flush} within the gap = %g, want 1 (suppressed)", got)
	}
	// Not lost: re-warmed once the gap has passed.
	testenv.Eventually(t, gap+10*time.Second, "the suppressed flush re-warmed after the gap", func() bool {
		return promtest.Value(t, e.reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Flush) == 2
	})
	waitWarm(t, e, 10*time.Second)
}

// TestRewarmDELLoop: a loop deleting the marker cannot trigger more than one
// full re-warm per minimum gap.
func TestRewarmDELLoop(t *testing.T) {
	const gap = time.Second
	_, e, rw := newRewarmEnvWith(t, func(o *rewarm.Options) {
		o.MinGap, o.Interval = gap, 20*time.Millisecond
	})
	ctx := context.Background()
	run(t, rw)
	marker := store.MarkerKey(rewarmNS)
	start := time.Now()
	for time.Since(start) < 3*gap {
		e.rdb.Del(ctx, marker)
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	got := promtest.Value(t, e.reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Flush)
	if limit := float64(elapsed/gap) + 2; got > limit {
		t.Errorf("%g full re-warms in %s of DEL %s, want ≤ %g (one per %s gap)", got, elapsed, marker, limit, gap)
	}
	if got < 1 {
		t.Errorf("no re-warm during a DEL loop of %s", elapsed)
	}
	if n := promtest.Value(t, e.reg, "hearth_prewarm_rewarms_suppressed_total", "reason", rewarm.Flush); n < 1 {
		t.Errorf("suppressed re-warms = %g, want ≥ 1", n)
	}
	t.Logf("%g re-warms in %s of DEL loop", got, elapsed)
}

// TestRewarmForeignMarker: a marker holding something Hearth never writes is
// treated as absent (a re-warm), repaired to a valid marker without TTL,
// logged with the key and what was found, and counted.
func TestRewarmForeignMarker(t *testing.T) {
	logs := &testenv.SyncBuffer{}
	_, e, rw := newRewarmEnvWith(t, func(o *rewarm.Options) {
		o.MinGap, o.Logger = time.Nanosecond, zerolog.New(logs)
	})
	ctx := context.Background()
	marker := store.MarkerKey(rewarmNS)
	if reason, err := rw.CheckOnce(ctx); err != nil || reason != "" {
		t.Fatalf("baseline = %q, %v", reason, err)
	}
	future := strconv.FormatInt(time.Now().Add(24*time.Hour).Unix(), 10)
	for i, tc := range []struct {
		name, found string
		do          func(c *redis.Client, key string) error
	}{
		{"garbage", "garbage", testenv.PutString("garbage")},
		{"nan", "nan", testenv.PutString("nan")},
		{"negative", "-1", testenv.PutString("-1")},
		{"far future", future, testenv.PutString(future)},
		{"huge", "99999999999999999999", testenv.PutString("99999999999999999999")},
		{"list", "wrong type: list", testenv.PutList},
		{"ttl set", "ttl set: 1700000000", func(c *redis.Client, key string) error {
			return c.Set(ctx, key, "1700000000", time.Hour).Err()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.do(e.rdb, marker); err != nil {
				t.Fatal(err)
			}
			reason, err := rw.CheckOnce(ctx)
			if err != nil || reason != rewarm.Flush {
				t.Errorf("check over a foreign marker = %q, %v; want a re-warm for %q", reason, err, rewarm.Flush)
			}
			if got, want := promtest.Value(t, e.reg, "hearth_state_repairs_total", "key", "marker"), float64(i+1); got != want {
				t.Errorf("repairs{marker} = %g, want %g", got, want)
			}
			v, err := e.rdb.Get(ctx, marker).Result()
			if _, perr := strconv.ParseUint(v, 10, 64); err != nil || perr != nil {
				t.Errorf("marker after the repair = %q, %v; want unix seconds", v, err)
			}
			if ttl := e.rdb.PTTL(ctx, marker).Val(); ttl != -1 {
				t.Errorf("marker ttl after the repair = %s, want none", ttl)
			}
			if l := logs.String(); !strings.Contains(l, `"key":"`+marker+`"`) || !strings.Contains(l, tc.found) {
				t.Errorf("no repair log naming %s and %q in:\n%s", marker, tc.found, l)
			}
			// The repaired marker is valid: the next check finds nothing.
			if reason, err := rw.CheckOnce(ctx); err != nil || reason != "" {
				t.Errorf("check after the repair = %q, %v; want none", reason, err)
			}
		})
	}
}
