// Package demo is `hearth demo`: a stampede shown live, then prevented. It runs
// concurrent cache-aside readers against an embedded Redis (miniredis on
// loopback, or a real one) and a slow origin (an embedded HTTP server, or a
// real PostgreSQL), first on their own and then with Hearth's real warmer and
// scheduler keeping the keys warm, and prints what both phases did.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/daemon"
	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// Options shapes a demo run; start from DefaultOptions.
type Options struct {
	// Duration is the length of each of the two phases.
	Duration time.Duration
	// Readers is the number of concurrent cache-aside readers.
	Readers int
	// Keys is the number of hot keys the readers read.
	Keys int
	// TTL is the keys' time to live; Hearth refreshes them every TTL/2.
	TTL time.Duration
	// OriginLatency is what one origin call costs.
	OriginLatency time.Duration
	// ReadPause is each reader's pause between two reads.
	ReadPause time.Duration
	// RedisAddr points at a real Redis instead of the embedded one; the demo's
	// keys live under a prefix of their own and are deleted at the end.
	RedisAddr string
	// PostgresDSN makes a real PostgreSQL the origin instead of the embedded
	// HTTP one; the demo's table lives in a schema of its own, dropped at the end.
	PostgresDSN string
	// Listen, when set, is the host:port Run serves /metrics on (the
	// Registerer's metrics) while the demo runs.
	Listen string
	// Registerer receives the demo's and Hearth's metrics.
	Registerer prometheus.Registerer
	// Out receives the live view and the summary.
	Out io.Writer
	// Logger receives Hearth's own logs.
	Logger zerolog.Logger
}

// Defaults of `hearth demo`: two phases of 15 s, so that `make demo` ends within
// a minute, each showing the cold start and three TTL boundaries.
const (
	DefaultDuration      = 15 * time.Second
	DefaultReaders       = 32
	DefaultKeys          = 20
	DefaultTTL           = 4 * time.Second
	DefaultOriginLatency = 50 * time.Millisecond
	DefaultReadPause     = 10 * time.Millisecond
)

// Phase is what the readers and the origin saw during one phase.
type Phase struct {
	Name        string
	Seconds     float64
	Reads       int64
	Misses      int64
	OriginCalls int64
	// Peak values are the largest per-second counts.
	PeakMisses      int64
	PeakOriginCalls int64
}

// MissRate is the fraction of reads that missed.
func (p Phase) MissRate() float64 {
	if p.Reads == 0 {
		return 0
	}
	return float64(p.Misses) / float64(p.Reads)
}

// Result is the outcome of both phases.
type Result struct {
	Without, With Phase
}

// DefaultOptions returns the options of a plain `hearth demo`.
func DefaultOptions() Options {
	return Options{
		Duration: DefaultDuration, Readers: DefaultReaders, Keys: DefaultKeys, TTL: DefaultTTL,
		OriginLatency: DefaultOriginLatency, ReadPause: DefaultReadPause,
	}
}

// Check fills in the defaults of Registerer and Out and checks the options,
// naming the flag of a bad one; Run calls it first.
func (o *Options) Check() error {
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	switch {
	case o.Duration < time.Second:
		return fmt.Errorf("--duration: must be at least 1s (got %s)", o.Duration)
	case o.Readers < 1 || o.Readers > 1000:
		return fmt.Errorf("--readers: must be between 1 and 1000 (got %d)", o.Readers)
	case o.Keys < 1 || o.Keys > 10000:
		return fmt.Errorf("--keys: must be between 1 and 10000 (got %d)", o.Keys)
	case o.TTL < time.Second:
		return fmt.Errorf("--ttl: must be at least 1s (got %s)", o.TTL)
	case strings.Contains(o.RedisAddr, "://") && !validRedisURL(o.RedisAddr):
		return fmt.Errorf("--redis: not a redis:// URL (want host:port or redis://[user:password@]host:port/db)")
	case o.ReadPause < 0:
		return fmt.Errorf("--read-pause: must be >= 0 (got %s)", o.ReadPause)
	case o.OriginLatency < 0 || o.OriginLatency > o.loadTimeout()/2:
		return fmt.Errorf("--origin-latency: must be between 0 and %s for --ttl %s, so that Hearth's load (timeout %s) always finishes within TTL/2 (got %s)",
			o.loadTimeout()/2, o.TTL, o.loadTimeout(), o.OriginLatency)
	}
	if o.Listen != "" {
		if err := checkListen(o.Listen); err != nil {
			return fmt.Errorf("--listen: %w", err)
		}
		if _, ok := o.Registerer.(*prometheus.Registry); !ok {
			return fmt.Errorf("--listen: the Registerer must be a *prometheus.Registry to be served (got %T)", o.Registerer)
		}
	}
	return nil
}

