package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/migrations"
)

// BenchmarkChangeLatency runs the real binary with one family of 10,000
// products, a version column and change notifications (notify.coalesce left at
// its default), and updates random rows: isolated updates (one every 200 ms,
// each after an idle spell), then 200 and 2,000 updates/s for 10 s each. The
// lag is measured from outside: from the moment the UPDATE's commit returned
// to the moment a separate client, woken by Redis's keyspace event for the SET
// (a private Redis, so that notify-keyspace-events can be set), read the key
// at that version or newer. It prints p50/p90/p99/max per phase with the
// daemon's CPU, Hearth's own hearth_change_lag_seconds (trigger time → write
// acknowledged) and the trigger's cost per UPDATE on PostgreSQL.
//
// HEARTH_BASELINE_BIN=path runs the same phases against that binary first (a
// build of main, say), so that before and after come from one run; its
// figures are reported with a "base-" prefix. HEARTH_BENCH_SOURCE_RATE sets the
// source's rate (calls/s, default 1000 here; 0 is unbounded).
// HEARTH_BENCH_CPUPROFILE=path saves a CPU profile of each daemon during the
// 2,000/s phase at path.2000 (path.base-2000 for the baseline);
// HEARTH_BENCH_COALESCE sets notify.coalesce and HEARTH_BENCH_GATHER
// notify.gather (durations).
// HEARTH_BENCH_ROUNDS=n runs the builds n times, alternately (A B, B A, …),
// and reports medians; the table is vacuumed before each build's run.
func BenchmarkChangeLatency(b *testing.B) {
	const rows = 10_000
	// The source's rate bound (default 100 calls/s) paces change-driven loads
	// like every other: at the default, 200 changes/s and more are gathered
	// into 100 loads/s, and the lag is that pacing. Raised here, as for an
	// origin that takes it, so that what is measured is the queue.
	sourceRate := 1000
	if v, err := strconv.Atoi(os.Getenv("HEARTH_BENCH_SOURCE_RATE")); err == nil {
		sourceRate = v
	}
	rs := testenv.PrivateRedis(b)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.ConfigSet(ctx, "notify-keyspace-events", "E$").Err(); err != nil {
		b.Fatal(err)
	}
	pg := testenv.Postgres(b)
	if _, err := pg.Pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE products (id bigint PRIMARY KEY, name text NOT NULL, price_cents int NOT NULL, version bigint NOT NULL DEFAULT 1);
		INSERT INTO products (id, name, price_cents) SELECT i, 'product ' || i, 100 + i FROM generate_series(1, %d) i;
		CREATE TABLE products_plain (LIKE products INCLUDING ALL);
		INSERT INTO products_plain SELECT * FROM products;
		ANALYZE products; ANALYZE products_plain;`, rows)); err != nil {
		b.Fatal(err)
	}
	fn, err := os.ReadFile("../migrations/00005_change_notify.sql")
	if err != nil {
		b.Fatal(err)
	}
	up := string(fn)
	up = up[strings.Index(up, "-- +goose StatementBegin"):strings.Index(up, "-- +goose StatementEnd")]
	channel := "hearth_bench_" + strings.ReplaceAll(pg.Schema, "-", "_")
	if len(channel) > 63 {
		channel = channel[:63]
	}
	trig, err := migrations.NotifyTriggerSQL("product", "products", "id", channel)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pg.Pool.Exec(ctx, up+";"+trig); err != nil {
		b.Fatal(err)
	}
	overhead := triggerCost(b, pg.Pool)
	// The updaters' own pool: the harness's holds 4 connections, too few to
	// reach 2,000 updates/s when PostgreSQL shares a loaded machine.
	pcfg, err := pgxpool.ParseConfig(pg.DSN)
	if err != nil {
		b.Fatal(err)
	}
	pcfg.MaxConns = updaters
	updPool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer updPool.Close()
	fmt.Printf("\nchange to Redis: %d products, notify.coalesce at its default, source rate %d calls/s; trigger cost on PostgreSQL %.0f µs per single-row UPDATE (%.0f with vs %.0f µs without, %d sequential UPDATEs each)\n",
		rows, sourceRate, overhead.with-overhead.without, overhead.with, overhead.without, overhead.n)

	// The reference: the same 2,000 updates/s with no Hearth running (the
	// trigger still notifies), so that a rate the updaters cannot reach, or
	// a machine already saturated, is seen as the machine's, not Hearth's.
	{
		busy0, total0 := machineCPU(b)
		pg0, w0 := commandCPU("postgres"), time.Now()
		n := paceUpdates(b, updPool, rows, 2000, 10*time.Second, func(int64, int64, time.Time) {})
		window := time.Since(w0)
		busy1, total1 := machineCPU(b)
		pg1 := commandCPU("postgres")
		fmt.Printf("reference, no Hearth running: 2,000 updates/s asked, %.0f/s achieved; machine %.0f %% busy (of %d cores), PostgreSQL %.0f %% of one core\n",
			float64(n)/window.Seconds(), (busy1-busy0)/max(1e-9, total1-total0)*100, runtime.NumCPU(), (pg1-pg0).Seconds()/window.Seconds()*100)
	}

	type build struct{ label, prefix, bin string }
	builds := []build{{"this build", "", e2e.PlainBinary(b)}}
	if base := os.Getenv("HEARTH_BASELINE_BIN"); base != "" {
		builds = append([]build{{"baseline " + base, "base-", base}}, builds...)
	}
	phases := []struct {
		name string
		rate int
		d    time.Duration
	}{{"isolated", 5, 8 * time.Second}, {"200/s", 200, 10 * time.Second}, {"2000/s", 2000, 10 * time.Second}}
	notifyOpts := "" // notify.coalesce and notify.gather at their defaults unless HEARTH_BENCH_COALESCE or HEARTH_BENCH_GATHER says
	if v := os.Getenv("HEARTH_BENCH_COALESCE"); v != "" {
		notifyOpts = "\n      coalesce: " + v
	}
	if v := os.Getenv("HEARTH_BENCH_GATHER"); v != "" { // a build of notify.gather or later
		notifyOpts += "\n      gather: " + v
	}
	profile := os.Getenv("HEARTH_BENCH_CPUPROFILE")
	pprof := "" // only when asked: a binary of another commit may not know the field
	if profile != "" {
		pprof = "\n  pprof: true"
	}
	// HEARTH_BENCH_ROUNDS=n runs the builds n times in alternating order
	// (A B, B A, …) and reports each figure's median over the rounds; the
	// table is vacuumed before each build, so that the second does not pay
	// for the first's dead rows.
	rounds := max(1, envInt("HEARTH_BENCH_ROUNDS", 1))
	type key struct{ build, phase string }
	results := map[key][]changeResult{}
	for range b.N {
		for round := range rounds * len(builds) {
			order := slices.Clone(builds)
			if round/len(builds)%2 == 1 {
				slices.Reverse(order)
			}
			bd := order[round%len(builds)]
			if _, err := pg.Pool.Exec(ctx, "VACUUM (ANALYZE) products"); err != nil {
				b.Fatal(err)
			}
			listen := e2e.FreeAddr(b)
			prefix := "bench" + strings.TrimSuffix(bd.prefix, "-") + ":"
			cfg := filepath.Join(b.TempDir(), "config.yaml")
			if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
redis:
  addrs: [%q]
http:
  listen: %q%s
log:
  format: json
  level: warn
sources:
  - name: db
    type: postgres
    dsn: %q
    rate: %d
keys:
  - name: product
    key: "%sproduct:{id}"
    source: db
    ttl: 60s
    param_pattern: "[0-9]{1,12}"
    members_query: "SELECT id::text FROM products"
    query: >-
      SELECT id::text, json_build_object('id', id, 'name', name, 'price_cents', price_cents, 'version', version)::text, version
      FROM products WHERE id = ANY($1::bigint[])
    version_column: version
    notify:
      channel: %s%s
`, rs.Addr, listen, pprof, pg.DSN, sourceRate, prefix, channel, notifyOpts)), 0o600); err != nil {
				b.Fatal(err)
			}
			proc := e2e.StartBinary(b, bd.bin, []string{"run", "--config", cfg})
			proc.WaitHTTP(b, "http://"+listen+"/readyz", http.StatusOK, time.Minute)
			metrics := "http://" + listen + "/metrics"
			deadline := time.Now().Add(30 * time.Second)
			for e2e.Sum(e2e.Metrics(b, metrics), "hearth_change_refreshes_total", `kind="full"`) < 1 || e2e.Sum(e2e.Metrics(b, metrics), "hearth_change_listen_connected") < 1 {
				if time.Now().After(deadline) {
					b.Fatal("the change listener did not connect")
				}
				time.Sleep(100 * time.Millisecond)
			}
			time.Sleep(2 * time.Second) // the session's full refresh settles
			pid := proc.Cmd.Process.Pid
			if rounds > 1 {
				fmt.Printf("%s (round %d of %d):\n", bd.label, round/len(builds)+1, rounds)
			} else {
				fmt.Printf("%s:\n", bd.label)
			}
			for _, ph := range phases {
				var prof sync.WaitGroup
				if profile != "" && ph.rate == 2000 {
					path := fmt.Sprintf("%s.%s2000", profile, bd.prefix)
					prof.Go(func() {
						fetchProfile(b, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", listen, int(ph.d.Seconds())-2), path)
					})
				}
				r := measureChanges(b, updPool, rdb, prefix, rows, ph.rate, ph.d, metrics, pid)
				prof.Wait()
				results[key{bd.prefix, ph.name}] = append(results[key{bd.prefix, ph.name}], r)
				fmt.Printf("  %8s: %d updates (%.0f/s achieved), outside lag p50 %.1f ms p90 %.1f ms p99 %.1f ms max %.1f ms (%d seen); hearth_change_lag_seconds p50 ≤ %.0f ms p99 ≤ %.0f ms; delivery (trigger → received) p50 ≤ %.1f ms p99 ≤ %.1f ms; queue wait p50 ≤ %.1f ms p99 ≤ %.1f ms; origin load p50 ≤ %.1f ms p99 ≤ %.1f ms; daemon CPU %.1f%% of one core; %.0f member refreshes (%.1f members each); refused as older %.0f; machine %.0f %% busy (of %d cores; steal %.1f %%), PostgreSQL %.0f %% of one core; the worst 1 %% of lags in %d slots of 100 ms, the largest holding %.0f %% of them; the outside reader read up to %d SETs a round trip (%d round trips of more than one)\n",
					ph.name, r.updates, r.achieved, r.p50*1000, r.p90*1000, r.p99*1000, r.max*1000, r.seen, r.hp50*1000, r.hp99*1000, r.deliver50*1000, r.deliver99*1000, r.wait50*1000, r.wait99*1000, r.load50*1000, r.load99*1000, r.cpu, r.loads, float64(r.updates)/max(1, r.loads), r.refused, r.machineBusy, r.cores, r.steal, r.pgCPU, r.tailSlots, r.tailTop*100, r.obsBatch, r.obsBatchN)
			}
			proc.Signal(b, 15)
			if code := proc.Wait(b, 30*time.Second); code != 0 {
				b.Fatalf("%s: exit %d", bd.label, code)
			}
		}
	}
	for _, bd := range builds {
		if rounds > 1 {
			fmt.Printf("%s, median of %d rounds:\n", bd.label, rounds)
		}
		for _, ph := range phases {
			rs := results[key{bd.prefix, ph.name}]
			pick := func(f func(changeResult) float64) float64 {
				xs := make([]float64, len(rs))
				for i, r := range rs {
					xs[i] = f(r)
				}
				return median(xs)
			}
			p50, p90, p99 := pick(func(r changeResult) float64 { return r.p50 * 1000 }), pick(func(r changeResult) float64 { return r.p90 * 1000 }), pick(func(r changeResult) float64 { return r.p99 * 1000 })
			cpu := pick(func(r changeResult) float64 { return r.cpu })
			if rounds > 1 {
				fmt.Printf("  %8s: outside lag p50 %.1f ms p90 %.1f ms p99 %.1f ms; daemon CPU %.1f%% of one core; %.1f members per refresh\n",
					ph.name, p50, p90, p99, cpu, pick(func(r changeResult) float64 { return float64(r.updates) / max(1, r.loads) }))
			}
			for _, m := range []struct {
				v    float64
				unit string
			}{{p50, "p50-ms"}, {p90, "p90-ms"}, {p99, "p99-ms"}, {cpu, "cpu-%"}} {
				b.ReportMetric(m.v, bd.prefix+m.unit+"@"+ph.name)
			}
		}
	}
}

