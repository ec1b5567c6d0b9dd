// Package readside is the read side of a Hearth-warmed cache, the package an
// application imports to read its Redis cache: GetOrLoad protects every key
// Hearth does not warm (and the warmed ones in the moment after a FLUSHDB or
// a Redis restart) from a stampede, and records the reads in the access
// buckets Hearth pre-warms from.
//
// Protection, weakest to strongest: in-process single-flight (one load per
// key per process), a distributed lock per key with an owner token, a
// double-check after acquiring and a bounded wait for the holder's value (one
// load per key per fleet), XFetch probabilistic early refresh in the
// background while the current value is served, and a stale copy served when
// the loader fails; optionally, a bounded in-process near cache (Options.Local)
// in front of Redis. The keys it uses beside the application's and their
// formats are a protocol other languages can follow: docs/readside.md.
//
// It is a module of its own (go get github.com/hearth-dev/hearth/readside,
// Go 1.24 or later) and depends on go-redis, golang.org/x/sync,
// hashicorp/golang-lru and the Prometheus client only, never on the daemon's
// packages. It exports hearth_cache_reads_total{result="hit"|"miss"}, the
// counter Hearth's miss-rate alert and dashboard panel read.
package readside

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

var (
	// ErrNotFound is returned when the key holds the negative sentinel, or
	// when the loader returns it (the sentinel is then written).
	ErrNotFound = errors.New("not found")
	// ErrLockWait is returned when another process held the key's lock for
	// all of LockWait and the fallback is FallbackFail (or FallbackStale
	// without a stale copy).
	ErrLockWait = errors.New("lock wait timed out")
	// ErrPanic wraps a loader's panic, turned into an error for every caller.
	ErrPanic = errors.New("loader panicked")
)

// Loader loads a key's value from the origin. Return ErrNotFound (wrapped or
// not) for a value the origin does not have. A value equal to the negative
// sentinel (by default the empty string) reads back as not found.
type Loader func(ctx context.Context) ([]byte, error)

// Fallback is what a caller does when another process held the key's lock
// for all of LockWait without writing the value.
type Fallback int

const (
	// FallbackLoad loads anyway (the origin may see a second load).
	FallbackLoad Fallback = iota
	// FallbackStale serves the stale copy (see StaleFor), else fails.
	FallbackStale
	// FallbackFail returns ErrLockWait.
	FallbackFail
)

func (f Fallback) String() string {
	switch f {
	case FallbackLoad:
		return "load"
	case FallbackStale:
		return "stale"
	case FallbackFail:
		return "fail"
	}
	return "fallback(" + strconv.Itoa(int(f)) + ")"
}

// Options configures a Cache. Client is required; zero values take the
// defaults documented on each field.
type Options struct {
	Client redis.UniversalClient
	// Namespace is Hearth's redis.namespace (default "hearth"): it prefixes
	// the locks, δ keys, stale copies and access buckets.
	Namespace string
	// TTL is the lifetime of the values GetOrLoad writes (default 1m).
	TTL time.Duration
	// Jitter spreads TTLs by ±Jitter/2 (default 0.1, -1 for none).
	Jitter float64
	// NegativeTTL is the lifetime of the sentinel written when the loader
	// returns ErrNotFound (default 10s).
	NegativeTTL time.Duration
	// NegativeValue is Hearth's negative_value, the not-found sentinel
	// (default the empty string, as Hearth's).
	NegativeValue string
	// StaleFor keeps a stale copy of every value written this long past its
	// TTL, served when the loader fails (and by FallbackStale). 0: no copy.
	StaleFor time.Duration
	// Beta is XFetch's β: larger refreshes earlier (default DefaultBeta,
	// -1 for no early refresh). Each early refresh that lands before the
	// expiry shortens the key's TTL window by its lead, an extra load per
	// key of lead/TTL: docs/readside.md has the sweep behind the default.
	Beta float64
	// LockTTL is the lock's lifetime (default 5s): a holder that dies is
	// replaced after it. Keep it above the loader's slowest run.
	LockTTL time.Duration
	// LockWait bounds the wait for another holder's value (default LockTTL
	// + 1s, so that a dead holder's lock lapses within it).
	LockWait time.Duration
	// Fallback is what to do when LockWait runs out (default FallbackLoad).
	Fallback Fallback
	// LoadTimeout bounds one load and its writes (default 30s). The load
	// runs under it, not under any caller's context.
	LoadTimeout time.Duration
	// AccessSample records one read in AccessSample, counted AccessSample
	// times, in Hearth's access buckets; 0 records none.
	AccessSample int
	// AccessBucket is Hearth's access_log.bucket (default 1m).
	AccessBucket time.Duration
	// AccessFlush is how often recorded reads are sent (default 1s).
	AccessFlush time.Duration
	// Local is the optional in-process near cache (off by default: it
	// trades up to Local.TTL of staleness for reads served from memory).
	Local LocalOptions
	// Registerer receives the metrics; nil registers them nowhere.
	Registerer prometheus.Registerer
	// Logger receives warnings (default: discarded).
	Logger *slog.Logger
	// Now measures δ and dates access buckets; Rand draws XFetch's and the
	// jitter's uniform numbers in [0,1) and must be safe for concurrent use.
	// Tests inject both.
	Now  func() time.Time
	Rand func() float64
}

