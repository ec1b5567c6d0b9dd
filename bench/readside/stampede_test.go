// Package readside_test benchmarks the read side (package readside) against
// its peers on the stampede workload of issue 15. It is a module of its own
// so that the peers (go-redis/cache, sturdyc) are never dependencies of
// Hearth's: run it with `make bench` or
//
//	cd bench/readside && go test -run '^$' -bench . -benchtime 1x -timeout 30m
//
// READSIDE_BENCH_DURATION (default 20s) sets each run's length; the issue's
// figures are for 60s. READSIDE_BENCH_BETAS adds readside rows with other β
// (and Jitter) values, the sweep behind readside.DefaultBeta:
//
//	READSIDE_BENCH_DURATION=60s READSIDE_BENCH_BETAS=0.2,0.3,0.5,1,0.3/-1 \
//	  go test -run '^$' -bench 'Stampede/^readside_β=.*$/flush' -benchtime 1x .
package readside_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gocache "github.com/go-redis/cache/v9"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/viccon/sturdyc"
	"golang.org/x/sync/singleflight"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/readside"
)

const (
	instances   = 4  // application instances, each its own client and cache
	readersEach = 50 // 200 readers in all
	keys        = 100
	zipfS       = 1.1
	originDelay = 50 * time.Millisecond
	ttl         = 10 * time.Second
	readPace    = 20 * time.Millisecond // each reader's pause between reads
	episodeGap  = 10 * originDelay
)

func TestMain(m *testing.M) { testenv.Main(m) }

// origin is the shared database: it counts loads per key and takes 50 ms.
type origin struct {
	loads [keys]atomic.Int64
	// ideal counts what a perfect fleet-wide cache would load: one load per
	// key each time its value, loaded at a read, has lived TTL, or after a
	// flush.
	mu        [keys]sync.Mutex
	validTill [keys]time.Time
	ideal     [keys]int64
	// episodes counts, per key, the loads that start more than episodeGap
	// after the previous episode began: the expiries (or flushes) the origin
	// saw, whatever TTL, jitter or early refresh the contender applies; the
	// loads of one stampede all start within one load time. Loads per
	// episode is the stampede's size.
	lmu         [keys]sync.Mutex
	episodeFrom [keys]time.Time
	episodes    [keys]int64
	// starts holds every load's start time per key, for the steady-state
	// rate (see steadyWindow).
	starts [keys][]time.Time
}

