package soak_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/soak"
)

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{}) // the observer's dial errors while Redis is down are expected
	testenv.Main(m)
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// The soak's config. Two families of soakKeys members each (one batch): item,
// plain fenced writes, and row, the same rows with a version_column, so that
// every write of it leaves a version record carrying the writer's epoch. TTL 8 s
// refreshed every 2 s (jitter 0.1: the smallest TTL is 7.6 s, so the takeover
// margin is 7.6 − (2 + 1 + 0.05) − (1 + 0.25) = 3.3 s, above lease + the
// campaign's longest backoff, 1.5 + 4 × 0.3 × 1.2 = 2.94 s).
var params = soak.Params{
	TTL: 8 * time.Second, Interval: 2 * time.Second, LoadTimeout: time.Second, Spread: 0.5,
	Lease: 1500 * time.Millisecond, Retry: 300 * time.Millisecond,
	MaxStale:       60 * time.Second,
	RewarmCheck:    time.Second,
	RewarmGap:      10 * time.Second,
	BreakerOpenFor: 3 * time.Second,
	Slack:          2 * time.Second,
}

const (
	soakKeys     = 40
	soakInstance = 3
)

// The keys of Hearth's own that the observer reads beside the values, as
// docs/leadership.md and docs/faults.md name them for namespace hearth on one
// node; the version records' names are found by SCAN (recordKeys). On a
// Cluster the fences are per slot (clusterNames).
const (
	fenceKey = "hearth:fence"
	leaseKey = "hearth:{lease}"
)

func configText(redisAddrs []string, dsn string, jitter float64) string {
	quoted := make([]string, len(redisAddrs))
	for i, a := range redisAddrs {
		quoted[i] = strconv.Quote(a)
	}
	var members []string
	for i := 1; i <= soakKeys; i++ {
		members = append(members, strconv.Quote(strconv.Itoa(i)))
	}
	return fmt.Sprintf(`redis:
  addrs: [%s]
  namespace: hearth
  dial_timeout: 500ms
  read_timeout: 500ms
  write_timeout: 500ms
log:
  level: info
  format: json
refresh:
  load_timeout: %s
  spread: %g
  jitter: %g
  max_stale: %s
  shutdown_timeout: 3s
leader:
  lease: %s
  retry_period: %s
prewarm:
  rewarm_check: %s
sources:
  - name: db
    type: postgres
    dsn: %q
    max_conns: 2
    attempt_timeout: 400ms
    retries: 1
    breaker: {failures: 5, open_for: %s}
keys:
  - name: item
    key: "soak:item:{id}"
    source: db
    ttl: %s
    interval: %s
    param_pattern: "[0-9]+"
    members: [%s]
    query: "SELECT id, 'v' || version FROM items WHERE id = ANY($1)"
  - name: row
    key: "soak:row:{id}"
    source: db
    ttl: %[11]s
    interval: %[12]s
    param_pattern: "[0-9]+"
    members: [%[13]s]
    query: "SELECT id, 'v' || version, version FROM items WHERE id = ANY($1)"
    version_column: version
`, strings.Join(quoted, ", "), params.LoadTimeout, params.Spread, jitter, params.MaxStale, params.Lease, params.Retry,
		params.RewarmCheck, dsn, params.BreakerOpenFor, params.TTL, params.Interval, strings.Join(members, ", "))
}

// instance is one of the soak's hearth processes, restarted under the same
// name and listen address.
type instance struct {
	name, addr string
	// link is the instance's own proxy to Redis, for the link faults; cfg
	// its config file, which names that proxy.
	link *testenv.Proxy
	cfg  string

	mu      sync.Mutex
	proc    *e2e.Proc
	gen     int
	wantUp  bool
	upAfter time.Time
}

func (in *instance) id() string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return fmt.Sprintf("%s#%d", in.name, in.gen)
}