// Option changes one GetOrLoad call.
type Option func(*callOpts)

type callOpts struct {
	ttl      time.Duration
	staleFor time.Duration
	fallback Fallback
}

// WithTTL sets the TTL of the value this call writes.
func WithTTL(d time.Duration) Option { return func(o *callOpts) { o.ttl = d } }

// WithStaleFor sets how long past its TTL this call's stale copy lives.
func WithStaleFor(d time.Duration) Option { return func(o *callOpts) { o.staleFor = d } }

// WithFallback sets this call's fallback.
func WithFallback(f Fallback) Option { return func(o *callOpts) { o.fallback = f } }

// maxDelta bounds a δ read back from Redis: a longer load is no load time.
const maxDelta = time.Hour

// DefaultBeta is Options.Beta's default: the largest β of the sweep in
// docs/readside.md (4 processes × 50 readers, Zipf 1.1 over 100 keys, δ
// 50 ms, TTL 10 s) whose early refreshes start about δ before the expiry of
// the hottest key, so that the new value lands as the old one expires and
// the window is not shortened: its steady-state loads per key per TTL
// window are XFetch off's (0.5 added 0.7 %, 1 — the default before — 1.1 %,
// 2 2.4 %).
const DefaultBeta = 0.3

// Cache reads through Redis to a loader. Create it with New, Close it.
type Cache struct {
	o   Options
	rdb redis.UniversalClient
	m   *metrics
	log *slog.Logger

	fills singleflight.Group

	mu         sync.Mutex
	refreshing map[string]bool
	// heldOff holds the keys whose early refresh another process was seen
	// running (the lock held) less than its δ ago: no decision tries again
	// until its value has had the time to land.
	heldOff map[string]struct{}
	closed  bool
	wg      sync.WaitGroup

	acc  *recorder
	near *near
	// seen is what this process last learnt of each key's expiry and δ,
	// so that a read far from that expiry is a plain GET (nil with a near
	// cache, whose copies carry the same).
	seen *lru.Cache[string, seenEntry]
}

// seenEntry is a key's expiry and δ as a full read or this process's write
// found them.
type seenEntry struct {
	expires time.Time
	delta   time.Duration
}

// Reads are plain GETs until seenHorizon·δ·β before the expiry last seen,
// and XFetch decides on that expiry: a refresh it starts re-reads the key in
// full before loading, and stops there if another process refreshed it
// meanwhile (done_elsewhere), learning the new expiry. So the reads that
// pay for a PTTL and δ are the last δ·β before the expiry (the pipeline of
// three had been every read of the last 20·δ·β, 3 % of a 10 s TTL's reads
// with a 50 ms loader: the read side's p99). A key without δ or TTL is read
// in full at least every seenRecheck. At most seenSize keys are remembered.
const (
	seenHorizon = 1
	seenRecheck = time.Second
	seenSize    = 16384
)