// checkListen checks a host:port to listen on before anything starts.
func checkListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("must be host:port (got %q)", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		return fmt.Errorf("port must be a number from 0 to 65535 (got %q in %q)", port, addr)
	}
	return nil
}

func validRedisURL(u string) bool {
	_, err := redis.ParseURL(u)
	return err == nil
}

// loadTimeout leaves room for Hearth's rule that the shortest jittered TTL
// (0.9 × TTL) exceed the interval (TTL/2) plus the load timeout.
func (o *Options) loadTimeout() time.Duration { return o.TTL / 5 }

// Run runs both phases and writes the live view and the summary to Out.
func Run(ctx context.Context, opts Options) (Result, error) {
	if err := opts.Check(); err != nil {
		return Result{}, err
	}
	out := opts.Out
	if opts.Listen != "" {
		shutdown, err := daemon.ServeMetrics(opts.Listen, opts.Registerer.(*prometheus.Registry), opts.Logger)
		if err != nil {
			return Result{}, err
		}
		defer func() { _ = shutdown(ctx) }()
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	runID := hex.EncodeToString(b)

	var (
		addr    = opts.RedisAddr
		redisIs string
	)
	if addr == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.StartAddr("127.0.0.1:0"); err != nil {
			return Result{}, fmt.Errorf("embedded redis: %w", err)
		}
		defer mr.Close()
		// Without ClockTTL miniredis expires keys only on FastForward: no
		// expiry, no stampede to show.
		mr.ClockTTL(true)
		addr = mr.Addr()
		redisIs = "embedded (miniredis on " + addr + ")"
	} else {
		redisIs = addr
	}
	ro := &redis.Options{Addr: addr}
	if strings.Contains(addr, "://") { // a URL, as `hearth prewarm --redis` takes
		var err error
		if ro, err = redis.ParseURL(addr); err != nil {
			return Result{}, fmt.Errorf("--redis: %w", err)
		}
		redisIs = ro.Addr
	}
	ro.PoolSize = opts.Readers + 16
	rdb := redis.NewClient(ro)
	defer rdb.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := rdb.Ping(pctx).Err()
	cancel()
	if err != nil {
		return Result{}, fmt.Errorf("redis %s unreachable: %w", ro.Addr, err)
	}

	var org origin
	if opts.PostgresDSN != "" {
		org, err = newPGOrigin(ctx, opts.PostgresDSN, runID, opts.Keys, opts.Readers, opts.OriginLatency)
	} else {
		org, err = newHTTPOrigin(opts.OriginLatency, opts.Readers)
	}
	if err != nil {
		return Result{}, err
	}
	defer org.close()

	m := newMetrics(opts.Registerer)
	fmt.Fprintf(out, "Hearth demo: %d readers do cache-aside (GET; on a miss, load from the origin and SET with TTL %s) on %d hot keys.\n",
		opts.Readers, opts.TTL, opts.Keys)
	fmt.Fprintf(out, "  Redis:  %s\n  Origin: %s\n", redisIs, org.describe())

	prefix := "hearth-demo:" + runID + ":"
	defer func() {
		keys := make([]string, 0, 2*opts.Keys)
		for i := 1; i <= opts.Keys; i++ {
			keys = append(keys, itemKey(prefix+"without:", i), itemKey(prefix+"with:", i))
		}
		_ = rdb.Del(context.WithoutCancel(ctx), keys...).Err()
	}()

	var res Result
	fmt.Fprintf(out, "\nPhase 1 of 2: without Hearth. Every key was loaded at once, so all expire at once,\n"+
		"every TTL: each reader that reads an expired key misses and loads it again.\n")
	res.Without, err = runPhase(ctx, "without Hearth", opts, rdb, org, m, prefix+"without:", totalCalls(org))
	if err != nil {
		return res, err
	}

	fmt.Fprintf(out, "\nPhase 2 of 2: with Hearth. Its warmer and scheduler (the code `hearth run` uses) load\n"+
		"every key first, then refresh each one every %s (TTL/2), before it can expire.\n", opts.TTL/2)
	before := totalCalls(org) // the start-up load belongs to the phase
	hearth, err := startHearth(ctx, opts, addr, runID, org, prefix+"with:")
	if err != nil {
		return res, err
	}
	res.With, err = runPhase(ctx, "with Hearth", opts, rdb, org, m, prefix+"with:", before)
	hearth.close()
	if err != nil {
		return res, err
	}
	printSummary(out, opts, res)
	return res, nil
}

