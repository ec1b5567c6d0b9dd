package accesslog

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
)

// MaxKeyBytes bounds a key the roll-up copies into the table: no declared
// template and member can be longer, so a longer string is not a cache key.
const MaxKeyBytes = 4096

const (
	// maxGrace is the most a bucket is left alone after it ends, for the
	// application servers' clocks and in-flight ZINCRBYs to catch up.
	maxGrace = 10 * time.Second
	// maxBuckets bounds the closed buckets one roll-up looks for.
	maxBuckets = 10_000
	// scanCount is the ZSCAN page hint; flushRows the rows per INSERT.
	scanCount = 1000
	flushRows = 5000
)

// RollerOptions configures a Roller. Log, Client and Namespace are required.
type RollerOptions struct {
	Log    *Log
	Client redis.UniversalClient
	// Namespace prefixes the bucket keys: <namespace>:access:<bucket start>.
	Namespace string
	// Bucket is the bucket width applications count reads in (default 1m).
	Bucket time.Duration
	// Interval is how often Open's loop rolls up; 0 never (RollupOnce still works).
	Interval time.Duration
	// Lookback is how far back closed buckets are looked for (default 1h);
	// the pre-warm window is the natural value, as older reads do not rank.
	Lookback time.Duration
	// Retention deletes table rows older than this at each roll-up; 0 keeps them.
	Retention time.Duration
	// RankInterval is how often Open's loop stores the ranking of the top
	// RankTopN keys over the last Lookback (see Log.Rank); 0 never.
	RankInterval time.Duration
	RankTopN     int
	// Gate, when set, must return true for a roll-up to run: only the leader
	// rolls up.
	Gate       func() bool
	Registerer prometheus.Registerer
	Logger     zerolog.Logger
	// Now is the clock; tests inject it.
	Now func() time.Time
}

// Roller moves closed Redis buckets into the access-log table and deletes them.
// A roll-up is idempotent and safe to retry: a bucket is deleted from Redis only
// after its counts are committed, and writing the same counts again is a no-op.
type Roller struct {
	opts    RollerOptions
	grace   time.Duration
	metrics *rollerMetrics
	log     zerolog.Logger

	mu     sync.Mutex // one roll-up at a time
	cancel context.CancelCauseFunc
	g      *errgroup.Group
}

// NewRoller builds a Roller; nothing runs until Open or RollupOnce.
func NewRoller(opts RollerOptions) (*Roller, error) {
	switch {
	case opts.Log == nil:
		return nil, errors.New("access-log roller: no log")
	case opts.Client == nil:
		return nil, errors.New("access-log roller: no redis client")
	case opts.Namespace == "":
		return nil, errors.New("access-log roller: no namespace")
	}
	if opts.Bucket < time.Second {
		opts.Bucket = time.Minute
	}
	if opts.Lookback <= 0 {
		opts.Lookback = time.Hour
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Roller{
		opts:    opts,
		grace:   min(opts.Bucket, maxGrace),
		metrics: newRollerMetrics(opts.Registerer),
		log:     opts.Logger.With().Str("component", "accesslog").Logger(),
	}, nil
}

// RollupResult counts what one roll-up did.
type RollupResult struct {
	// Buckets rolled up (and deleted from Redis).
	Buckets int
	// Rows written to the table (one per key per bucket).
	Rows int
	// Skipped members that cannot be cache keys (see MaxKeyBytes) or whose
	// count is not positive.
	Skipped int
	// Pruned rows past the retention.
	Pruned int64
}

// RollupOnce rolls up every closed bucket still in Redis within the lookback,
// oldest first, then prunes rows past the retention. A bucket is closed once it
// ended a grace period ago (the bucket width, at most 10s). A failed bucket
// stays in Redis for the next run; the error names it.
func (r *Roller) RollupOnce(ctx context.Context) (RollupResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res, err := r.rollup(ctx)
	result := "ok"
	if err != nil {
		result = "error"
	}
	r.metrics.runs.WithLabelValues(result).Inc()
	return res, err
}

func (r *Roller) rollup(ctx context.Context) (RollupResult, error) {
	var res RollupResult
	now := r.opts.Now()
	starts := r.closedBuckets(now)
	keys := make([]string, len(starts))
	pipe := r.opts.Client.Pipeline()
	exists := make([]*redis.IntCmd, len(starts))
	for i, s := range starts {
		keys[i] = BucketKey(r.opts.Namespace, s)
		exists[i] = pipe.Exists(ctx, keys[i])
	}
	if len(starts) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return res, fmt.Errorf("roll up access log: look for buckets: %w", err)
		}
	}
	var errs []error
	for i, s := range starts {
		if exists[i].Val() == 0 {
			continue
		}
		rows, skipped, err := r.rollBucket(ctx, keys[i], s)
		res.Skipped += skipped
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		res.Buckets++
		res.Rows += rows
		r.log.Debug().Str("bucket", keys[i]).Int("rows", rows).Int("skipped", skipped).Msg("bucket rolled up")
	}
	if r.opts.Retention > 0 && ctx.Err() == nil {
		n, err := r.opts.Log.Prune(ctx, now.Add(-r.opts.Retention))
		if err != nil {
			errs = append(errs, err)
		}
		res.Pruned = n
		r.metrics.pruned.Add(float64(n))
	}
	return res, errors.Join(errs...)
}