func (o *origin) load(ctx context.Context, i int) ([]byte, error) {
	o.loads[i].Add(1)
	now := time.Now()
	o.lmu[i].Lock()
	o.starts[i] = append(o.starts[i], now)
	if o.episodes[i] == 0 || now.Sub(o.episodeFrom[i]) > episodeGap {
		o.episodes[i]++
		o.episodeFrom[i] = now
	}
	o.lmu[i].Unlock()
	select {
	case <-time.After(originDelay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return []byte("value-" + strconv.Itoa(i) + "-0123456789abcdef0123456789abcdef"), nil
}

func (o *origin) read(i int, now time.Time) {
	o.mu[i].Lock()
	if !now.Before(o.validTill[i]) {
		o.ideal[i]++
		o.validTill[i] = now.Add(originDelay + ttl)
	}
	o.mu[i].Unlock()
}

func (o *origin) flushed() {
	for i := range keys {
		o.mu[i].Lock()
		o.validTill[i] = time.Time{}
		o.mu[i].Unlock()
	}
}

// contender is one caching library, as one application instance uses it.
type contender struct {
	name string
	// open returns one instance's read function, its miss counter and its close.
	open func(rdb *redis.Client, o *origin) (get func(ctx context.Context, i int) ([]byte, error), misses func() float64, close func())
}

func key(i int) string { return "bench:key:" + strconv.Itoa(i) }

var contenders = append([]contender{
	// The reference: the fastest correct simple reader, sharing no code with
	// readside (see plainLock).
	{"plain lock (reference)", plainLock},
	readsideContender("readside", readside.LocalOptions{}),
	// The near cache with the documented 1 s staleness bound.
	readsideContender("readside+local", readside.LocalOptions{Size: 1000, TTL: time.Second}),
	// The near cache with Local.TTL = TTL, so a copy lives to its Redis
	// expiry: the staleness sturdyc's in-memory layer has, like with like.
	readsideContender("readside+local 10s", readside.LocalOptions{Size: 1000, TTL: ttl}),
	{"go-redis/cache Once", func(rdb *redis.Client, o *origin) (func(context.Context, int) ([]byte, error), func() float64, func()) {
		c := gocache.New(&gocache.Options{Redis: rdb, StatsEnabled: true})
		get := func(ctx context.Context, i int) ([]byte, error) {
			var v []byte
			err := c.Once(&gocache.Item{Ctx: ctx, Key: key(i), Value: &v, TTL: ttl,
				Do: func(it *gocache.Item) (any, error) { return o.load(it.Ctx, i) }})
			return v, err
		}
		return get, func() float64 { return float64(c.Stats().Misses) }, func() {}
	}},
	{"sturdyc + Redis storage", func(rdb *redis.Client, o *origin) (func(context.Context, int) ([]byte, error), func() float64, func()) {
		m := &sturdyMisses{}
		c := sturdyc.New[[]byte](10_000, 10, ttl, 10,
			sturdyc.WithDistributedStorage(redisStorage{rdb}), sturdyc.WithMetrics(m))
		get := func(ctx context.Context, i int) ([]byte, error) {
			return c.GetOrFetch(ctx, key(i), func(ctx context.Context) ([]byte, error) { return o.load(ctx, i) })
		}
		return get, func() float64 { return float64(m.n.Load()) }, func() {}
	}},
	{"plain cache-aside", func(rdb *redis.Client, o *origin) (func(context.Context, int) ([]byte, error), func() float64, func()) {
		var misses atomic.Int64
		get := func(ctx context.Context, i int) ([]byte, error) {
			v, err := rdb.Get(ctx, key(i)).Bytes()
			if err == nil {
				return v, nil
			}
			if !errors.Is(err, redis.Nil) {
				return nil, err
			}
			misses.Add(1)
			v, err = o.load(ctx, i)
			if err != nil {
				return nil, err
			}
			return v, rdb.Set(ctx, key(i), v, ttl).Err()
		}
		return get, func() float64 { return float64(misses.Load()) }, func() {}
	}},
}, betaContenders()...)

// betaContenders are readside rows with β from READSIDE_BENCH_BETAS (a
// comma-separated list, e.g. "0.1,0.2,0.5,1"; -1 is XFetch off), for the
// sweep that chose readside's default β; none when unset. An entry
// "β/j" also sets Jitter to j (-1: none).
func betaContenders() []contender {
	var cs []contender
	for _, f := range strings.Split(os.Getenv("READSIDE_BENCH_BETAS"), ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		bs, js, hasJ := strings.Cut(f, "/")
		beta, err := strconv.ParseFloat(bs, 64)
		var jitter float64
		if err == nil && hasJ {
			jitter, err = strconv.ParseFloat(js, 64)
		}
		if err != nil {
			panic(fmt.Sprintf("READSIDE_BENCH_BETAS: %q: %v", f, err))
		}
		name := "readside β=" + bs
		if hasJ {
			name += " jitter=" + js
		}
		cs = append(cs, readsideContenderOpts(name, readside.Options{Beta: beta, Jitter: jitter}))
	}
	return cs
}

// The reference's lock: its lifetime and its compare-and-delete release.
const refLockTTL = 5 * time.Second

var refRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// plainLock is the reference reader: GET; on a miss, single-flight in the
// process, then SET NX PX lock, a double-check GET, load, SET and release in
// one round trip; a waiter polls GET every 5 ms and retries the lock, and
// loads anyway once the lock's lifetime and 1 s have passed.
func plainLock(rdb *redis.Client, o *origin) (func(context.Context, int) ([]byte, error), func() float64, func()) {
	var sf singleflight.Group
	var misses atomic.Int64
	loadAndSet := func(ctx context.Context, i int, lock, token string) ([]byte, error) {
		v, err := o.load(ctx, i)
		if err != nil {
			return nil, err
		}
		pipe := rdb.Pipeline()
		pipe.Set(ctx, key(i), v, ttl)
		if token != "" {
			refRelease.Eval(ctx, pipe, []string{lock}, token)
		}
		_, err = pipe.Exec(ctx)
		return v, err
	}
	fill := func(ctx context.Context, i int) ([]byte, error) {
		lock, token := "bench:lock:"+key(i), strconv.FormatUint(rand.Uint64(), 36)
		for deadline := time.Now().Add(refLockTTL + time.Second); time.Now().Before(deadline); {
			ok, err := rdb.SetNX(ctx, lock, token, refLockTTL).Result()
			if err != nil {
				return nil, err
			}
			if ok {
				if v, err := rdb.Get(ctx, key(i)).Bytes(); err == nil { // double-check
					refRelease.Run(ctx, rdb, []string{lock}, token)
					return v, nil
				}
				return loadAndSet(ctx, i, lock, token)
			}
			time.Sleep(5 * time.Millisecond)
			if v, err := rdb.Get(ctx, key(i)).Bytes(); err == nil {
				return v, nil
			}
		}
		return loadAndSet(ctx, i, "", "") // the holder is gone or slow: load anyway
	}
	get := func(ctx context.Context, i int) ([]byte, error) {
		v, err := rdb.Get(ctx, key(i)).Bytes()
		if !errors.Is(err, redis.Nil) {
			return v, err
		}
		misses.Add(1)
		r, err, shared := sf.Do(key(i), func() (any, error) { return fill(ctx, i) })
		v, _ = r.([]byte)
		if shared {
			v = slices.Clone(v)
		}
		return v, err
	}
	return get, func() float64 { return float64(misses.Load()) }, func() {}
}

// readsideContender is the read side, with the near cache local (none
// when its Size is 0).
func readsideContender(name string, local readside.LocalOptions) contender {
	return readsideContenderOpts(name, readside.Options{Local: local})
}

// readsideContenderOpts is the read side with opts, on the bench's client,
// namespace, TTL and access sampling.
func readsideContenderOpts(name string, opts readside.Options) contender {
	return contender{name, func(rdb *redis.Client, o *origin) (func(context.Context, int) ([]byte, error), func() float64, func()) {
		reg := prometheus.NewRegistry()
		opts := opts
		opts.Client, opts.Namespace, opts.TTL, opts.AccessSample, opts.Registerer = rdb, "bench", ttl, 10, reg
		c, err := readside.New(opts)
		if err != nil {
			panic(err)
		}
		get := func(ctx context.Context, i int) ([]byte, error) {
			return c.GetOrLoad(ctx, key(i), func(ctx context.Context) ([]byte, error) { return o.load(ctx, i) })
		}
		return get, func() float64 { return gathered(reg, "hearth_readside_misses_total") },
			func() { _ = c.Close(context.Background()) }
	}}
}

func gathered(g prometheus.Gatherer, name string) float64 {
	mfs, _ := g.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			var s float64
			for _, m := range mf.GetMetric() {
				s += m.GetCounter().GetValue()
			}
			return s
		}
	}
	return 0
}