func (in *instance) current() (*e2e.Proc, string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.proc, fmt.Sprintf("%s#%d", in.name, in.gen)
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// TestSoak runs soakInstance `hearth run` processes on a private Redis and
// PostgreSQL through a seeded schedule of faults for SOAK_DURATION (default
// 2m), while an updater bumps versioned rows, an observer reads every key
// every 100 ms and a scraper reads each instance's /metrics every 250 ms; then
// the checker judges what they saw (docs/soak.md). SOAK_SEED replays a
// schedule; unset, the seed is the clock's and is printed. SOAK_CLUSTER=1 runs
// the Cluster variant: a private 3-master, 3-replica Redis Cluster and its
// faults; SOAK_CLUSTER_TOLERATE_SPILL=1 reports FAILOVER-SPILL without
// failing.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: runs for minutes")
	}
	total, err := time.ParseDuration(env("SOAK_DURATION", "2m"))
	if err != nil || total < 30*time.Second {
		t.Fatalf("SOAK_DURATION=%q: want a duration of at least 30s (%v)", os.Getenv("SOAK_DURATION"), err)
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SOAK_SEED"); s != "" {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("SOAK_SEED=%q: %v", s, err)
		}
	}
	p := params
	replay := fmt.Sprintf("make soak SEED=%d DURATION=%s", seed, total)
	if os.Getenv("SOAK_CLUSTER") == "1" {
		p.Cluster = true
		p.TolerateSpill = os.Getenv("SOAK_CLUSTER_TOLERATE_SPILL") == "1"
		replay += " CLUSTER=1"
	}
	t.Logf("soak: seed %d, %s, cluster %t (replay: %s)", seed, total, p.Cluster, replay)
	in, r := run(t, p, total, seed, soak.Schedule(seed, total, p), nil)
	t.Log("\n" + soak.Format(in, r, seed))
	if !r.OK() {
		t.Errorf("soak: %d violations; replay with %s", len(r.Violations), replay)
	}
	if r.WriterChecks == 0 {
		t.Error("soak: no scrape interval with landed writes was judged: the scrapers saw no writer")
	}
	if r.RecordWrites == 0 {
		t.Error("soak: no write was seen in the version records: the observer read none")
	}
	if r.Reads < int(total/time.Second) {
		t.Errorf("soak: only %d reads in %s: the observer did not run", r.Reads, total)
	}
}

// TestSoakCatchesPlantedFaults runs the harness for 30 s with no fault, and
// plants what Hearth must never do, straight into Redis: an old version over
// a newer one, a deleted key, a value the origin does not produce, a write
// carrying an epoch older than the fence (a deposed leader's). The
// checker, fed by the live observer, must name each one, and only those: the
// proof that a soak that passes could have failed.
func TestSoakCatchesPlantedFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: runs for 30s")
	}
	if os.Getenv("SOAK_CLUSTER") == "1" {
		t.Skip("soak: the planted faults prove the single-node harness; the Cluster variant's rules are proven by the checker's tests (cluster_test.go)")
	}
	// Each fault is planted every 50 ms for a second, so the observer
	// (every 100 ms) cannot miss it between two of Hearth's rewrites.
	planted := map[soak.Rule]string{}
	since := map[soak.Rule]time.Duration{}
	during := func(rule soak.Rule, from, elapsed time.Duration, ready bool) bool {
		if elapsed < from || !ready && since[rule] == 0 {
			return false
		}
		if since[rule] == 0 {
			since[rule] = elapsed
		}
		return elapsed < since[rule]+time.Second
	}
	var rk string // soak:row:4's version record
	plant := func(ctx context.Context, elapsed time.Duration, c *redis.Client) {
		// An old version over a newer one, as a stale writer would land it
		// (once Hearth wrote a version above 1).
		v, _ := c.Get(ctx, "soak:item:1").Result()
		if during(soak.Regression, 8*time.Second, elapsed, v != "" && v != "v1") {
			c.Set(ctx, "soak:item:1", "v1", time.Minute)
			planted[soak.Regression] = "soak:item:1"
		}
		if during(soak.Missing, 14*time.Second, elapsed, true) {
			c.Del(ctx, "soak:item:2")
			planted[soak.Missing] = "soak:item:2"
		}
		if during(soak.Foreign, 19*time.Second, elapsed, true) {
			c.Set(ctx, "soak:item:3", "not-a-version", time.Minute)
			planted[soak.Foreign] = "soak:item:3"
		}
		// What a partitioned leader writing after its lease would leave: the
		// record of soak:row:4 (found by its suffix) carrying an epoch older
		// than the fence, which the current leader raised long ago.
		if rk == "" {
			keys, _ := c.Keys(ctx, "hearth:ver:*:soak:row:4").Result()
			if len(keys) == 1 {
				rk = keys[0]
			}
		}
		fence, _ := c.Get(ctx, "hearth:fence").Int64()
		cur, _ := c.Get(ctx, rk).Result()
		_, rest, ok := strings.Cut(cur, ":")
		if rk != "" && during(soak.TwoWriters, 24*time.Second, elapsed, ok && fence > 1000) {
			c.Set(ctx, rk, fmt.Sprintf("%d:%s", fence-1000, rest), redis.KeepTTL)
			planted[soak.TwoWriters] = "soak:row:4"
		}
	}
	in, r := run(t, params, 30*time.Second, 1, nil, plant)
	t.Log("\n" + soak.Format(in, r, 1))
	got := map[soak.Rule]string{}
	for _, v := range r.Violations {
		if v.Rule == soak.Staleness && v.Key == planted[soak.Regression] {
			continue // version 1 is also older than the commits after it
		}
		if planted[v.Rule] != v.Key {
			t.Errorf("unexpected violation %s %s: %s", v.Rule, v.Key, v.Detail)
		}
		got[v.Rule] = v.Key
	}
	for rule, key := range planted {
		if got[rule] != key {
			t.Errorf("planted %s on %s, the checker did not see it", rule, key)
		}
	}
	if len(planted) != 4 {
		t.Errorf("only %d of 4 faults planted: %v", len(planted), planted)
	}
}