// closedBuckets lists the starts of the closed buckets within the lookback,
// oldest first.
func (r *Roller) closedBuckets(now time.Time) []time.Time {
	w := r.opts.Bucket
	newest := BucketStart(now.Add(-r.grace), w).Add(-w)
	oldest := BucketStart(now.Add(-r.opts.Lookback), w)
	n := int(newest.Sub(oldest)/w) + 1
	if n <= 0 {
		return nil
	}
	n = min(n, maxBuckets)
	out := make([]time.Time, n)
	for i := range out {
		out[n-1-i] = newest.Add(-time.Duration(i) * w)
	}
	return out
}

// rollBucket copies one bucket into the table in one transaction, then deletes
// it from Redis. If the delete fails, the next run writes the same counts again.
func (r *Roller) rollBucket(ctx context.Context, key string, start time.Time) (rows, skipped int, err error) {
	tx, err := r.opts.Log.pool.Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("roll up %s: begin: %w", key, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	batch := make(map[string]int64, flushRows)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		ks := make([]string, 0, len(batch))
		hs := make([]int64, 0, len(batch))
		for k, h := range batch {
			ks = append(ks, k)
			hs = append(hs, h)
		}
		if _, err := tx.Exec(ctx, rollupSQL, start, ks, hs); err != nil {
			return fmt.Errorf("roll up %s: write %d rows: %w", key, len(ks), hint(err))
		}
		rows += len(ks)
		clear(batch)
		return nil
	}
	var cursor uint64
	for {
		page, next, err := r.opts.Client.ZScan(ctx, key, cursor, "", scanCount).Result()
		if err != nil {
			return 0, skipped, fmt.Errorf("roll up %s: read: %w", key, err)
		}
		for i := 0; i+1 < len(page); i += 2 {
			member, score := page[i], page[i+1]
			hits, ok := parseHits(score)
			if !ok || !loggable(member) {
				skipped++
				continue
			}
			batch[member] = max(batch[member], hits)
		}
		if len(batch) >= flushRows {
			if err := flush(); err != nil {
				return 0, skipped, err
			}
		}
		cursor = next
		if cursor == 0 {
			break
		}
	}
	if err := flush(); err != nil {
		return 0, skipped, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, skipped, fmt.Errorf("roll up %s: commit: %w", key, err)
	}
	r.metrics.rows.Add(float64(rows))
	r.metrics.skipped.Add(float64(skipped))
	if err := r.opts.Client.Unlink(ctx, key).Err(); err != nil {
		return rows, skipped, fmt.Errorf("roll up %s: delete after commit (retried next run, harmlessly): %w", key, err)
	}
	return rows, skipped, nil
}

// parseHits turns a ZINCRBY score into a positive count.
func parseHits(score string) (int64, bool) {
	f, err := strconv.ParseFloat(score, 64)
	if err != nil || math.IsNaN(f) || f < 0.5 {
		return 0, false
	}
	if f >= math.MaxInt64/2 {
		return math.MaxInt64 / 2, true
	}
	return int64(math.Round(f)), true
}