// redisStorage is sturdyc's distributed storage on Redis, with the TTL.
type redisStorage struct{ rdb *redis.Client }

func (s redisStorage) Get(ctx context.Context, key string) ([]byte, bool) {
	v, err := s.rdb.Get(ctx, key).Bytes()
	return v, err == nil
}

func (s redisStorage) Set(ctx context.Context, key string, value []byte) {
	s.rdb.Set(ctx, key, value, ttl)
}

func (s redisStorage) GetBatch(ctx context.Context, keys []string) map[string][]byte {
	out := map[string][]byte{}
	vals, err := s.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return out
	}
	for i, v := range vals {
		if str, ok := v.(string); ok {
			out[keys[i]] = []byte(str)
		}
	}
	return out
}

func (s redisStorage) SetBatch(ctx context.Context, records map[string][]byte) {
	pipe := s.rdb.Pipeline()
	for k, v := range records {
		pipe.Set(ctx, k, v, ttl)
	}
	_, _ = pipe.Exec(ctx)
}

// sturdyMisses counts sturdyc's cache misses; the rest of its recorder is a no-op.
type sturdyMisses struct{ n atomic.Int64 }

func (m *sturdyMisses) CacheHit()                   {}
func (m *sturdyMisses) CacheMiss()                  { m.n.Add(1) }
func (m *sturdyMisses) AsynchronousRefresh()        {}
func (m *sturdyMisses) SynchronousRefresh()         {}
func (m *sturdyMisses) MissingRecord()              {}
func (m *sturdyMisses) ForcedEviction()             {}
func (m *sturdyMisses) EntriesEvicted(int)          {}
func (m *sturdyMisses) ShardIndex(int)              {}
func (m *sturdyMisses) CacheBatchRefreshSize(int)   {}
func (m *sturdyMisses) ObserveCacheSize(func() int) {}

func duration(b *testing.B) time.Duration {
	s := os.Getenv("READSIDE_BENCH_DURATION")
	if s == "" {
		return 20 * time.Second
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		b.Fatalf("READSIDE_BENCH_DURATION=%q: want a positive duration", s)
	}
	return d
}

