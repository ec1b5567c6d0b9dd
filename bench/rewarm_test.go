package bench_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/warmer"
)

// rewarmKeys and rewarmTrials: the issue's "re-warm after FLUSHDB of 1,000
// declared keys, p50/max of 5 trials".
const (
	rewarmKeys   = 1000
	rewarmTrials = 5
)

// BenchmarkRewarmAfterFlush prints how long 1,000 declared keys stay gone
// after a FLUSHDB of a private Redis, measured by a separate client polling
// them (pipelined EXISTS), with the push watch (client tracking) and with the
// default 2s poll alone, 5 trials each, p50 and max, in one run.
func BenchmarkRewarmAfterFlush(b *testing.B) {
	pg := testenv.Postgres(b)
	srv := testenv.PrivateRedis(b)
	rdb := srv.Client(b)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE items (id text PRIMARY KEY, v text NOT NULL);
		INSERT INTO items SELECT i::text, repeat(md5(i::text), 16) FROM generate_series(1, %d) i`, rewarmKeys)); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, rewarmKeys)
	for i := range keys {
		keys[i] = "item:" + strconv.Itoa(i+1)
	}
	trial := func(push bool) []time.Duration {
		b.Helper()
		w, reg := familyWarmer(b, rdb, pg.DSN, "item:{id}")
		if err := w.RefreshAll(ctx); err != nil {
			b.Fatal(err)
		}
		rw, err := warmer.NewRewarmer(warmer.RewarmOptions{Client: rdb, Namespace: "bench-flush", Interval: 2 * time.Second,
			MinGap: time.Millisecond, NoPush: !push, Warmer: w, Registerer: reg})
		if err != nil {
			b.Fatal(err)
		}
		if err := rw.Open(ctx); err != nil {
			b.Fatal(err)
		}
		defer rw.Close(ctx)
		var out []time.Duration
		for range rewarmTrials {
			if push {
				testenv.Eventually(b, 10*time.Second, "the push watch tracks the marker", func() bool {
					return trackingOn(b, rdb)
				})
			}
			// Start each trial at a random phase of the poll.
			time.Sleep(time.Duration(len(out)*397%2000) * time.Millisecond)
			t0 := time.Now()
			if err := rdb.FlushDB(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			waitAll(b, rdb, keys, t0)
			out = append(out, time.Since(t0))
		}
		return out
	}
	for b.Loop() {
		push, poll := trial(true), trial(false)
		p50 := func(d []time.Duration) time.Duration { s := slices.Clone(d); slices.Sort(s); return s[len(s)/2] }
		fmt.Printf("\nre-warm after FLUSHDB of %d declared keys (private Redis, %d trials; flush -> every key back, seen by another client)\n", rewarmKeys, rewarmTrials)
		fmt.Printf("  push (client tracking)  p50 %8s  max %8s\n", p50(push).Round(time.Millisecond), slices.Max(push).Round(time.Millisecond))
		fmt.Printf("  poll (rewarm_check 2s)  p50 %8s  max %8s\n\n", p50(poll).Round(time.Millisecond), slices.Max(poll).Round(time.Millisecond))
		b.ReportMetric(p50(push).Seconds()*1000, "push-p50-ms")
		b.ReportMetric(slices.Max(push).Seconds()*1000, "push-max-ms")
		b.ReportMetric(p50(poll).Seconds()*1000, "poll-p50-ms")
	}
}

func trackingOn(b *testing.B, rdb *redis.Client) bool {
	list, err := rdb.ClientList(context.Background()).Result()
	if err != nil {
		b.Fatal(err)
	}
	return containsFlag(list, 't')
}

func containsFlag(list string, f byte) bool {
	for i := 0; i+6 < len(list); i++ {
		if list[i:i+6] != "flags=" {
			continue
		}
		for j := i + 6; j < len(list) && list[j] != ' '; j++ {
			if list[j] == f {
				return true
			}
		}
	}
	return false
}

// waitAll polls until every key exists.
func waitAll(b *testing.B, rdb *redis.Client, keys []string, t0 time.Time) {
	b.Helper()
	ctx := context.Background()
	for {
		if time.Since(t0) > time.Minute {
			b.Fatal("keys not back within a minute")
		}
		pipe := rdb.Pipeline()
		cmds := make([]*redis.IntCmd, len(keys))
		for i, k := range keys {
			cmds[i] = pipe.Exists(ctx, k)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		all := true
		for _, c := range cmds {
			if c.Val() == 0 {
				all = false
				break
			}
		}
		if all {
			return
		}
	}
}