// loggable reports whether s could be a cache key: PostgreSQL text takes no NUL
// and no invalid UTF-8, and a key has no control characters and a bounded length.
func loggable(s string) bool {
	if s == "" || len(s) > MaxKeyBytes || !utf8.ValidString(s) {
		return false
	}
	return !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// RankOnce stores the ranking of the top RankTopN keys over the last Lookback
// (see Log.Rank) and returns how many keys it holds.
func (r *Roller) RankOnce(ctx context.Context) (int, error) {
	n, err := r.opts.Log.Rank(ctx, r.opts.Lookback, r.opts.RankTopN)
	result := "ok"
	if err != nil {
		result = "error"
	} else {
		r.metrics.ranked.Set(float64(n))
	}
	r.metrics.rankings.WithLabelValues(result).Inc()
	return n, err
}

// Open rolls up every Interval and stores the ranking every RankInterval, until
// Close or ctx ends. Errors are logged and counted; the loop keeps going.
func (r *Roller) Open(ctx context.Context) error {
	if r.cancel != nil {
		return errors.New("access-log roller: already open")
	}
	tick := r.opts.Interval
	if ri := r.opts.RankInterval; ri > 0 && (tick <= 0 || ri < tick) {
		tick = ri
	}
	ctx, cancel := context.WithCancelCause(ctx)
	r.cancel = cancel
	r.g = &errgroup.Group{}
	if tick <= 0 {
		return nil
	}
	r.g.Go(func() error {
		t := time.NewTicker(tick)
		defer t.Stop()
		var lastRollup, lastRank time.Time
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
			if r.opts.Gate != nil && !r.opts.Gate() {
				continue
			}
			// Due a little early, so that a tick's jitter never skips a turn.
			due := func(last time.Time, every time.Duration) bool {
				return every > 0 && time.Since(last) >= every-tick/2
			}
			if due(lastRollup, r.opts.Interval) {
				lastRollup = time.Now()
				res, err := r.RollupOnce(ctx)
				if err != nil && ctx.Err() == nil {
					r.log.Warn().Err(err).Int("buckets", res.Buckets).Msg("access-log roll-up incomplete; retried next run")
				} else if res.Buckets > 0 || res.Pruned > 0 {
					r.log.Info().Int("buckets", res.Buckets).Int("rows", res.Rows).Int("skipped", res.Skipped).
						Int64("pruned", res.Pruned).Msg("access log rolled up")
				}
			}
			if due(lastRank, r.opts.RankInterval) && r.opts.RankTopN > 0 {
				lastRank = time.Now()
				t0 := time.Now()
				n, err := r.RankOnce(ctx)
				if err != nil && ctx.Err() == nil {
					r.log.Warn().Err(err).Msg("access-log ranking failed; pre-warms rank live until it works")
				} else if err == nil {
					r.log.Debug().Int("keys", n).Dur("took", time.Since(t0)).Msg("access-log ranking stored")
				}
			}
		}
	})
	return nil
}

// Close stops the loop and waits for a roll-up in progress, within ctx.
func (r *Roller) Close(ctx context.Context) error {
	if r.cancel == nil {
		return nil
	}
	r.cancel(ErrClosed)
	done := make(chan struct{})
	go func() { _ = r.g.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close access-log roller: %w", ctx.Err())
	}
}

type rollerMetrics struct {
	runs     *prometheus.CounterVec
	rows     prometheus.Counter
	skipped  prometheus.Counter
	pruned   prometheus.Counter
	rankings *prometheus.CounterVec
	ranked   prometheus.Gauge
}

func newRollerMetrics(reg prometheus.Registerer) *rollerMetrics {
	m := &rollerMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_access_log_rollups_total",
			Help: "Roll-ups of the Redis access-log buckets into PostgreSQL, by result (ok, error).",
		}, []string{"result"}),
		rows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hearth_access_log_rolled_up_rows_total",
			Help: "Access-log rows (one key in one bucket) written by roll-ups.",
		}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hearth_access_log_skipped_keys_total",
			Help: "Members of Redis access-log buckets not rolled up: not a possible cache key, or a count below 1.",
		}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hearth_access_log_pruned_rows_total",
			Help: "Access-log rows deleted because they were older than access_log.retention.",
		}),
		rankings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_access_log_rankings_total",
			Help: "Rankings of the top keys stored for pre-warms, by result (ok, error).",
		}, []string{"result"}),
		ranked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_access_log_ranked_keys",
			Help: "Keys in the last stored ranking.",
		}),
	}
	reg.MustRegister(m.runs, m.rows, m.skipped, m.pruned, m.rankings, m.ranked)
	return m
}