type result struct {
	loads, ideal, episodes, misses, errors, reads int64
	p99, max, wall                                time.Duration
	// intervals and span are the steady-state sample: per key and per
	// segment of the run (start to FLUSHDB, FLUSHDB to end), the gaps
	// between consecutive loads counted, and the time from the segment's
	// first load to its last, summed over keys and segments.
	intervals int64
	span      time.Duration
	// repeats counts the gaps of that sample shorter than episodeGap: a
	// second load of one expiry within a segment (a load just before the
	// FLUSHDB and the one after it are two segments' and not counted).
	repeats int64
	// repeatAt is when each repeat started, from the FLUSHDB (from the
	// start without one).
	repeatAt []time.Duration
}

// perWindow is the origin's cost: loads per key per TTL window of wall
// time, total loads / (keys × wall / TTL). Unlike loads per episode it
// counts an early refresh that shortens every window as the extra load it
// is. A cache that loads each key once per TTL scores about 1 (the loads
// at the start are counted, so a run of n windows holds n loads per key,
// and a FLUSHDB adds up to one more); a run of a few TTLs or less
// overstates it, since every key's first load is counted, and with jittered
// TTLs whether a segment's jittered windows fit once more into it adds up
// to one load per key per segment: steadyWindow is the rate without that.
func (r result) perWindow() float64 {
	return float64(r.loads) / (keys * r.wall.Seconds() / ttl.Seconds())
}

// steadyWindow is the origin's cost rate without the run's edges: loads
// per key per TTL window measured between loads, intervals × TTL / span.
// Every load after a segment's first is counted against the time since
// that first load, so an early refresh that shortens every window still
// counts as its extra load (a shorter gap), and so does any second load of
// one expiry (a gap of a few milliseconds); what is left out is the first
// load after the start and after the FLUSHDB, which every cache must do,
// and the part of each segment after its last load, whose length (0 to a
// whole TTL) decides whether a run counts one load more or fewer.
func (r result) steadyWindow() float64 {
	if r.span <= 0 {
		return 0
	}
	return float64(r.intervals) * ttl.Seconds() / r.span.Seconds()
}

// gaps adds to r the steady-state sample of starts (one key's load start
// times, in order), cut into segments at flushAt (zero: none).
func (r *result) gaps(starts []time.Time, flushAt time.Time) {
	from := flushAt
	if from.IsZero() && len(starts) > 0 {
		from = starts[0]
	}
	seg := func(ts []time.Time) {
		if len(ts) < 2 {
			return
		}
		r.intervals += int64(len(ts) - 1)
		r.span += ts[len(ts)-1].Sub(ts[0])
		for k := 1; k < len(ts); k++ {
			if ts[k].Sub(ts[k-1]) <= episodeGap {
				r.repeats++
				r.repeatAt = append(r.repeatAt, ts[k].Sub(from))
			}
		}
	}
	// Loads append their start under the key's lock after reading the
	// clock, so two that start together may be out of order.
	slices.SortFunc(starts, time.Time.Compare)
	cut := len(starts)
	if !flushAt.IsZero() {
		cut, _ = slices.BinarySearchFunc(starts, flushAt, func(t, f time.Time) int { return t.Compare(f) })
	}
	seg(starts[:cut])
	seg(starts[cut:])
}