// New validates opts, fills in the defaults and starts the access recorder.
func New(opts Options) (*Cache, error) {
	o := opts
	if o.Client == nil {
		return nil, errors.New("readside: Options.Client is required")
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if strings.ContainsAny(o.Namespace, "{}") {
		return nil, fmt.Errorf("readside: Options.Namespace: must hold no brace (got %q)", o.Namespace)
	}
	def := func(d *time.Duration, v time.Duration, name string) error {
		if *d < 0 {
			return fmt.Errorf("readside: Options.%s: must not be negative (got %s)", name, *d)
		}
		if *d == 0 {
			*d = v
		}
		return nil
	}
	for _, f := range []struct {
		d    *time.Duration
		v    time.Duration
		name string
	}{
		{&o.TTL, time.Minute, "TTL"}, {&o.NegativeTTL, 10 * time.Second, "NegativeTTL"},
		{&o.LockTTL, 5 * time.Second, "LockTTL"}, {&o.LoadTimeout, 30 * time.Second, "LoadTimeout"},
		{&o.AccessBucket, DefaultAccessBucket, "AccessBucket"}, {&o.AccessFlush, time.Second, "AccessFlush"},
		{&o.StaleFor, 0, "StaleFor"}, {&o.LockWait, 0, "LockWait"},
	} {
		if err := def(f.d, f.v, f.name); err != nil {
			return nil, err
		}
	}
	if o.LockWait == 0 {
		o.LockWait = o.LockTTL + time.Second
	}
	if o.AccessBucket%time.Second != 0 {
		return nil, fmt.Errorf("readside: Options.AccessBucket: must be whole seconds (got %s)", o.AccessBucket)
	}
	switch {
	case math.IsNaN(o.Jitter) || math.IsInf(o.Jitter, 0) || o.Jitter >= 1 || (o.Jitter < 0 && o.Jitter != -1):
		return nil, fmt.Errorf("readside: Options.Jitter: must be in [0, 1) or -1 (got %v)", o.Jitter)
	case o.Jitter == 0:
		o.Jitter = 0.1
	case o.Jitter == -1:
		o.Jitter = 0
	}
	switch {
	case math.IsNaN(o.Beta) || math.IsInf(o.Beta, 0) || (o.Beta < 0 && o.Beta != -1):
		return nil, fmt.Errorf("readside: Options.Beta: must be ≥ 0 and finite, or -1 (got %v)", o.Beta)
	case o.Beta == 0:
		o.Beta = DefaultBeta
	case o.Beta == -1:
		o.Beta = 0
	}
	if o.Fallback < FallbackLoad || o.Fallback > FallbackFail {
		return nil, fmt.Errorf("readside: Options.Fallback: unknown %d", int(o.Fallback))
	}
	if o.AccessSample < 0 {
		return nil, fmt.Errorf("readside: Options.AccessSample: must not be negative (got %d)", o.AccessSample)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	nr, err := newNear(o.Local)
	if err != nil {
		return nil, err
	}
	if nr != nil {
		o.Local.TTL = nr.ttl
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, err
	}
	c := &Cache{o: o, rdb: o.Client, m: m, log: log, refreshing: map[string]bool{}, heldOff: map[string]struct{}{}, near: nr}
	if nr == nil {
		c.seen, _ = lru.New[string, seenEntry](seenSize) // fails only for a size ≤ 0
	}
	if o.AccessSample > 0 {
		c.acc = newRecorder(c)
		c.wg.Add(1)
		go c.acc.loop()
	}
	return c, nil
}

// Close stops background refreshes from starting, waits for those running,
// and sends the reads recorded so far (bounded by ctx). GetOrLoad still works
// after Close, without early refreshes or access recording. A second Close
// does nothing.
func (c *Cache) Close(ctx context.Context) error {
	c.mu.Lock()
	was := c.closed
	c.closed = true
	c.mu.Unlock()
	if was {
		return nil
	}
	if c.acc != nil {
		c.acc.stopped.Store(true)
		close(c.acc.stop)
	}
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("close readside cache: %w", ctx.Err())
	}
	if c.acc != nil {
		return c.acc.flush(ctx)
	}
	return nil
}

// entry is what one read of a key found.
type entry struct {
	value     []byte
	found     bool
	remaining time.Duration // PTTL; -1 for none
	delta     time.Duration // 0 when unknown
}

// GetOrLoad returns key's value from Redis, or loads it with load and writes
// it. It returns ErrNotFound when the key holds the negative sentinel or the
// loader returns ErrNotFound. ctx bounds this caller's wait only: a load
// other callers wait for runs on under LoadTimeout. The returned slice is the
// caller's own.
func (c *Cache) GetOrLoad(ctx context.Context, key string, load Loader, opts ...Option) ([]byte, error) {
	co := callOpts{ttl: c.o.TTL, staleFor: c.o.StaleFor, fallback: c.o.Fallback}
	for _, f := range opts {
		f(&co)
	}
	if c.acc != nil {
		c.acc.record(key)
	}
	if v, ok, err := c.local(key, load, co); ok {
		c.m.readHit.Inc()
		return v, err
	}
	e, err := c.read(ctx, key)
	if err == nil && e.found {
		c.m.readHit.Inc()
		v, err := c.answer(e)
		if err == nil && c.early(e) {
			c.refreshEarly(key, load, co, e.remaining, e.delta)
		}
		return v, err
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("get %s: %w", key, context.Cause(ctx))
		}
		c.m.redisErrors.WithLabelValues("read").Inc()
	}
	c.m.readMiss.Inc()
	c.m.misses.Inc()
	return c.coalesce(ctx, key, load, co)
}

