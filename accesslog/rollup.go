package accesslog

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/store"
)

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
	// Interval is how often Run's loop rolls up; 0 never (RollupOnce still works).
	Interval time.Duration
	// Lookback is how far back closed buckets are looked for (default 1h);
	// the pre-warm window is the natural value, as older reads do not rank.
	Lookback time.Duration
	// Retention deletes table rows older than this at each roll-up; 0 keeps them.
	Retention time.Duration
	// RankInterval is how often Run's loop stores the ranking of the top
	// RankTopN keys over the last Lookback (see Log.Rank); 0 never.
	RankInterval time.Duration
	RankTopN     int
	Registerer   prometheus.Registerer
	Logger       zerolog.Logger
	// Now is the clock; tests inject it.
	Now func() time.Time
}

// Roller moves closed Redis buckets into the access-log table and deletes them.
//
// A bucket is first renamed to a private key (see rollingKey), atomically with
// a random token written next to it, so that a ZINCRBY that arrives while it is
// read lands in a new bucket key, rolled up by the next run, instead of being
// deleted unread. Its counts are added to the table in one transaction that
// also records the token; the private key is deleted after the commit. A run
// that stops anywhere leaves the private key behind, and the next one resumes
// it: it adds the counts unless the token says they were committed already, so
// every read is counted once.
type Roller struct {
	opts    RollerOptions
	grace   time.Duration
	metrics *rollerMetrics
	log     zerolog.Logger

	mu sync.Mutex // one roll-up at a time
	// hook, set by tests only, is called before a roll-up commits ("commit")
	// and before it deletes its private key ("unlink"); an error stops the
	// roll-up there, as a crash would.
	hook func(stage string) error
}