func itemKey(prefix string, i int) string { return fmt.Sprintf("%sitem:%d", prefix, i) }

func totalCalls(o origin) int64 {
	r, h := o.calls()
	return r + h
}

// hearth is Hearth's engine as `hearth run` wires it, minus the HTTP listener.
type hearth struct {
	rdb     *redis.Client
	sources *daemon.Sources
	sched   *jobs.Scheduler
	// startup is the duration of the start-up load.
	startup time.Duration
}

// startHearth builds the declaration through Hearth's config (defaults and
// validation included), loads every key once, and schedules the refreshes.
func startHearth(ctx context.Context, opts Options, addr, runID string, org origin, prefix string) (*hearth, error) {
	cfg := config.Default()
	cfg.File = "(demo)"
	cfg.Redis.Addrs = []string{addr}
	cfg.Redis.Namespace = "hearth-demo-" + runID
	cfg.Refresh.LoadTimeout = opts.loadTimeout()
	cfg.Refresh.NegativeTTL = opts.TTL / 2
	cfg.Refresh.BatchSize = opts.Keys
	members := make([]string, opts.Keys)
	for i := range members {
		members[i] = fmt.Sprint(i + 1)
	}
	key := config.Key{Name: "items", Key: prefix + "item:{id}", Source: "origin", TTL: opts.TTL, Members: members, ParamPattern: "[0-9]{1,6}"}
	org.configure(&cfg, &key)
	cfg.Keys = []config.Key{key}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("demo config: %w", err)
	}
	specs := cfg.Specs()

	// The sources as `hearth run` opens them: the same factory, bounds and
	// origin protection.
	sources, err := daemon.OpenSources(ctx, &cfg, opts.Registerer, opts.Logger)
	if err != nil {
		return nil, fmt.Errorf("demo source: %w", err)
	}
	h := &hearth{rdb: redis.NewClient(&redis.Options{Addr: addr}), sources: sources}
	name := cfg.Sources[0].Name
	w, err := warmer.New(warmer.Options{
		Store: &store.RedisStore{Client: h.rdb}, Sources: map[string]warmer.Source{name: org.wrap(sources.Guarded[name])},
		Specs: specs, MaxConcurrentLoads: cfg.Refresh.MaxConcurrentLoads, Registerer: opts.Registerer, Logger: opts.Logger,
	})
	if err != nil {
		h.close()
		return nil, err
	}
	t0 := time.Now()
	if err := w.RefreshAll(ctx); err != nil {
		h.close()
		return nil, fmt.Errorf("start-up load: %w", err)
	}
	h.startup = time.Since(t0)
	h.sched, err = jobs.New(jobs.Options{Refresher: w, Specs: specs, Spread: cfg.Refresh.Spread, Logger: opts.Logger})
	if err == nil {
		err = h.sched.Open(ctx)
	}
	if err != nil {
		h.close()
		return nil, err
	}
	fmt.Fprintf(opts.Out, "  start-up load: %d keys in %s\n", opts.Keys, h.startup.Round(time.Millisecond))
	return h, nil
}

func (h *hearth) close() {
	if h.sched != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = h.sched.Close(ctx)
		cancel()
	}
	h.sources.Close()
	_ = h.rdb.Close()
}

// runPhase runs the readers for one phase and prints one line per second. The
// phase's origin calls are counted from before, the total when it began.
func runPhase(ctx context.Context, name string, opts Options, rdb *redis.Client, org origin, m *metrics, prefix string, before int64) (Phase, error) {
	out := opts.Out
	p := Phase{Name: name}
	var reads, misses atomic.Int64
	pctx, cancel := context.WithTimeout(ctx, opts.Duration)
	defer cancel()
	errc := make(chan error, opts.Readers)
	var wg sync.WaitGroup
	start := time.Now()
	for r := range opts.Readers {
		wg.Go(func() {
			errc <- read(pctx, r, opts, rdb, org, m, prefix, &reads, &misses)
		})
	}
	fmt.Fprintf(out, "  %4s %9s %9s %15s\n", "t", "reads/s", "misses/s", "origin calls/s")
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lastReads, lastMisses int64
	lastCalls := totalCalls(org)
	sec := 0
	for done := false; !done; {
		select {
		case <-pctx.Done():
			done = true
		case <-tick.C:
		}
		r, mi := reads.Load(), misses.Load()
		calls := totalCalls(org)
		dr, dm, dc := r-lastReads, mi-lastMisses, calls-lastCalls
		lastReads, lastMisses, lastCalls = r, mi, calls
		if done && time.Since(start) < time.Duration(sec)*time.Second+500*time.Millisecond {
			// A sliver of a second: fold it into the totals, not the view.
			continue
		}
		sec++
		p.PeakMisses, p.PeakOriginCalls = max(p.PeakMisses, dm), max(p.PeakOriginCalls, dc)
		fmt.Fprintf(out, "  %3ds %9d %9d %15d  %s\n", sec, dr, dm, dc, bar(dc, int64(opts.Readers)))
	}
	wg.Wait()
	close(errc)
	p.Seconds = time.Since(start).Seconds()
	p.Reads, p.Misses = reads.Load(), misses.Load()
	p.OriginCalls = totalCalls(org) - before
	for err := range errc {
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			return p, err
		}
	}
	if err := ctx.Err(); err != nil {
		return p, err
	}
	return p, nil
}