// answer turns a found entry into GetOrLoad's result, counting the hit.
func (c *Cache) answer(e entry) ([]byte, error) {
	if string(e.value) == c.o.NegativeValue {
		c.m.hitNegative.Inc()
		return nil, ErrNotFound
	}
	c.m.hitValue.Inc()
	return e.value, nil
}

// read gets the value with a plain GET while the expiry this process last
// saw is far enough for XFetch never to refresh (its remaining TTL and δ
// are then that expiry's), else as readFull does.
func (c *Cache) read(ctx context.Context, key string) (entry, error) {
	if c.seen == nil {
		return c.readFull(ctx, key)
	}
	s, ok := c.seen.Get(key)
	now := c.o.Now()
	if !ok || !now.Add(time.Duration(seenHorizon*c.o.Beta*float64(s.delta))).Before(s.expires) {
		return c.readFull(ctx, key)
	}
	v, err := c.rdb.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		c.seen.Remove(key)
		return entry{}, nil
	}
	if err != nil {
		return entry{}, fmt.Errorf("read %s: %w", key, err)
	}
	return entry{value: v, found: true, remaining: s.expires.Sub(now), delta: s.delta}, nil
}

// note remembers key's expiry and δ as a read at t found them (remaining
// is the PTTL: -1 for none).
func (c *Cache) note(key string, remaining, delta time.Duration, t time.Time) {
	if c.seen == nil {
		return
	}
	if remaining < 0 || delta <= 0 {
		// Never refreshed early as it stands: read in full again soon, in
		// case a δ or a TTL appears.
		if remaining < 0 || remaining > seenRecheck {
			remaining = seenRecheck
		}
		delta = 0
	}
	c.seen.Add(key, seenEntry{expires: t.Add(remaining), delta: delta})
}

// readFull gets the value, its PTTL and its δ in one round trip (one slot),
// and keeps a copy in the near cache.
func (c *Cache) readFull(ctx context.Context, key string) (entry, error) {
	t0 := c.o.Now()
	pipe := c.rdb.Pipeline()
	get := pipe.Get(ctx, key)
	ttl := pipe.PTTL(ctx, key)
	delta := pipe.Get(ctx, DeltaKey(c.o.Namespace, key))
	_, err := pipe.Exec(ctx)
	if err != nil && !errors.Is(err, redis.Nil) {
		return entry{}, fmt.Errorf("read %s: %w", key, err)
	}
	v, err := get.Bytes()
	if errors.Is(err, redis.Nil) {
		return entry{}, nil
	}
	if err != nil {
		return entry{}, fmt.Errorf("read %s: %w", key, err)
	}
	e := entry{value: v, found: true, remaining: ttl.Val()}
	if s, err := delta.Result(); err == nil {
		ms, perr := strconv.ParseInt(s, 10, 64)
		if perr != nil || ms <= 0 || time.Duration(ms)*time.Millisecond > maxDelta {
			c.m.foreign.WithLabelValues("delta").Inc()
			c.log.Warn("readside: ignoring a foreign δ (want whole milliseconds in (0, 1h])",
				"key", DeltaKey(c.o.Namespace, key), "value", truncate(s))
		} else {
			e.delta = time.Duration(ms) * time.Millisecond
		}
	}
	c.remember(key, e.value, e.remaining, e.delta, t0)
	c.note(key, e.remaining, e.delta, t0)
	return e, nil
}