// run starts the servers and instances, runs plan (and plant, if not nil,
// every 50 ms with the time since every key was warm) for total, and judges.
// With p.Cluster, Redis is a private Cluster: the instances are seeded with
// every node, the observer reads through a cluster client, and the cluster
// track's faults run on their own goroutine (clusterTrack).
func run(t *testing.T, p soak.Params, total time.Duration, seed uint64, plan []soak.Fault, plant func(context.Context, time.Duration, *redis.Client)) (soak.Input, soak.Report) {
	ctx := t.Context()
	var rs *testenv.RedisServer
	var cl *testenv.Cluster
	var obs *redis.Client
	var cobs *redis.ClusterClient
	if p.Cluster {
		cl = testenv.RedisCluster(t)
		cobs = redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), DialTimeout: 300 * time.Millisecond,
			ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond, MaxRetries: -1})
		t.Cleanup(func() { _ = cobs.Close() })
	} else {
		rs = testenv.PrivateRedis(t)
		obs = redis.NewClient(&redis.Options{Addr: rs.Addr, DialTimeout: 300 * time.Millisecond,
			ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond, MaxRetries: -1})
		t.Cleanup(func() { _ = obs.Close() })
	}
	pg := testenv.PrivatePostgres(t)
	proxy := testenv.NewProxy(t, fmt.Sprintf("127.0.0.1:%d", pg.Port))
	pool, err := pgxpool.New(ctx, pg.DSN()+"&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE items (id text PRIMARY KEY, version bigint NOT NULL);
		INSERT INTO items SELECT i::text, 1 FROM generate_series(1, %d) i`, soakKeys)); err != nil {
		t.Fatal(err)
	}
	// Key i and key soakKeys+i are row i+1 in the two families.
	keys := make([]string, 2*soakKeys)
	for i := range soakKeys {
		keys[i] = fmt.Sprintf("soak:item:%d", i+1)
		keys[soakKeys+i] = fmt.Sprintf("soak:row:%d", i+1)
	}
	dsn := fmt.Sprintf("postgres://postgres@%s/test?sslmode=disable&connect_timeout=1", proxy.Addr)
	dir := t.TempDir()
	jitter := 0.1
	insts := make([]*instance, soakInstance)
	for i := range insts {
		name := string(rune('a' + i))
		insts[i] = &instance{name: name, addr: e2e.FreeAddr(t), wantUp: true, cfg: filepath.Join(dir, name+".yaml")}
		if !p.Cluster {
			insts[i].link = testenv.NewProxy(t, rs.Addr)
		}
	}
	// Each instance has its own config file, the same but for the address
	// of its own proxy to Redis. On a Cluster every instance is seeded with
	// every node, directly: Hearth finds the nodes by CLUSTER SLOTS, so a
	// proxy in front of one seed would not carry its traffic.
	writeConfig := func() {
		for _, in := range insts {
			tmp := in.cfg + ".tmp"
			addrs := []string{}
			if p.Cluster {
				addrs = cl.Addrs()
			} else {
				addrs = append(addrs, in.link.Addr)
			}
			if err := os.WriteFile(tmp, []byte(configText(addrs, dsn, jitter)), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, in.cfg); err != nil {
				t.Fatal(err)
			}
		}
	}
	writeConfig()

	var crashes []string
	crashed := map[*e2e.Proc]bool{}
	var procs []*e2e.Proc
	var procNames []string // <instance>-<generation>, for SOAK_LOGS
	checkCrash := func(p *e2e.Proc, id string) {
		if crashed[p] {
			return
		}
		out := p.Output()
		for _, sign := range []string{"panic:", "WARNING: DATA RACE", "fatal error:"} {
			if i := strings.Index(out, sign); i >= 0 {
				crashed[p] = true
				crashes = append(crashes, fmt.Sprintf("%s: %s", id, firstLines(out[i:], 12)))
				return
			}
		}
	}
	start := func(in *instance) {
		in.mu.Lock()
		in.gen++
		in.proc = e2e.Start(t, []string{"run", "--config", in.cfg, "--listen", in.addr})
		procs = append(procs, in.proc)
		procNames = append(procNames, fmt.Sprintf("%s-%d", in.name, in.gen))
		in.mu.Unlock()
	}
	for _, in := range insts {
		start(in)
	}
	// Warm: one leader ready, every key present.
	testenv.Eventually(t, 60*time.Second, "a leader ready and every key warm", func() bool {
		var vals []any
		var err error
		if p.Cluster {
			vals, err = clusterGet(ctx, cobs, keys)
		} else {
			vals, err = obs.MGet(ctx, keys...).Result()
		}
		if err != nil {
			return false
		}
		for _, v := range vals {
			if v == nil {
				return false
			}
		}
		return true
	})
	rec := &recorder{keys: keys, commits: make([][]soak.Commit, soakKeys)}
	if p.Cluster {
		rec.records, rec.fences = clusterNames(t, cobs, keys)
	} else {
		rec.records = recordKeys(t, obs, keys)
	}
	bg, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if p.Cluster {
		wg.Go(func() { rec.observeCluster(bg, cobs) })
	} else {
		addr := rs.Addr // the same port after a restart; Start rewrites the field
		wg.Go(func() {
			rec.observe(bg, func() *redis.Client {
				// One dial per read: a read while Redis is down fails at
				// once, and a new client (after a failed read) has no
				// memory of the failed dials (go-redis's pool stops
				// dialling after PoolSize of them, for up to a second).
				return redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 300 * time.Millisecond,
					ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond, MaxRetries: -1, DialerRetries: 1})
			})
		})
	}
	wg.Go(func() { rec.update(bg, pool, seed) })
	for _, in := range insts {
		wg.Go(func() { rec.scrape(bg, in) })
	}
	begin := time.Now()
	end := begin.Add(total)
	var clusterEvents []soak.Event
	if p.Cluster {
		var own, rest []soak.Fault
		for _, f := range plan {
			if slices.Contains(soak.ClusterKinds, f.Kind) {
				own = append(own, f)
			} else {
				rest = append(rest, f)
			}
		}
		plan = rest
		wg.Go(func() { clusterEvents = clusterTrack(bg, t, cl, own, begin, end, seed) })
	}

	// The executor: starts and ends faults on time, and restarts instances
	// that should be up (a restart while Redis or PostgreSQL is down exits 1:
	// it is tried again a second later).
	rng := rand.New(rand.NewPCG(seed, 1))
	type active struct {
		f     soak.Fault
		ev    int
		until time.Time
		inst  *instance
	}
	var running []active
	var events []soak.Event
	next := 0
	// leader picks the target of an instance or link fault, and says
	// whether it was leading.
	leader := func(standby bool) (*instance, string) {
		var leaders, standbys []*instance
		for _, in := range insts {
			p, _ := in.current()
			if p == nil || p.Exited() {
				continue
			}
			if role(in.addr) == "leader" {
				leaders = append(leaders, in)
			} else {
				standbys = append(standbys, in)
			}
		}
		pick, as := leaders, "leader"
		if standby || len(pick) == 0 {
			pick, as = standbys, "standby"
		}
		if len(pick) == 0 {
			pick, as = leaders, "leader"
		}
		if len(pick) == 0 {
			return nil, ""
		}
		return pick[rng.IntN(len(pick))], as
	}
	for now := time.Now(); now.Before(end); now = time.Now() {
		for next < len(plan) && !begin.Add(plan[next].At).After(now) {
			f := plan[next]
			next++
			ev := soak.Event{Kind: f.Kind, Start: time.Now()}
			a := active{f: f, until: ev.Start.Add(f.For)}
			switch f.Kind {
			case soak.Kill, soak.Term, soak.PauseShort, soak.PauseLong:
				in, as := leader(f.Standby)
				if in == nil {
					ev.Note = "skipped: no instance up"
					ev.End = ev.Start
					events = append(events, ev)
					continue
				}
				p, id := in.current()
				ev.Target, ev.Note = id, as
				a.inst = in
				switch f.Kind {
				case soak.Kill:
					in.mu.Lock()
					in.wantUp, in.upAfter = false, a.until
					in.mu.Unlock()
					_ = p.Cmd.Process.Signal(syscall.SIGKILL)
				case soak.Term:
					in.mu.Lock()
					in.wantUp, in.upAfter = false, a.until
					in.mu.Unlock()
					_ = p.Cmd.Process.Signal(syscall.SIGTERM)
				default:
					_ = p.Cmd.Process.Signal(syscall.SIGSTOP)
				}
			case soak.Reload:
				if jitter == 0.1 {
					jitter = 0.12
				} else {
					jitter = 0.1
				}
				writeConfig()
				for _, in := range insts {
					if p, _ := in.current(); p != nil && !p.Exited() {
						_ = p.Cmd.Process.Signal(syscall.SIGHUP)
					}
				}
				ev.Target, ev.Note = "all", fmt.Sprintf("jitter %g", jitter)
			case soak.RedisDown:
				ev.Target = "redis"
				rec.fastFor(time.Until(a.until) + restartReads) // the first read after the restart comes at once
				rs.Stop(t)
			case soak.RedisFlush:
				ev.Target = "redis"
				if err := obs.FlushDB(ctx).Err(); err != nil {
					ev.Note = "flush failed: " + err.Error()
				}
			case soak.RedisPause:
				ev.Target = "redis"
				rs.Pause(t)
			case soak.PGDown:
				ev.Target = "postgres"
				pg.Stop(t)
			case soak.OriginSlow:
				ev.Target, ev.Note = "proxy", f.Latency.String()
				proxy.SetLatency(t, f.Latency)
			case soak.OriginReset:
				ev.Target = "proxy"
				proxy.Cut(t)
			case soak.LinkSlow, soak.LinkNarrow, soak.LinkReset, soak.LinkCut, soak.LinkRenew:
				in, as := leader(f.Standby)
				if in == nil {
					in, as = insts[rng.IntN(len(insts))], "down" // none up: its link is cut all the same
				}
				_, ev.Target = in.current()
				ev.Note = as
				a.inst = in
				switch f.Kind {
				case soak.LinkSlow:
					ev.Note += fmt.Sprintf(", %s each way", f.Latency.Round(time.Millisecond))
					in.link.SetLatency(t, f.Latency)
				case soak.LinkNarrow:
					ev.Note += fmt.Sprintf(", %d KB/s", f.Rate)
					in.link.SetBandwidth(t, f.Rate)
				case soak.LinkReset:
					in.link.ResetPeers(t)
				case soak.LinkCut:
					in.link.Timeout(t) // a black hole: requests and replies dropped, nothing refused
				case soak.LinkRenew:
					ev.Note += fmt.Sprintf(", %s on replies", f.Latency.Round(time.Millisecond))
					in.link.SetReplyLatency(t, f.Latency)
				}
			}
			events = append(events, ev)
			a.ev = len(events) - 1
			running = append(running, a)
		}
		kept := running[:0]
		for _, a := range running {
			if now.Before(a.until) {
				kept = append(kept, a)
				continue
			}
			switch a.f.Kind {
			case soak.Kill, soak.Term:
				a.inst.mu.Lock()
				a.inst.wantUp = true
				a.inst.mu.Unlock()
			case soak.PauseShort, soak.PauseLong:
				if p, id := a.inst.current(); id == events[a.ev].Target {
					_ = p.Cmd.Process.Signal(syscall.SIGCONT)
				}
			case soak.RedisDown:
				rec.fastFor(restartReads)
				events[a.ev].Up = rs.StartTimed(t)
			case soak.RedisPause:
				rs.Resume(t)
			case soak.PGDown:
				pg.Start(t)
			case soak.OriginSlow, soak.OriginReset:
				proxy.Restore(t)
			case soak.LinkSlow, soak.LinkNarrow, soak.LinkReset, soak.LinkCut, soak.LinkRenew:
				a.inst.link.Restore(t)
			}
			events[a.ev].End = time.Now()
		}
		running = kept
		for _, in := range insts {
			in.mu.Lock()
			p, want, after := in.proc, in.wantUp, in.upAfter
			in.mu.Unlock()
			if p != nil && p.Exited() {
				checkCrash(p, in.id())
			}
			if want && (p == nil || p.Exited()) && !now.Before(after) {
				if p != nil {
					in.mu.Lock()
					in.upAfter = now.Add(time.Second)
					in.mu.Unlock()
				}
				start(in)
			}
		}
		if plant != nil {
			plant(ctx, now.Sub(begin), obs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	wg.Wait()
	for _, p := range procs {
		checkCrash(p, "a process")
	}
	if dir := os.Getenv("SOAK_LOGS"); dir != "" {
		// Every process's log, passing run or not (make soak LOGS=dir).
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, p := range procs {
			if err := os.WriteFile(filepath.Join(dir, procNames[i]+".log"), []byte(p.Output()), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("instance logs in %s", dir)
	}

	events = append(events, clusterEvents...)
	sort.SliceStable(events, func(i, j int) bool { return events[i].Start.Before(events[j].Start) })
	in := rec.input()
	in.Params, in.Start, in.End, in.Keys, in.Events, in.Crashes = p, begin, time.Now(), keys, events, crashes
	in.LeaseKey = leaseKey
	return in, soak.Judge(in)
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

var probe = &http.Client{Timeout: 300 * time.Millisecond}

// role asks an instance's /healthz for its role ("" if it does not answer).
func role(addr string) string {
	resp, err := probe.Get("http://" + addr + "/healthz")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		b.WriteString(sc.Text())
	}
	if strings.Contains(b.String(), `"role":"leader"`) {
		return "leader"
	}
	return "standby"
}

// recorder holds what the observer, the updater and the scrapers saw.
type recorder struct {
	keys []string
	// records[i] is the name of keys[i]'s version record, "" for none;
	// fences[i] its fence's on a Cluster.
	records, fences []string

	mu      sync.Mutex
	reads   []soak.Read
	commits [][]soak.Commit
	samples []soak.Sample

	// fastUntil (Unix ns): until then the observer reads every
	// fastReadEvery, not every 100 ms (after a Redis restart).
	fastUntil atomic.Int64
}

// After a Redis restart the observer reads every key every fastReadEvery for
// restartReads, so that the time to every key back after Redis accepted
// connections again (soak.BackAfter) is measured to about 10 ms, not 100.
const (
	fastReadEvery = 10 * time.Millisecond
	restartReads  = 5 * time.Second
)

// fastFor makes the observer read every fastReadEvery for d from now.
func (r *recorder) fastFor(d time.Duration) { r.fastUntil.Store(time.Now().Add(d).UnixNano()) }

func (r *recorder) input() soak.Input {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Both families read the same rows: key soakKeys+i has row i's commits.
	commits := append(append([][]soak.Commit(nil), r.commits...), r.commits...)
	return soak.Input{Reads: r.reads, Commits: commits, Samples: r.samples}
}

// recordKeys finds the version record of each key by SCAN over Hearth's
// namespace (<ns>:ver:{slot}:<key>, docs/prewarm.md), once every key is warm:
// the names are fixed, and finding them by their suffix leaves the hash slot
// tag to Hearth. It waits until every key of the row family has one.
func recordKeys(t *testing.T, c *redis.Client, keys []string) []string {
	t.Helper()
	out := make([]string, len(keys))
	testenv.Eventually(t, 30*time.Second, "a version record for every row key", func() bool {
		byKey := map[string]string{}
		iter := c.Scan(t.Context(), 0, "hearth:ver:*", 1000).Iterator()
		for iter.Next(t.Context()) {
			name := iter.Val()
			if _, key, ok := strings.Cut(name, "}:"); ok {
				byKey[key] = name
			}
		}
		if iter.Err() != nil {
			return false
		}
		for i, k := range keys {
			out[i] = byKey[k]
			if strings.HasPrefix(k, "soak:row:") && out[i] == "" {
				return false
			}
		}
		return true
	})
	return out
}

// observe reads every key every 100 ms (fastReadEvery after a restart) with
// one MGET, with the version records, the fence and the lease, on a client
// from dial, replaced after a failed read. A read that fails (Redis down or
// paused) judges nothing.
func (r *recorder) observe(ctx context.Context, dial func() *redis.Client) {
	c := dial()
	defer func() { _ = c.Close() }()
	names := append([]string(nil), r.keys...)
	var withRecord []int
	for i, rk := range r.records {
		if rk != "" {
			names = append(names, rk)
			withRecord = append(withRecord, i)
		}
	}
	names = append(names, fenceKey, leaseKey)
	next := time.Now()
	for {
		every := 100 * time.Millisecond
		if time.Now().UnixNano() < r.fastUntil.Load() {
			every = fastReadEvery
		}
		next = next.Add(every)
		if now := time.Now(); next.Before(now) {
			next = now
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		sent := time.Now()
		all, err := c.MGet(ctx, names...).Result()
		recv := time.Now()
		if err != nil {
			_ = c.Close()
			c = dial()
			continue
		}
		vals := all[:len(r.keys)]
		rd := soak.Read{Sent: sent, Recv: recv, Versions: make([]int64, len(vals)), Records: make([]string, len(vals)),
			Fence: epochOf(all[len(names)-2]), Lease: epochOf(all[len(names)-1])}
		for j, i := range withRecord {
			rd.Records[i], _ = all[len(r.keys)+j].(string)
		}
		for i, v := range vals {
			rd.Versions[i] = versionOf(v)
			if rd.Versions[i] == -2 {
				if rd.Raw == nil {
					rd.Raw = make([]string, len(vals))
				}
				rd.Raw[i], _ = v.(string)
			}
		}
		r.mu.Lock()
		r.reads = append(r.reads, rd)
		r.mu.Unlock()
	}
}

// epochOf reads the epoch a fence (<epoch>) or a lease (<epoch>:<holder>)
// holds: 0 when absent or not a number.
func epochOf(v any) int64 {
	s, _ := v.(string)
	s, _, _ = strings.Cut(s, ":")
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// update bumps a random row's version every 50 ms, straight to PostgreSQL
// (not through the proxy), and records when each commit returned.
func (r *recorder) update(ctx context.Context, pool *pgxpool.Pool, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 2))
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		i := rng.IntN(len(r.commits))
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		var v int64
		err := pool.QueryRow(cctx, `UPDATE items SET version = version + 1 WHERE id = $1 RETURNING version`, strconv.Itoa(i+1)).Scan(&v)
		cancel()
		if err != nil {
			continue // PostgreSQL down: an unknown outcome is simply not recorded
		}
		ack := time.Now()
		r.mu.Lock()
		cs := r.commits[i]
		if len(cs) == 0 || cs[len(cs)-1].Version < v {
			r.commits[i] = append(cs, soak.Commit{Version: v, Ack: ack})
		}
		r.mu.Unlock()
	}
}

// scrape reads an instance's /metrics every 250 ms.
func (r *recorder) scrape(ctx context.Context, in *instance) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		id := in.id()
		sent := time.Now()
		m, err := scrapeMetrics(ctx, in.addr)
		recv := time.Now()
		if err != nil || in.id() != id {
			continue
		}
		s := soak.Sample{Proc: id, Sent: sent, Recv: recv, Leader: m["hearth_leader"] == 1,
			Epoch: int64(m["hearth_leader_epoch"]), Writes: m["hearth_keys_written_total"] + m["hearth_stale_extensions_total"]}
		r.mu.Lock()
		r.samples = append(r.samples, s)
		r.mu.Unlock()
	}
}

// scrapeMetrics sums each metric's series by name.
func scrapeMetrics(ctx context.Context, addr string) (map[string]float64, error) {
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, errors.New(resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		name, _, _ := strings.Cut(line[:i], "{")
		out[name] += v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if _, ok := out["hearth_leader"]; !ok {
		return nil, errors.New("no hearth_leader in /metrics")
	}
	return out, nil
}