// read is one cache-aside reader: GET; on a miss, load from the origin and SET
// with the TTL, exactly what an application without Hearth does.
func read(ctx context.Context, id int, opts Options, rdb *redis.Client, org origin, m *metrics, prefix string, reads, misses *atomic.Int64) error {
	next := uint64(id)*0x9E3779B97F4A7C15 + 1
	for ctx.Err() == nil {
		next ^= next << 13
		next ^= next >> 7
		next ^= next << 17
		item := int(next%uint64(opts.Keys)) + 1
		key := itemKey(prefix, item)
		_, err := rdb.Get(ctx, key).Bytes()
		switch {
		case err == nil:
			reads.Add(1)
			m.reads.WithLabelValues("hit").Inc()
		case errors.Is(err, redis.Nil):
			reads.Add(1)
			misses.Add(1)
			m.reads.WithLabelValues("miss").Inc()
			v, err := org.fetch(ctx, item)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("reader %d: origin: %w", id, err)
			}
			m.originCalls.Inc()
			if err := rdb.Set(ctx, key, v, opts.TTL).Err(); err != nil && ctx.Err() == nil {
				return fmt.Errorf("reader %d: redis: %w", id, err)
			}
		default:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reader %d: redis: %w", id, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(opts.ReadPause):
		}
	}
	return nil
}

// bar draws n against a scale of full, at most 40 cells wide.
func bar(n, full int64) string {
	if n <= 0 || full <= 0 {
		return ""
	}
	cells := min(40, max(1, int(n*20/full)))
	return strings.Repeat("█", cells)
}

func printSummary(out io.Writer, opts Options, r Result) {
	w, h := r.Without, r.With
	fmt.Fprintf(out, "\nSummary (%s per phase, %d readers, %d keys, TTL %s, origin %s per call)\n\n", opts.Duration, opts.Readers, opts.Keys, opts.TTL, opts.OriginLatency)
	fmt.Fprintf(out, "  %-22s %16s %16s\n", "", "without Hearth", "with Hearth")
	row := func(name string, a, b any) { fmt.Fprintf(out, "  %-22s %16v %16v\n", name, a, b) }
	row("reads", w.Reads, h.Reads)
	row("misses", w.Misses, h.Misses)
	row("miss rate", fmt.Sprintf("%.2f%%", 100*w.MissRate()), fmt.Sprintf("%.2f%%", 100*h.MissRate()))
	row("origin calls", w.OriginCalls, h.OriginCalls)
	row("peak misses/s", w.PeakMisses, h.PeakMisses)
	row("peak origin calls/s", w.PeakOriginCalls, h.PeakOriginCalls)
	fmt.Fprintln(out)
	switch {
	case h.Misses == 0 && w.Misses > 0:
		fmt.Fprintf(out, "Without Hearth, readers missed %d times and stampeded the origin at every TTL boundary.\n"+
			"With Hearth, no reader missed: the origin only saw Hearth's scheduled refreshes.\n", w.Misses)
	case h.Misses > 0:
		fmt.Fprintf(out, "With Hearth, readers still missed %d times: the machine may be too loaded for TTL %s; try a longer --ttl.\n", h.Misses, opts.TTL)
	}
}

type metrics struct {
	reads       *prometheus.CounterVec
	originCalls prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		reads: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_cache_reads_total",
			Help: "Cache-aside reads of hot keys by result (hit, miss), as the demo's readers see them. Export the same counter from an application to use Hearth's miss-rate alert.",
		}, []string{"result"}),
		originCalls: f.NewCounter(prometheus.CounterOpts{
			Name: "hearth_demo_reader_origin_calls_total",
			Help: "Origin calls made by the demo's readers after a miss (Hearth's own are hearth_origin_load_duration_seconds_count).",
		}),
	}
	return m
}