// early is XFetch's test: refresh when now − δ·β·ln(u) ≥ expiry, that is
// when −δ·β·ln(u) ≥ the value's remaining TTL. A key without δ (Hearth's
// own, or written by someone else) or without a TTL is never refreshed early.
func (c *Cache) early(e entry) bool {
	if c.o.Beta == 0 || e.delta <= 0 || e.remaining == -1 {
		return false
	}
	return -float64(e.delta)*c.o.Beta*math.Log(c.o.Rand()) >= float64(e.remaining)
}

// refreshEarly reloads key in the background, once per process at a time,
// and only if no process holds its lock; the current value is served
// meanwhile. seen is the remaining TTL the decision saw: a value that has
// more left once the lock is taken was rewritten since (by another process's
// refresh that already released the lock), and is not loaded again. delta
// is the key's δ: a lock found held stops this process's decisions on key
// for that long (at most LockTTL), the time the holder's load takes to land.
func (c *Cache) refreshEarly(key string, load Loader, co callOpts, seen, delta time.Duration) {
	c.mu.Lock()
	if c.closed || c.refreshing[key] {
		c.mu.Unlock()
		c.m.early.WithLabelValues("coalesced").Inc()
		return
	}
	if _, ok := c.heldOff[key]; ok {
		c.mu.Unlock()
		c.m.early.WithLabelValues("held_off").Inc()
		return
	}
	c.refreshing[key] = true
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer func() {
			c.mu.Lock()
			delete(c.refreshing, key)
			c.mu.Unlock()
			c.wg.Done()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), c.o.LoadTimeout)
		defer cancel()
		token := newToken()
		ok, err := c.acquire(ctx, LockKey(c.o.Namespace, key), token)
		switch {
		case err != nil:
			c.m.redisErrors.WithLabelValues("lock").Inc()
			c.m.early.WithLabelValues("error").Inc()
			return
		case !ok:
			c.m.early.WithLabelValues("locked").Inc()
			c.holdOff(key, min(delta, c.o.LockTTL))
			return
		}
		if e, err := c.readFull(ctx, key); err == nil && e.found && e.remaining > seen {
			c.release(ctx, LockKey(c.o.Namespace, key), token)
			c.m.early.WithLabelValues("done_elsewhere").Inc()
			return
		}
		c.m.early.WithLabelValues("started").Inc()
		if _, err := c.loadAndStore(ctx, key, load, co, token, false); err != nil && !errors.Is(err, ErrNotFound) {
			c.m.early.WithLabelValues("error").Inc()
			c.log.Warn("readside: early refresh failed; the current value is served until it expires", "key", key, "err", err)
		}
	}()
}

// holdOff stops early-refresh decisions on key in this process for d.
func (c *Cache) holdOff(key string, d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	if _, ok := c.heldOff[key]; ok {
		c.mu.Unlock()
		return
	}
	c.heldOff[key] = struct{}{}
	c.mu.Unlock()
	time.AfterFunc(d, func() {
		c.mu.Lock()
		delete(c.heldOff, key)
		c.mu.Unlock()
	})
}

// coalesce runs one fill per key in this process; each caller waits for it
// under its own context.
func (c *Cache) coalesce(ctx context.Context, key string, load Loader, co callOpts) ([]byte, error) {
	leader := false
	ch := c.fills.DoChan(key, func() (any, error) {
		leader = true
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.o.LoadTimeout)
		defer cancel()
		return c.fill(lctx, key, load, co)
	})
	select {
	case r := <-ch:
		v, _ := r.Val.([]byte)
		if !leader {
			c.m.coalesced.Inc()
			v = bytes.Clone(v)
		}
		return v, r.Err
	case <-ctx.Done():
		return nil, fmt.Errorf("get %s: %w", key, context.Cause(ctx))
	}
}

// Lock-wait polling: the first poll after pollMin, each later one 1.25
// times later, at most pollMax apart, each ±20%. A waiter sees the holder's
// value at most about pollMax after it lands; one GET per poll per waiting
// process (in-process callers share one fill) is cheap.
const (
	pollMin = 2 * time.Millisecond
	pollMax = 10 * time.Millisecond
)