// updaters is how many connections update rows at most, each pacing its
// share of the rate.
const updaters = 32

type cost struct {
	with, without float64
	n             int
}

// triggerCost times single-row UPDATEs, one after the other on one
// connection, on the table with the trigger and on a copy without.
func triggerCost(b *testing.B, pool *pgxpool.Pool) cost {
	const n = 3000
	ctx := context.Background()
	run := func(table string) float64 {
		t0 := time.Now()
		for i := range n {
			if _, err := pool.Exec(ctx, "UPDATE "+table+" SET price_cents = price_cents + 1 WHERE id = $1", i%5000+1); err != nil {
				b.Fatal(err)
			}
		}
		return float64(time.Since(t0).Microseconds()) / n
	}
	run("products_plain") // warm up
	without := run("products_plain")
	with := run("products")
	return cost{with: with, without: without, n: n}
}

type changeResult struct {
	updates, seen      int
	achieved           float64
	p50, p90, p99, max float64
	hp50, hp99         float64
	wait50, wait99     float64 // hearth_change_wait_seconds (not in older builds: NaN)
	// hearth_change_delivery_seconds: trigger → notification received (the
	// writer's commit and PostgreSQL's delivery; not in older builds: NaN)
	deliver50, deliver99 float64
	load50, load99       float64 // hearth_origin_load_duration_seconds
	cpu, refused         float64
	loads                float64 // change-driven member refreshes
	// The whole machine over the same window: how busy its cores were (% of
	// all of them) and PostgreSQL's processes' CPU (% of one core), to tell
	// a tail Hearth causes from one of a saturated machine.
	machineBusy, pgCPU float64
	cores              int
	// steal: the hypervisor's share of the machine's cores (% of all).
	steal float64
	// The worst 1 % of lags by when their commits were acknowledged, in
	// 100 ms slots: how many slots hold them and the largest slot's share.
	// One stall (a pause of any process on the path, or of the machine)
	// sets the p99 when a single slot holds most of them.
	tailSlots int
	tailTop   float64
	// The outside reader: the most SETs it read in one pipeline, and how
	// many of its pipelines read more than one (the SETs of one of Hearth's
	// writes arrive together; a large batch is a backlog caught up).
	obsBatch, obsBatchN int
}