// NewRoller builds a Roller; nothing runs until Run or RollupOnce.
func NewRoller(opts RollerOptions) (*Roller, error) {
	switch {
	case opts.Log == nil:
		return nil, errors.New("access-log roller: no log")
	case opts.Client == nil:
		return nil, errors.New("access-log roller: no redis client")
	case opts.Namespace == "":
		return nil, errors.New("access-log roller: no namespace")
	case strings.ContainsAny(opts.Namespace, "{}"):
		// The private roll-up key's hash tag is the bucket key: it must not hold one.
		return nil, fmt.Errorf("access-log roller: namespace %q holds a brace", opts.Namespace)
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
	// Resumed private keys a stopped run left behind, rolled up (or found
	// committed already) and deleted.
	Resumed int
	// Rows written to the table (one per key per bucket and roll-up).
	Rows int
	// Skipped members that cannot be cache keys (see MaxKeyBytes) or whose
	// score is no count (infinite, not a number, below 0.5); see the Skip
	// reasons.
	Skipped int
	// Clamped counts above MaxBucketHits, lowered to it.
	Clamped int
	// Foreign bucket keys that were no sorted set, deleted unread.
	Foreign int
	// Pruned rows past the retention.
	Pruned int64
}

// Reasons a bucket member is skipped: the reason label of
// hearth_access_log_skipped_keys_total.
const (
	// SkipTooLong: longer than MaxKeyBytes.
	SkipTooLong = "too_long"
	// SkipMalformed: empty, or invalid UTF-8, a NUL or another control character.
	SkipMalformed = "malformed"
	// SkipBadScore: a score that is no count of reads: infinite, not a
	// number, zero or negative.
	SkipBadScore = "bad_score"
)

// RollupOnce rolls up every closed bucket still in Redis within the lookback,
// oldest first, then prunes rows past the retention. A bucket is closed once it
// ended a grace period ago (the bucket width, at most 10s). A failed bucket
// stays in Redis (under its private name) for the next run; the error names it.
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
	// The bucket, or its private name left by a stopped run (one key per
	// EXISTS: a Cluster pipeline routes each command to its slot).
	exists := make([][2]*redis.IntCmd, len(starts))
	for i, s := range starts {
		keys[i] = BucketKey(r.opts.Namespace, s)
		exists[i] = [2]*redis.IntCmd{pipe.Exists(ctx, keys[i]), pipe.Exists(ctx, rollingKey(r.opts.Namespace, keys[i]))}
	}
	if len(starts) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return res, fmt.Errorf("roll up access log: look for buckets: %w", err)
		}
	}
	var errs []error
	for i, s := range starts {
		if exists[i][0].Val()+exists[i][1].Val() == 0 {
			continue
		}
		if err := r.rollBucket(ctx, keys[i], s, &res); err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
	}
	if ctx.Err() == nil && len(starts) > 0 {
		// A token matters while its bucket can still be looked for.
		if _, err := r.opts.Log.pool.Exec(ctx, pruneRollupsSQL, starts[0].Add(-time.Hour)); err != nil {
			errs = append(errs, fmt.Errorf("prune %s: %w", RollupTable, hint(err)))
		}
	}
	if r.opts.Retention > 0 && ctx.Err() == nil {
		n, err := r.opts.Log.Prune(ctx, now.Add(-r.opts.Retention))
		if err != nil {
			errs = append(errs, err)
		}
		res.Pruned = n
		r.metrics.pruned.Add(float64(n))
	}
	if ctx.Err() == nil {
		if rejects, err := r.opts.Log.Rejects(ctx); err != nil {
			errs = append(errs, err)
		} else {
			for reason, n := range rejects {
				r.metrics.recordingRejects.WithLabelValues(reason).Set(float64(n))
			}
		}
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

// rollingKey is the private name a bucket is renamed to while it is rolled up
// (store.RollupKey), and tokenKey the token of that roll-up.
func rollingKey(namespace, bucketKey string) string { return store.RollupKey(namespace, bucketKey) }

func tokenKey(namespace, bucketKey string) string { return store.RollupTokenKey(namespace, bucketKey) }

// rollBucket rolls up what Redis holds of one bucket: first a private key a
// stopped run left behind, then the bucket itself, renamed to that private key.
func (r *Roller) rollBucket(ctx context.Context, key string, start time.Time, res *RollupResult) error {
	keys := []string{key, rollingKey(r.opts.Namespace, key), tokenKey(r.opts.Namespace, key)}
	// The token must outlive any run that can still look for the bucket.
	ttl := (r.opts.Lookback + time.Hour).Milliseconds()
	// At most: a foreign private key, a leftover, then the bucket.
	for range 4 {
		token, err := newToken()
		if err != nil {
			return fmt.Errorf("roll up %s: %w", key, err)
		}
		v, err := store.RollupClaim.Run(ctx, r.opts.Client, keys, token, ttl).StringSlice()
		if err != nil {
			return fmt.Errorf("roll up %s: claim: %w", key, err)
		}
		if len(v) == 0 {
			return fmt.Errorf("roll up %s: claim: empty answer", key)
		}
		switch v[0] {
		case "none":
			return nil
		case "foreign":
			res.Foreign++
			r.metrics.foreign.Inc()
			r.log.Warn().Str("bucket", key).Str("type", v[1]).
				Msg("access-log bucket is no sorted set (no Hearth or application writes one); deleted unread")
			continue
		case "resume_new":
			r.log.Warn().Str("bucket", keys[1]).
				Msg("access-log roll-up left by a stopped run has no valid token; rolled up again, its counts may be added twice")
		}
		if len(v) < 2 {
			return fmt.Errorf("roll up %s: claim: answer %q", key, v)
		}
		if err := r.apply(ctx, keys[1:], start, v[1], res); err != nil {
			return err
		}
		if v[0] == "claimed" {
			res.Buckets++
			return nil
		}
		res.Resumed++
	}
	return nil
}

// apply adds the counts of a private roll-up key to the table, with its token,
// in one transaction, then deletes the key and its token. keys are the private
// key and the token key.
func (r *Roller) apply(ctx context.Context, keys []string, start time.Time, token string, res *RollupResult) error {
	name := keys[0]
	tx, err := r.opts.Log.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("roll up %s: begin: %w", name, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	tag, err := tx.Exec(ctx, claimRollupSQL, start, token)
	if err != nil {
		return fmt.Errorf("roll up %s: record token: %w", name, hint(err))
	}
	if tag.RowsAffected() == 0 {
		// Committed by a run that stopped before deleting the key.
		r.log.Info().Str("bucket", name).Msg("access-log roll-up was committed by an earlier run; deleting what it left")
		if err := r.opts.Client.Unlink(ctx, keys...).Err(); err != nil {
			return fmt.Errorf("roll up %s: delete after an earlier commit: %w", name, err)
		}
		return nil
	}

	var (
		rows, clamped int
		skipped       [3]int
		example       [3]string
		ks            = make([]string, 0, flushRows)
		hs            = make([]int64, 0, flushRows)
	)
	flush := func() error {
		if len(ks) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, rollupSQL, start, ks, hs); err != nil {
			return fmt.Errorf("roll up %s: write %d rows: %w", name, len(ks), hint(err))
		}
		rows += len(ks)
		ks, hs = ks[:0], hs[:0]
		return nil
	}
	// Nothing writes the private key: pages by rank see every member exactly
	// once (ZSCAN may repeat one, and counts are added).
	for i := int64(0); ; i += scanCount {
		page, err := r.opts.Client.ZRangeWithScores(ctx, name, i, i+scanCount-1).Result()
		if err != nil {
			return fmt.Errorf("roll up %s: read: %w", name, err)
		}
		for _, z := range page {
			member, _ := z.Member.(string)
			reason := memberProblem(member)
			hits, ok, lowered := parseHits(z.Score)
			if reason == "" && !ok {
				reason = SkipBadScore
			}
			if reason != "" {
				n := skipIndex(reason)
				if skipped[n]++; skipped[n] == 1 {
					example[n] = describe(member, z.Score)
				}
				continue
			}
			if lowered {
				clamped++
			}
			ks = append(ks, member)
			hs = append(hs, hits)
		}
		if len(ks) >= flushRows {
			if err := flush(); err != nil {
				return err
			}
		}
		if len(page) < scanCount {
			break
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if err := r.stop("commit"); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("roll up %s: commit: %w", name, err)
	}
	total := 0
	for n, reason := range skipReasons {
		total += skipped[n]
		if skipped[n] > 0 {
			r.metrics.skipped.WithLabelValues(reason).Add(float64(skipped[n]))
			r.log.Warn().Str("bucket", name).Str("reason", reason).Int("members", skipped[n]).
				Str("example", example[n]).Msg("access-log members skipped")
		}
	}
	if clamped > 0 {
		r.log.Warn().Str("bucket", name).Int("members", clamped).Int64("max", MaxBucketHits).
			Msg("access-log counts above the per-bucket maximum lowered to it")
	}
	r.metrics.rows.Add(float64(rows))
	r.metrics.clamped.Add(float64(clamped))
	res.Rows += rows
	res.Skipped += total
	res.Clamped += clamped
	r.log.Debug().Str("bucket", name).Int("rows", rows).Int("skipped", total).Msg("bucket rolled up")
	if err := r.stop("unlink"); err != nil {
		return err
	}
	if err := r.opts.Client.Unlink(ctx, keys...).Err(); err != nil {
		return fmt.Errorf("roll up %s: delete after commit (the next run finds it committed): %w", name, err)
	}
	return nil
}

// stop runs the test hook at a stage.
func (r *Roller) stop(stage string) error {
	if r.hook == nil {
		return nil
	}
	return r.hook(stage)
}

var skipReasons = [3]string{SkipTooLong, SkipMalformed, SkipBadScore}

func skipIndex(reason string) int {
	for i, r := range skipReasons {
		if r == reason {
			return i
		}
	}
	return len(skipReasons) - 1
}

// describe makes a skipped member safe and short for a log line.
func describe(member string, score float64) string {
	n := len(member)
	if len(member) > 64 {
		member = member[:64] + "…"
	}
	return fmt.Sprintf("%q (%d bytes) score %g", member, n, score)
}

// newToken returns 32 random hex digits, the token of one roll-up.
func newToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("roll-up token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// parseHits turns a ZINCRBY score into a count of reads: false for a score
// that is none (NaN, ±Inf, below 0.5); a count above MaxBucketHits is lowered
// to it (lowered true).
func parseHits(score float64) (hits int64, ok, lowered bool) {
	switch {
	case math.IsNaN(score) || math.IsInf(score, 0) || score < 0.5:
		return 0, false, false
	case score > float64(MaxBucketHits):
		return MaxBucketHits, true, true
	}
	return int64(math.Round(score)), true, false
}

// memberProblem says why s cannot be a cache key ("" when it can):
// PostgreSQL text takes no NUL and no invalid UTF-8, a key has no control
// characters, and its length is bounded below the btree limit.
func memberProblem(s string) string {
	switch {
	case len(s) > MaxKeyBytes:
		return SkipTooLong
	case s == "" || !utf8.ValidString(s) ||
		strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return SkipMalformed
	}
	return ""
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

// Run rolls up every Interval and stores the ranking every RankInterval,
// until ctx ends (the leader's term: only the leader rolls up), and returns
// once a roll-up in progress stopped. Errors are logged and counted; the loop
// keeps going.
func (r *Roller) Run(ctx context.Context) error {
	tick := r.opts.Interval
	if ri := r.opts.RankInterval; ri > 0 && (tick <= 0 || ri < tick) {
		tick = ri
	}
	if tick <= 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	var lastRollup, lastRank time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
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
				r.log.Debug().Int("keys", n).Dur("took_ms", time.Since(t0)).Msg("access-log ranking stored")
			}
		}
	}
}

type rollerMetrics struct {
	runs             *prometheus.CounterVec
	rows             prometheus.Counter
	skipped          *prometheus.CounterVec
	clamped          prometheus.Counter
	foreign          prometheus.Counter
	recordingRejects *prometheus.GaugeVec
	pruned           prometheus.Counter
	rankings         *prometheus.CounterVec
	ranked           prometheus.Gauge
}

func newRollerMetrics(reg prometheus.Registerer) *rollerMetrics {
	f := promauto.With(reg)
	m := &rollerMetrics{
		runs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_access_log_rollups_total",
			Help: "Roll-ups of the Redis access-log buckets into PostgreSQL, by result (ok, error).",
		}, []string{"result"}),
		rows: f.NewCounter(prometheus.CounterOpts{
			Name: "hearth_access_log_rolled_up_rows_total",
			Help: "Access-log rows (one key in one bucket) written by roll-ups.",
		}),
		skipped: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_access_log_skipped_keys_total",
			Help: "Members of Redis access-log buckets not rolled up, by reason (too_long, malformed, bad_score).",
		}, []string{"reason"}),
		clamped: f.NewCounter(prometheus.CounterOpts{
			Name: "hearth_access_log_clamped_counts_total",
			Help: "Members of Redis access-log buckets whose count was above the per-bucket maximum, lowered to it.",
		}),
		foreign: f.NewCounter(prometheus.CounterOpts{
			Name: "hearth_access_log_foreign_buckets_total",
			Help: "Redis access-log bucket keys that were no sorted set, deleted unread.",
		}),
		recordingRejects: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_access_log_recording_rejects",
			Help: "Rows the access-log table's guard dropped or lowered since it was created, by reason (too_long, bad_count, clamped), as of the last roll-up.",
		}, []string{"reason"}),
		pruned: f.NewCounter(prometheus.CounterOpts{
			Name: "hearth_access_log_pruned_rows_total",
			Help: "Access-log rows deleted because they were older than access_log.retention.",
		}),
		rankings: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_access_log_rankings_total",
			Help: "Rankings of the top keys stored for pre-warms, by result (ok, error).",
		}, []string{"result"}),
		ranked: f.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_access_log_ranked_keys",
			Help: "Keys in the last stored ranking.",
		}),
	}
	for _, reason := range skipReasons {
		m.skipped.WithLabelValues(reason)
	}
	return m
}