// fill takes the key's lock and loads, or waits for the holder's value, and
// falls back when the wait runs out.
func (c *Cache) fill(ctx context.Context, key string, load Loader, co callOpts) ([]byte, error) {
	lock := LockKey(c.o.Namespace, key)
	token := newToken()
	start := time.Now()
	deadline := start.Add(c.o.LockWait)
	waited := false
	pause := pollMin
	for {
		ok, err := c.acquire(ctx, lock, token)
		if err != nil {
			// Redis is unusable: single-flight is the origin's only guard.
			c.m.redisErrors.WithLabelValues("lock").Inc()
			c.m.fallbacks.WithLabelValues("redis_error", "load").Inc()
			return c.loadAndStore(ctx, key, load, co, "", true)
		}
		if ok {
			if waited {
				c.m.lockWait.WithLabelValues("acquired").Observe(time.Since(start).Seconds())
			}
			// Double-check: the previous holder may have written it.
			if e, err := c.read(ctx, key); err == nil && e.found {
				c.release(ctx, lock, token)
				return c.answer(e)
			}
			return c.loadAndStore(ctx, key, load, co, token, true)
		}
		waited = true
		now := time.Now()
		if !now.Before(deadline) {
			break
		}
		d := time.Duration(float64(pause) * (0.8 + 0.4*rand.Float64()))
		d = min(d, deadline.Sub(now))
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the lock of %s: %w", key, ctx.Err())
		}
		pause = min(pause*5/4, pollMax)
		if e, err := c.read(ctx, key); err == nil && e.found {
			c.m.lockWait.WithLabelValues("value").Observe(time.Since(start).Seconds())
			return c.answer(e)
		}
	}
	c.m.lockWait.WithLabelValues("timeout").Observe(time.Since(start).Seconds())
	switch co.fallback {
	case FallbackLoad:
		c.m.fallbacks.WithLabelValues("lock_timeout", "load").Inc()
		return c.loadAndStore(ctx, key, load, co, "", true)
	case FallbackStale:
		if v, ok := c.stale(ctx, key, co); ok {
			c.m.fallbacks.WithLabelValues("lock_timeout", "stale").Inc()
			c.m.stale.WithLabelValues("fallback").Inc()
			return v, nil
		}
	}
	c.m.fallbacks.WithLabelValues("lock_timeout", "fail").Inc()
	return nil, fmt.Errorf("get %s: lock held elsewhere for %s: %w", key, c.o.LockWait, ErrLockWait)
}

// loadAndStore runs the loader, writes what it returns and releases the lock
// when token is set. On a loader error it serves the stale copy when serveStale.
func (c *Cache) loadAndStore(ctx context.Context, key string, load Loader, co callOpts, token string, serveStale bool) ([]byte, error) {
	// δ is the loader's own run: timed here, after the lock was taken and
	// any wait for it, so that neither inflates XFetch's lead.
	t0 := c.o.Now()
	v, err := c.run(ctx, load)
	delta := c.o.Now().Sub(t0)
	c.m.loadSeconds.Observe(delta.Seconds())
	lock := LockKey(c.o.Namespace, key)
	switch {
	case errors.Is(err, ErrNotFound):
		c.m.loads.WithLabelValues("not_found").Inc()
		t, ttl := c.o.Now(), c.jitter(c.o.NegativeTTL)
		if c.store(ctx, key, []byte(c.o.NegativeValue), ttl, 0, -1, token) {
			c.remember(key, []byte(c.o.NegativeValue), ttl, 0, t)
			c.note(key, ttl, 0, t)
		}
		return nil, ErrNotFound
	case err != nil:
		if errors.Is(err, ErrPanic) {
			c.m.loads.WithLabelValues("panic").Inc()
		} else {
			c.m.loads.WithLabelValues("error").Inc()
		}
		if token != "" {
			c.release(ctx, lock, token)
		}
		if serveStale && co.staleFor > 0 {
			if sv, ok := c.stale(ctx, key, co); ok {
				c.m.stale.WithLabelValues("loader_error").Inc()
				c.log.Warn("readside: loader failed; serving the stale copy", "key", key, "err", err)
				return sv, nil
			}
		}
		return nil, fmt.Errorf("load %s: %w", key, err)
	}
	c.m.loads.WithLabelValues("ok").Inc()
	ttl := c.jitter(co.ttl)
	staleTTL := time.Duration(0)
	if co.staleFor > 0 {
		staleTTL = ttl + co.staleFor
	}
	t := c.o.Now()
	if c.store(ctx, key, v, ttl, max(delta, time.Millisecond), staleTTL, token) {
		c.remember(key, v, ttl, max(delta, time.Millisecond), t)
		c.note(key, ttl, max(delta, time.Millisecond), t)
	}
	return v, nil
}