func measureChanges(b *testing.B, pool *pgxpool.Pool, rdb *redis.Client, prefix string, rows, rate int, d time.Duration, metrics string, pid int) changeResult {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type commit struct {
		version int64
		at      time.Time
	}
	type sighting struct {
		version int64
		at      time.Time
	}
	var (
		mu      sync.Mutex
		pending = map[int64][]commit{}
		seen    = map[int64]sighting{} // the newest version read per key
		lags    []float64
		commits []time.Time // lags[i]'s commit acknowledgement
	)
	// settle records the lag of every pending commit of id that version
	// covers. Call with mu held.
	settle := func(id, version int64, at time.Time) {
		keep := pending[id][:0]
		for _, c := range pending[id] {
			if c.version <= version {
				// A write can land before the updater got its commit
				// acknowledged: that is a lag of 0.
				lags = append(lags, max(0, at.Sub(c.at).Seconds()))
				commits = append(commits, c.at)
			} else {
				keep = append(keep, c)
			}
		}
		pending[id] = keep
	}
	// The observer: woken by every SET, reads the key and settles the
	// commits it covers. The SETs that arrived while it read are read
	// together, in one pipeline: one GET round trip per SET fell behind on
	// a busy machine at 2,000/s (its backlog read as lag, past Hearth's own
	// figure), so the outside view must be faster than what it watches.
	sub := rdb.Subscribe(ctx, "__keyevent@0__:set")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		b.Fatal(err)
	}
	reader := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr})
	defer reader.Close()
	var (
		obs       sync.WaitGroup
		obsBatch  int // the most SETs one pipeline read
		obsBatchN int // pipelines of more than one
	)
	obs.Go(func() {
		ch := sub.Channel(redis.WithChannelSize(1 << 16))
		keys := make([]string, 0, 1024)
		ids := make([]int64, 0, 1024)
		add := func(key string) {
			id, err := strconv.ParseInt(strings.TrimPrefix(key, prefix+"product:"), 10, 64)
			if err == nil {
				keys, ids = append(keys, key), append(ids, id)
			}
		}
		for msg := range ch {
			keys, ids = keys[:0], ids[:0]
			add(msg.Payload)
		drain:
			for len(keys) < cap(keys) {
				select {
				case m, ok := <-ch:
					if !ok {
						break drain
					}
					add(m.Payload)
				default:
					break drain
				}
			}
			if len(keys) == 0 {
				continue
			}
			pipe := reader.Pipeline()
			cmds := make([]*redis.StringCmd, len(keys))
			for i, k := range keys {
				cmds[i] = pipe.Get(ctx, k)
			}
			_, _ = pipe.Exec(ctx)
			now := time.Now()
			mu.Lock()
			obsBatch = max(obsBatch, len(keys))
			if len(keys) > 1 {
				obsBatchN++
			}
			for i, c := range cmds {
				var v struct{ Version int64 }
				if c.Err() != nil || json.Unmarshal([]byte(c.Val()), &v) != nil {
					continue
				}
				id := ids[i]
				if v.Version > seen[id].version {
					seen[id] = sighting{v.Version, now}
				}
				settle(id, v.Version, now)
			}
			mu.Unlock()
		}
	})

	m0 := e2e.Metrics(b, metrics)
	cpu0, w0 := cpuTime(b, pid), time.Now()
	busy0, total0, steal0 := machineCPUSteal(b)
	pg0 := commandCPU("postgres")
	updates := paceUpdates(b, pool, rows, rate, d, func(id, v int64, at time.Time) {
		mu.Lock()
		pending[id] = append(pending[id], commit{v, at})
		if sn := seen[id]; sn.version >= v {
			settle(id, sn.version, sn.at)
		}
		mu.Unlock()
	})
	window := time.Since(w0)
	busy1, total1, steal1 := machineCPUSteal(b)
	pg1 := commandCPU("postgres")
	// Let the last changes land before reading the figures.
	time.Sleep(2 * time.Second)
	cpu1 := cpuTime(b, pid)
	m1 := e2e.Metrics(b, metrics)
	_ = sub.Close()
	obs.Wait()
	mu.Lock()
	defer mu.Unlock()
	tailSlots, tailTop := tailSpread(lags, commits, w0, 100*time.Millisecond)
	sort.Float64s(lags)
	q := func(p float64) float64 {
		if len(lags) == 0 {
			return math.NaN()
		}
		return lags[min(len(lags)-1, int(p*float64(len(lags))))]
	}
	hq := func(p float64, name string) float64 { return histQuantile(p, bucketsOf(m1, name), bucketsOf(m0, name)) }
	r := changeResult{
		updates: updates, seen: len(lags), achieved: float64(updates) / window.Seconds(),
		p50: q(0.50), p90: q(0.90), p99: q(0.99), max: q(1),
		hp50:        hq(0.50, "hearth_change_lag_seconds"),
		hp99:        hq(0.99, "hearth_change_lag_seconds"),
		wait50:      hq(0.50, "hearth_change_wait_seconds"),
		wait99:      hq(0.99, "hearth_change_wait_seconds"),
		deliver50:   hq(0.50, "hearth_change_delivery_seconds"),
		deliver99:   hq(0.99, "hearth_change_delivery_seconds"),
		load50:      hq(0.50, "hearth_origin_load_duration_seconds"),
		load99:      hq(0.99, "hearth_origin_load_duration_seconds"),
		cpu:         (cpu1 - cpu0).Seconds() / (window + 2*time.Second).Seconds() * 100,
		refused:     e2e.Sum(m1, "hearth_version_refused_writes_total") - e2e.Sum(m0, "hearth_version_refused_writes_total"),
		loads:       e2e.Sum(m1, "hearth_change_refreshes_total", `kind="members"`) - e2e.Sum(m0, "hearth_change_refreshes_total", `kind="members"`),
		machineBusy: (busy1 - busy0) / max(1e-9, total1-total0) * 100,
		steal:       (steal1 - steal0) / max(1e-9, total1-total0) * 100,
		tailSlots:   tailSlots,
		tailTop:     tailTop,
		obsBatch:    obsBatch,
		obsBatchN:   obsBatchN,
		pgCPU:       (pg1 - pg0).Seconds() / window.Seconds() * 100,
		cores:       runtime.NumCPU(),
	}
	return r
}

