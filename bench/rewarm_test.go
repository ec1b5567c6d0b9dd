package bench_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/daemon"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/rewarm"
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
// default 2s poll alone; and, side by side, how long they stay gone after a
// restart of that Redis (no persistence), at once and after a second down,
// counted from the moment it accepts connections again (the poller's first
// PONG): 5 trials each, p50 and max, in one run. The warmer's client is built as the daemon builds it.
func BenchmarkRewarmAfterFlush(b *testing.B) {
	pg := testenv.Postgres(b)
	srv := testenv.PrivateRedis(b)
	rdb := daemon.NewRedis(config.Redis{Addrs: []string{srv.Addr}, DialTimeout: 2 * time.Second,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second}).(*redis.Client)
	b.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE items (id text PRIMARY KEY, v text NOT NULL);
		INSERT INTO items SELECT i::text, repeat(md5(i::text), 16) FROM generate_series(1, %d) i`, rewarmKeys)); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, rewarmKeys)
	for i := range keys {
		keys[i] = "item:" + strconv.Itoa(i+1)
	}
	// trial loses the data rewarmTrials times and returns how long the keys
	// stayed gone each time; restart stops and starts Redis instead of
	// flushing it, after down.
	trial := func(push, restart bool, down time.Duration) []time.Duration {
		b.Helper()
		w, reg := familyWarmer(b, rdb, pg.DSN, "item:{id}")
		if err := w.RefreshAll(ctx); err != nil {
			b.Fatal(err)
		}
		rw, err := rewarm.New(rewarm.Options{Client: rdb, Namespace: "bench-flush", Interval: 2 * time.Second,
			MinGap: time.Millisecond, NoPush: !push, Warmer: w, Registerer: reg})
		if err != nil {
			b.Fatal(err)
		}
		defer startRewarmer(b, rw)()
		var out []time.Duration
		for range rewarmTrials {
			poller := srv.Client(b) // never the warmer's client
			if push {
				testenv.Eventually(b, 10*time.Second, "the push watch tracks the marker", func() bool {
					return trackingOn(b, poller)
				})
			}
			// Start each trial at a random phase of the poll.
			time.Sleep(time.Duration(len(out)*397%2000) * time.Millisecond)
			var t0 time.Time
			if restart {
				t0 = srv.RestartTimed(b, down)
				_ = poller.Close()
				poller = srv.Client(b)
			} else {
				t0 = time.Now()
				if err := poller.FlushDB(ctx).Err(); err != nil {
					b.Fatal(err)
				}
			}
			waitAll(b, poller, keys, t0)
			out = append(out, time.Since(t0))
			_ = poller.Close()
		}
		return out
	}
	for b.Loop() {
		push, poll := trial(true, false, 0), trial(false, false, 0)
		restart, restartDown := trial(true, true, 0), trial(true, true, time.Second)
		p50 := func(d []time.Duration) time.Duration { s := slices.Clone(d); slices.Sort(s); return s[len(s)/2] }
		fmt.Printf("\nre-warm of %d declared keys (private Redis, %d trials each; every key back, seen by another client)\n", rewarmKeys, rewarmTrials)
		fmt.Printf("  FLUSHDB -> back, push (client tracking)      p50 %8s  max %8s\n", p50(push).Round(time.Millisecond), slices.Max(push).Round(time.Millisecond))
		fmt.Printf("  FLUSHDB -> back, poll (rewarm_check 2s)      p50 %8s  max %8s\n", p50(poll).Round(time.Millisecond), slices.Max(poll).Round(time.Millisecond))
		fmt.Printf("  restart, first PONG -> back, push            p50 %8s  max %8s\n", p50(restart).Round(time.Millisecond), slices.Max(restart).Round(time.Millisecond))
		fmt.Printf("  restart after 1s down, first PONG -> back    p50 %8s  max %8s\n\n", p50(restartDown).Round(time.Millisecond), slices.Max(restartDown).Round(time.Millisecond))
		b.ReportMetric(p50(push).Seconds()*1000, "push-p50-ms")
		b.ReportMetric(slices.Max(push).Seconds()*1000, "push-max-ms")
		b.ReportMetric(p50(poll).Seconds()*1000, "poll-p50-ms")
		b.ReportMetric(p50(restart).Seconds()*1000, "restart-p50-ms")
		b.ReportMetric(slices.Max(restart).Seconds()*1000, "restart-max-ms")
		b.ReportMetric(p50(restartDown).Seconds()*1000, "restart-down1s-p50-ms")
		b.ReportMetric(slices.Max(restartDown).Seconds()*1000, "restart-down1s-max-ms")
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

// waitAll polls until every key exists; errors (a connection a restart
// broke) count as keys not back yet.
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
			continue // a connection the restart broke: poll again
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

// startRewarmer takes rw's baseline, then runs it, as a leader term does,
// until the returned stop is called; stop waits for Run to return.
func startRewarmer(b *testing.B, rw *rewarm.Rewarmer) (stop func()) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if err := rw.Mark(ctx); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- rw.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}
}
