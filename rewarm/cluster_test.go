package rewarm_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/daemon"
	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/rewarm"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// TestRewarmClusterOneMaster: on a 3-master Cluster each master keeps its
// own marker, so a FLUSHALL of one master, and the kill -9 of another (its
// replica promoted: a new run_id for those slots), are each seen alone — by a
// push, the periodic check being out of reach — and re-warm only that
// master's slots: keys on the other masters keep the value the test planted.
func TestRewarmClusterOneMaster(t *testing.T) {
	const members = 600
	cl := testenv.RedisCluster(t)
	pg := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE items (id bigint PRIMARY KEY, v text NOT NULL);
		INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, %d) g`, members)); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`
sources: [{name: db, type: postgres, dsn: %q}]
keys:
  - {name: item, key: "item:{id}", source: db, ttl: 1h, batch_size: 100, param_pattern: "[0-9]{1,6}",
     members_query: "SELECT id::text FROM items", query: "SELECT id::text, v FROM items WHERE id = ANY($1::bigint[])"}
`, pg.DSN)))
	if err != nil {
		t.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	// The daemon's own cluster client: it follows the failover below.
	rdb := daemon.NewRedis(config.Redis{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	reg := prometheus.NewRegistry()
	w, err := warmer.New(warmer.Options{Store: &store.RedisStore{Client: rdb}, Sources: map[string]warmer.Source{"db": src},
		Specs: cfg.Specs(), MaxConcurrentLoads: 4, Registerer: reg, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.RefreshAll(ctx); err != nil {
		t.Fatal(err)
	}
	rw, err := rewarm.New(rewarm.Options{Client: rdb, Namespace: "rwc", Interval: noPoll, MinGap: time.Millisecond,
		Warmer: w, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	run(t, rw)

	keys := make([]string, members)
	for i := range keys {
		keys[i] = fmt.Sprintf("item:%d", i+1)
	}
	// plant overwrites every key with "planted": a re-warm puts the origin's
	// value back, so afterwards "v…" marks exactly the keys re-warmed.
	plant := func() {
		t.Helper()
		pipe := rdb.Pipeline()
		for _, k := range keys {
			pipe.Set(ctx, k, "planted", redis.KeepTTL)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// check: every key is present; those on master m were re-warmed, the others not.
	check := func(what string, m *testenv.RedisServer) {
		t.Helper()
		mine := 0
		owners := cl.SlotOwners(t)
		testenv.Eventually(t, 20*time.Second, what+": the lost master's keys re-warmed", func() bool {
			mine = 0
			for _, k := range keys {
				v, err := rdb.Get(ctx, k).Result()
				if err != nil {
					return false
				}
				on := owners[slot.Of(k)] == m
				if on && v == "planted" {
					return false
				}
				if on {
					mine++
				}
			}
			return true
		})
		for _, k := range keys {
			v := rdb.Get(ctx, k).Val()
			if on := owners[slot.Of(k)] == m; !on && v != "planted" {
				t.Fatalf("%s: %s (on a master that kept its data) = %q: re-warmed too", what, k, v)
			}
		}
		if mine == 0 || mine == len(keys) {
			t.Fatalf("%s: %d of %d keys on the lost master", what, mine, len(keys))
		}
	}
	waitClusterTracking(t, cl)

	// A FLUSHALL of one master.
	flushed := cl.MasterOf(t, slot.Of("item:1"))
	plant()
	if err := flushed.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	check("flushall of one master", flushed)
	if got, want := promtest.Value(t, reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Flush), 1.0; got != want {
		t.Errorf("rewarms{reason=flush} = %g, want %g", got, want)
	}

	// kill -9 of another master: its replica takes over with the data, under
	// a new run_id, and only its slots are re-warmed (replication is
	// asynchronous: the last writes before the kill may be gone).
	var killed *testenv.RedisServer
	for _, m := range cl.Masters(t) {
		if m != flushed {
			killed = m
			break
		}
	}
	waitClusterTracking(t, cl)
	plant()
	promoted := cl.KillMaster(t, killed)
	check("kill -9 of a master", promoted)
	if got, want := promtest.Value(t, reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Restart), 1.0; got != want {
		t.Errorf("rewarms{reason=restart} = %g, want %g", got, want)
	}
	if got, want := promtest.Value(t, reg, "hearth_prewarm_rewarm_detections_total", "via", rewarm.DetectPush), 2.0; got != want {
		t.Errorf("detections{via=push} = %g, want %g", got, want)
	}
	if got := promtest.Value(t, reg, "hearth_prewarm_rewarm_detections_total", "via", rewarm.DetectPoll); got != 0 {
		t.Errorf("detections{via=poll} = %g, want 0 (the poll never ran)", got)
	}
}

// waitClusterTracking waits until every master has one connection with
// client tracking on (the push watch's).
func waitClusterTracking(t *testing.T, cl *testenv.Cluster) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, "the push watch tracks every master", func() bool {
		for _, m := range cl.Masters(t) {
			list, err := m.Client(t).ClientList(context.Background()).Result()
			if err != nil {
				return false
			}
			n := 0
			for _, line := range strings.Split(list, "\n") {
				for _, f := range strings.Fields(line) {
					if v, ok := strings.CutPrefix(f, "flags="); ok && strings.ContainsRune(v, 't') {
						n++
					}
				}
			}
			if n != 1 {
				return false
			}
		}
		return true
	})
}

// TestRewarmClusterReshard: a reshard of 2,000 slots from the master with the
// lowest slots to another, with the watch running (push on, a 100 ms poll),
// moves the source's marker with its slots and gives the target a lower
// lowest slot, whose marker the source's run_id was the baseline of: no loss
// is reported and nothing is re-warmed (the checks that meet MOVED or ASK
// meanwhile change no baseline). Afterwards a FLUSHALL of the target is still
// seen and re-warms its slots alone, the moved ones included.
func TestRewarmClusterReshard(t *testing.T) {
	cl := testenv.RedisCluster(t)
	rdb := daemon.NewRedis(config.Redis{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	ref := &recordingRefresher{}
	rw, err := rewarm.New(rewarm.Options{Client: rdb, Namespace: "rwr", Interval: 100 * time.Millisecond,
		MinGap: time.Millisecond, Warmer: ref, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	run(t, rw)
	waitClusterTracking(t, cl)

	from := cl.MasterOf(t, 0)
	var to, other *testenv.RedisServer
	for _, m := range cl.Masters(t) {
		switch {
		case m == from:
		case to == nil:
			to = m
		default:
			other = m
		}
	}
	cl.Reshard(t, from, to, 2000)
	if got := cl.MasterOf(t, 0); got != to {
		t.Fatalf("after the reshard slot 0 is on %s, want %s", got.Addr, to.Addr)
	}
	// The slot map settles: a check gets through every master.
	testenv.Eventually(t, 20*time.Second, "a check after the reshard", func() bool {
		_, err := rw.CheckOnce(ctx)
		return err == nil
	})
	for _, reason := range []string{rewarm.Restart, rewarm.Flush} {
		if got := promtest.Value(t, reg, "hearth_prewarm_rewarms_total", "reason", reason); got != 0 {
			t.Errorf("rewarms{reason=%s} = %g after a reshard, want 0", reason, got)
		}
		if got := promtest.Value(t, reg, "hearth_prewarm_rewarms_suppressed_total", "reason", reason); got != 0 {
			t.Errorf("rewarms_suppressed{reason=%s} = %g after a reshard, want 0", reason, got)
		}
	}
	if n := ref.calls(); n != 0 {
		t.Fatalf("%d re-warms during and after a reshard, want none", n)
	}

	// The watch still works: the target's flush re-warms the target's slots.
	if err := to.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the flush of the target re-warmed", func() bool { return ref.calls() > 0 })
	keep := ref.last()
	owners := cl.SlotOwners(t)
	for _, s := range []int{0, 1999, 16383, 8000, 12000} {
		key := "k:{" + slot.Tag(s) + "}"
		if want := owners[s] == to; keep == nil || keep(key) != want {
			t.Errorf("after the target's flush, re-warm of slot %d (on %s; target %s, other %s): keep nil %v, want %v",
				s, owners[s].Addr, to.Addr, other.Addr, keep == nil, want)
		}
	}
	if got := promtest.Value(t, reg, "hearth_prewarm_rewarms_total", "reason", rewarm.Flush); got != 1 {
		t.Errorf("rewarms{reason=flush} = %g after the target's flush, want 1", got)
	}
}

// recordingRefresher is a Refresher that records each re-warm's keep.
type recordingRefresher struct {
	mu    sync.Mutex
	keeps []func(string) bool
}

func (f *recordingRefresher) RefreshWhere(_ context.Context, keep func(string) bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keeps = append(f.keeps, keep)
	return nil
}

func (f *recordingRefresher) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.keeps)
}

func (f *recordingRefresher) last() func(string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.keeps[len(f.keeps)-1]
}