// run drives one contender for d: 4 instances × 50 readers, Zipf(1.1) over
// 100 keys, each reader pausing readPace between reads; with flush, one
// FLUSHDB half-way.
func run(b *testing.B, srv *testenv.RedisServer, c contender, d time.Duration, flush bool) result {
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer admin.Close()
	if err := admin.FlushDB(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	o := &origin{}
	var res result
	var misses []func() float64
	var closers []func()
	var wg sync.WaitGroup
	var errCount, reads atomic.Int64
	lat := make([][]time.Duration, instances*readersEach)
	start := time.Now()
	stop := start.Add(d)
	var clients []*redis.Client
	for in := range instances {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: readersEach + 10})
		clients = append(clients, rdb)
		get, m, cl := c.open(rdb, o)
		misses = append(misses, m)
		closers = append(closers, func() { cl(); _ = rdb.Close() })
		for r := range readersEach {
			wg.Go(func() {
				id := in*readersEach + r
				rng := rand.New(rand.NewPCG(uint64(id), 7))
				z := rand.NewZipf(rng, zipfS, 1, keys-1)
				// Start the readers spread over one pace.
				time.Sleep(time.Duration(rng.Int64N(int64(readPace))))
				for time.Now().Before(stop) {
					i := int(z.Uint64())
					t0 := time.Now()
					o.read(i, t0)
					v, err := get(ctx, i)
					lat[id] = append(lat[id], time.Since(t0))
					reads.Add(1)
					if err != nil || len(v) == 0 {
						errCount.Add(1)
					}
					time.Sleep(readPace)
				}
			})
		}
	}
	var flushAt time.Time
	if flush {
		// Each instance flushes at d/2, as an operator's FLUSHDB run from
		// every application host would: four FLUSHDBs within a millisecond.
		time.Sleep(time.Until(start.Add(d / 2)))
		flushAt = time.Now() // loads from here on are the flush's segment
		var fwg sync.WaitGroup
		for _, rdb := range clients {
			fwg.Go(func() {
				if err := rdb.FlushDB(ctx).Err(); err != nil {
					b.Error(err)
				}
			})
		}
		fwg.Wait()
		o.flushed()
	}
	wg.Wait()
	res.wall = time.Since(start)
	for _, cl := range closers {
		cl()
	}
	res.errors, res.reads = errCount.Load(), reads.Load()
	for i := range keys {
		res.loads += o.loads[i].Load()
		res.ideal += o.ideal[i]
		o.lmu[i].Lock()
		res.episodes += o.episodes[i]
		res.gaps(o.starts[i], flushAt)
		o.lmu[i].Unlock()
	}
	for _, m := range misses {
		res.misses += int64(m())
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		res.p99 = all[len(all)*99/100]
		res.max = all[len(all)-1]
	}
	return res
}

// BenchmarkStampede prints, per contender and scenario: origin loads; loads
// per key per TTL window of wall time (the cost figure, see perWindow) and
// the same rate without the run's edges (steady, see steadyWindow) and the
// second loads of one expiry it holds (repeats); the
// load episodes the origin saw (one per key per expiry or flush) and loads per
// episode — 1.000 is one load per key per expiry across the fleet, blind to
// early refreshes that shorten every window —; the loads a perfect fleet-wide
// cache with this TTL would do (ideal); misses as each library counts them
// (sturdyc: its in-memory misses); and p99 and max read latency.
//
// The four instances run in this one process, each with its own Redis client
// and connection pool and its own cache (single-flight, in-flight refreshes,
// near cache): what one instance knows of another goes through Redis only,
// as between processes. They do share one Go runtime (scheduler, GC) and the
// origin's counters. Select rows with -bench, e.g.
// -bench 'Stampede/(plain_lock|readside)/flush'.
func BenchmarkStampede(b *testing.B) {
	srv := testenv.PrivateRedis(b)
	d := duration(b)
	for _, flush := range []bool{false, true} {
		scenario := "steady"
		if flush {
			scenario = "FLUSHDB at " + (d / 2).String() + " in each instance"
		}
		fmt.Printf("\n%d instances × %d readers, Zipf(%.1f) over %d keys, origin %s, TTL %s, %s, %s\n",
			instances, readersEach, zipfS, keys, originDelay, ttl, d, scenario)
		fmt.Printf("%-24s %6s %15s %8s %7s %8s %16s %6s %10s %7s %9s %9s %7s %6s\n", "contender", "loads", "loads/key/window", "steady", "repeats", "episodes",
			"loads/key/expiry", "ideal", "loads/ideal", "misses", "p99", "max", "reads", "errors")
		for _, c := range contenders {
			b.Run(c.name+"/"+map[bool]string{false: "steady", true: "flush"}[flush], func(b *testing.B) {
				for range b.N {
					r := run(b, srv, c, d, flush)
					ratio := float64(r.loads) / float64(max(r.episodes, 1))
					fmt.Printf("%-24s %6d %15.3f %8.3f %7d %8d %16.3f %6d %10.3f %7d %9s %9s %7d %6d\n", c.name, r.loads, r.perWindow(), r.steadyWindow(), r.repeats, r.episodes, ratio,
						r.ideal, float64(r.loads)/float64(max(r.ideal, 1)), r.misses,
						r.p99.Round(10*time.Microsecond), r.max.Round(10*time.Microsecond), r.reads, r.errors)
					if len(r.repeatAt) > 0 {
						fmt.Printf("%-24s repeats started at %v from the FLUSHDB (or the start)\n", "", r.repeatAt)
					}
					b.ReportMetric(r.perWindow(), "loads/key/window")
					b.ReportMetric(r.steadyWindow(), "loads/key/window-steady")
					b.ReportMetric(ratio, "loads/key/expiry")
					b.ReportMetric(float64(r.p99.Microseconds()), "p99-µs")
				}
			})
		}
	}
}