// paceUpdates updates random rows of products at rate per second for d, from
// up to updaters connections, each pacing its share, and calls committed
// (from the updater's goroutine) with each row's id, new version and the
// moment its commit was acknowledged. It returns how many it made.
func paceUpdates(b *testing.B, pool *pgxpool.Pool, rows, rate int, d time.Duration, committed func(id, version int64, at time.Time)) int {
	ctx := context.Background()
	workers := min(updaters, rate)
	var (
		wg      sync.WaitGroup
		updates int
		umu     sync.Mutex
	)
	end := time.Now().Add(d)
	for w := range workers {
		wg.Go(func() {
			// Each worker paces its share of the rate: worker w sends at
			// start + (k*workers + w)/rate.
			start := time.Now()
			for k := 0; ; k++ {
				at := start.Add(time.Duration(float64(k*workers+w) / float64(rate) * float64(time.Second)))
				if at.After(end) {
					return
				}
				time.Sleep(time.Until(at))
				id := int64((k*workers+w)*7919%rows + 1)
				var v int64
				if err := pool.QueryRow(ctx, `UPDATE products SET version = version + 1 WHERE id = $1 RETURNING version`, id).Scan(&v); err != nil {
					b.Error(err)
					return
				}
				committed(id, v, time.Now())
				umu.Lock()
				updates++
				umu.Unlock()
			}
		})
	}
	wg.Wait()
	return updates
}