// run calls the loader, turning a panic into an error wrapping ErrPanic.
func (c *Cache) run(ctx context.Context, load Loader) (v []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("readside: loader panicked", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			v, err = nil, fmt.Errorf("%w: %v", ErrPanic, r)
		}
	}()
	return load(ctx)
}

// storeScript writes a value, its δ and its stale copy and releases the
// lock, in one step in the key's slot. KEYS: value, δ, stale copy, lock.
// ARGV: value, TTL ms, δ ms ("" deletes the δ), stale TTL ms (0 keeps the
// copy as it is, -1 deletes it), owner token ("" holds no lock), the stale
// copy's frame header (written before the value's bytes, so that they are
// sent once). Returns 1 when it released the lock.
var storeScript = redis.NewScript(`
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if ARGV[3] == '' then redis.call('DEL', KEYS[2]) else redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2]) end
local s = tonumber(ARGV[4])
if s > 0 then redis.call('SET', KEYS[3], ARGV[6] .. ARGV[1], 'PX', s) elseif s < 0 then redis.call('DEL', KEYS[3]) end
if ARGV[5] ~= '' and redis.call('GET', KEYS[4]) == ARGV[5] then
	redis.call('DEL', KEYS[4])
	return 1
end
return 0
`)

// releaseScript deletes the lock if it still holds the caller's token: a
// holder whose lock lapsed never frees its successor's.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// store reports whether the write succeeded. The stale copy, if any, is
// framed as written now.
func (c *Cache) store(ctx context.Context, key string, v []byte, ttl, delta, staleTTL time.Duration, token string) bool {
	d := ""
	if delta > 0 {
		d = strconv.FormatInt(delta.Milliseconds(), 10)
	}
	ns := c.o.Namespace
	keys := []string{key, DeltaKey(ns, key), StaleKey(ns, key), LockKey(ns, key)}
	st := int64(-1)
	if staleTTL > 0 {
		st = staleTTL.Milliseconds()
	}
	if delta <= 0 {
		// A sentinel: no δ, and no stale copy of a row that is gone.
		st = -1
	}
	var header []byte
	if st > 0 {
		header = staleHeader(v, c.o.Now())
	}
	if err := storeScript.Run(ctx, c.rdb, keys, v, ttl.Milliseconds(), d, st, token, header).Err(); err != nil && !errors.Is(err, redis.Nil) {
		c.m.redisErrors.WithLabelValues("store").Inc()
		c.log.Warn("readside: write failed; the value is returned unstored", "key", key, "err", err)
		return false
	}
	return true
}

func (c *Cache) release(ctx context.Context, lock, token string) {
	if err := releaseScript.Run(ctx, c.rdb, []string{lock}, token).Err(); err != nil && !errors.Is(err, redis.Nil) {
		c.m.redisErrors.WithLabelValues("release").Inc()
		c.log.Warn("readside: lock release failed; it lapses after its TTL", "lock", lock, "err", err)
	}
}