// bucketsOf reads one histogram's buckets from a scrape, summed over the
// series whose labels contain every one of labels.
func bucketsOf(m map[string]float64, name string, labels ...string) []bucket {
	byLE := map[float64]float64{}
	for series, v := range m {
		if !strings.HasPrefix(series, name+"_bucket{") {
			continue
		}
		if slices.ContainsFunc(labels, func(l string) bool { return !strings.Contains(series, l) }) {
			continue
		}
		i := strings.Index(series, `le="`)
		le, err := strconv.ParseFloat(strings.TrimSuffix(series[i+4:], `"}`), 64)
		if err != nil {
			le = math.Inf(1)
		}
		byLE[le] += v
	}
	out := make([]bucket, 0, len(byLE))
	for le, v := range byLE {
		out = append(out, bucket{le, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].le < out[j].le })
	return out
}

// tailSpread places the worst 1 % of lags (at least one) by their commits'
// time since start in slots of width: the number of slots they fall in and
// the largest slot's share of them. lags and commits are parallel.
func tailSpread(lags []float64, commits []time.Time, start time.Time, width time.Duration) (slots int, top float64) {
	if len(lags) == 0 {
		return 0, math.NaN()
	}
	idx := make([]int, len(lags))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return lags[idx[a]] > lags[idx[b]] })
	n := max(1, len(lags)/100)
	count := map[int64]int{}
	most := 0
	for _, i := range idx[:n] {
		s := int64(commits[i].Sub(start) / width)
		count[s]++
		most = max(most, count[s])
	}
	return len(count), float64(most) / float64(n)
}

// TestTailSpread: a tail one stall made sits in one slot; a spread one in
// many.
func TestTailSpread(t *testing.T) {
	start := time.Unix(0, 0)
	lags := make([]float64, 1000)
	commits := make([]time.Time, 1000)
	for i := range lags {
		commits[i] = start.Add(time.Duration(i) * 10 * time.Millisecond)
		lags[i] = 0.001
	}
	for i := 500; i < 510; i++ { // one stall: ten commits in 100 ms
		lags[i] = 0.050
	}
	if slots, top := tailSpread(lags, commits, start, 100*time.Millisecond); slots != 1 || top != 1 {
		t.Errorf("one stall: %d slots, top %.2f; want 1, 1", slots, top)
	}
	for i := 500; i < 510; i++ {
		lags[i] = 0.001
	}
	for i := 0; i < 1000; i += 100 { // ten slow commits, 1 s apart
		lags[i] = 0.050
	}
	if slots, top := tailSpread(lags, commits, start, 100*time.Millisecond); slots != 10 || top != 0.1 {
		t.Errorf("spread: %d slots, top %.2f; want 10, 0.10", slots, top)
	}
}