// repairScript deletes a key of Hearth's own only if it still holds what
// was judged foreign: the string ARGV[1], or (ARGV[2] == '1') a value of
// another type. A reader that took the key since, or another reader's
// repair, is left alone. Returns 1 when it deleted the key.
var repairScript = redis.NewScript(`
local t = redis.call('TYPE', KEYS[1])['ok']
if ARGV[2] == '1' then
	if t ~= 'string' and t ~= 'none' then return redis.call('DEL', KEYS[1]) end
	return 0
end
if t == 'string' and redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// repair deletes key if it still holds seen (or, notString, a value of
// another type) and reports whether it did.
func (c *Cache) repair(ctx context.Context, key string, seen []byte, notString bool) bool {
	flag := "0"
	if notString {
		flag = "1"
	}
	n, err := repairScript.Run(ctx, c.rdb, []string{key}, seen, flag).Int()
	if err != nil {
		c.m.redisErrors.WithLabelValues("repair").Inc()
		c.log.Warn("readside: repair failed", "key", key, "err", err)
		return false
	}
	return n == 1
}

// acquire tries the key's lock once. The same round trip reads the holder's
// token and PTTL: a lock no reader would have written (no TTL, a TTL above
// LockTTL + LockTTLSlack, not an owner token, not a string) is deleted,
// counted and logged, and the lock tried again at once, so that it costs one
// check, never a wait.
func (c *Cache) acquire(ctx context.Context, lock, token string) (bool, error) {
	pipe := c.rdb.Pipeline()
	set := pipe.SetNX(ctx, lock, token, c.o.LockTTL)
	get := pipe.Get(ctx, lock)
	pttl := pipe.PTTL(ctx, lock)
	_, _ = pipe.Exec(ctx) // each command's own result is read below
	if ok, err := set.Result(); ok || err != nil {
		return ok, err
	}
	holder, err := get.Result()
	notString := redis.HasErrorPrefix(err, "WRONGTYPE")
	if err != nil && !notString {
		return false, nil // released meanwhile, or Redis failing: the next try sees it
	}
	left := pttl.Val()
	if pttl.Err() != nil || left == -2 {
		return false, nil
	}
	reason := judgeLock(holder, notString, left, c.o.LockTTL)
	if reason == "" || !c.repair(ctx, lock, []byte(holder), notString) {
		return false, nil
	}
	c.m.lockRepairs.WithLabelValues(reason).Inc()
	ms := left.Milliseconds()
	if left == -1 {
		ms = -1 // PTTL's "no TTL"
	}
	c.log.Warn("readside: deleted a lock no reader would have written; taking it",
		"lock", lock, "reason", reason, "holder", truncate(holder), "pttl_ms", ms,
		"lock_ttl_ms", c.o.LockTTL.Milliseconds(), "not_string", notString)
	return c.rdb.SetNX(ctx, lock, token, c.o.LockTTL).Result()
}

// staleMaxAge is the oldest a stale copy written under co can legitimately
// be: the longest jittered TTL plus StaleFor.
func (c *Cache) staleMaxAge(co callOpts) time.Duration {
	return time.Duration(float64(co.ttl)*(1+c.o.Jitter/2)) + time.Millisecond + co.staleFor
}

// stale returns the key's stale copy if it is one readside framed, intact
// and within staleMaxAge of its write time (whatever its Redis TTL says).
// Anything else is counted, logged and deleted, never served.
func (c *Cache) stale(ctx context.Context, key string, co callOpts) ([]byte, bool) {
	sk := StaleKey(c.o.Namespace, key)
	raw, err := c.rdb.Get(ctx, sk).Bytes()
	notString := redis.HasErrorPrefix(err, "WRONGTYPE")
	if err != nil && !notString {
		if !errors.Is(err, redis.Nil) {
			c.m.redisErrors.WithLabelValues("read").Inc()
		}
		return nil, false
	}
	reason := staleUnframed
	var v []byte
	if !notString {
		v, reason = openStale(raw, c.o.Now(), c.staleMaxAge(co))
		if reason == "" {
			return v, true
		}
	}
	c.m.staleReject.WithLabelValues(reason).Inc()
	// The first bytes show a frame's header (or what is there instead),
	// never more than that of what may be the application's data.
	c.log.Warn("readside: refused a stale copy; deleting it",
		"key", sk, "reason", reason, "bytes", len(raw), "head", hex.EncodeToString(raw[:min(len(raw), StaleHeaderLen)]),
		"not_string", notString, "max_age", c.staleMaxAge(co))
	c.repair(ctx, sk, raw, notString)
	return nil, false
}

// jitter spreads d by ±Jitter/2, never below a millisecond.
func (c *Cache) jitter(d time.Duration) time.Duration {
	j := time.Duration(float64(d) * (1 + c.o.Jitter*(c.o.Rand()-0.5)))
	return max(j, time.Millisecond)
}

func truncate(s string) string {
	if len(s) > 64 {
		return strconv.Quote(s[:64]) + "…"
	}
	return strconv.Quote(s)
}
