// Package accesslog owns the access log: the PostgreSQL table hearth_access_log
// (created by `hearth migrate up`) that counts the application's cache reads per
// key per time bucket, the "top N keys over the last W" query pre-warm ranks
// keys by, and the roll-up of the per-bucket Redis sorted sets that
// applications may count reads in instead of writing to PostgreSQL.
package accesslog

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/hearth-dev/hearth/store"
)

// Tables Hearth reads and writes, resolved through the connection's search_path.
const (
	// Table is the access log: reads per key per time bucket.
	Table = "hearth_access_log"
	// RankTable is the stored ranking, RankInfoTable its one row of metadata.
	RankTable     = "hearth_access_rank"
	RankInfoTable = "hearth_access_rank_info"
)

// Where a list of top keys came from.
const (
	// RankingStored: the ranking Rank stored, fresh enough to use.
	RankingStored = "stored"
	// RankingLive: the access log, aggregated and sorted on the spot.
	RankingLive = "live"
)

// Ranking modes: which ranking EachTopKey may read (SetMode).
const (
	// ModeAuto reads the stored ranking when it is fresh (see UseRanking),
	// else ranks live.
	ModeAuto = "auto"
	// ModeLive always ranks live.
	ModeLive = "live"
	// ModeStored reads the stored ranking and fails with ErrStaleRanking
	// when it is not fresh, rather than rank the whole window live.
	ModeStored = "stored"
)

// ErrStaleRanking is EachTopKey's error in ModeStored when the stored ranking
// cannot stand in for a live one; the error says why.
var ErrStaleRanking = errors.New("the stored ranking is not fresh")

// Ranking describes the ranking a list of top keys came from.
type Ranking struct {
	// Source is RankingStored or RankingLive.
	Source string
	// At is when the ranking was computed, by the database clock: a stored
	// one's computation, or now for a live one. Age is how old it was when
	// read (0 for a live one).
	At  time.Time
	Age time.Duration
	// From and To are the first and last bucket starts it ranks: the window
	// before At, in buckets of the access log's width.
	From, To time.Time
	// Stale says why a stored ranking was not used ("" when it was, or when
	// the mode did not ask for one).
	Stale string
}

// String says which ranking it is, how old, the buckets it spans, and why a
// stored one was passed over: what `hearth prewarm` and the admin API report.
func (r Ranking) String() string {
	if r.Source == "" {
		return "none (no access log)"
	}
	const at = "2006-01-02 15:04:05Z"
	span := fmt.Sprintf("buckets %s to %s", r.From.UTC().Format(at), r.To.UTC().Format(at))
	if r.Source == RankingStored {
		return fmt.Sprintf("stored, %s old, %s", r.Age.Round(time.Second), span)
	}
	s := "live, " + span
	if r.Stale != "" {
		s += " (not the stored ranking: " + r.Stale + ")"
	}
	return s
}

// Log reads and writes the access-log tables.
type Log struct {
	pool       *pgxpool.Pool
	rankMaxAge time.Duration
	bucket     time.Duration
	mode       string
	last       atomic.Pointer[Ranking]
}

// New returns the access log held in the database pool connects to. It ranks
// live until UseRanking is called.
func New(pool *pgxpool.Pool) *Log { return &Log{pool: pool, bucket: time.Minute, mode: ModeAuto} }

// UseRanking makes EachTopKey read the ranking stored by Rank when it is
// fresh: at most maxAge old (by the database clock), over the same window,
// holding enough keys and at least one, and computed after the newest closed
// bucket of the access log ended (so it has seen every closed bucket's
// reads; the open bucket's count from the next ranking). Otherwise it ranks
// live. Zero always ranks live.
func (l *Log) UseRanking(maxAge time.Duration) *Log {
	l.rankMaxAge = maxAge
	return l
}

// SetBucket sets the width of the access log's buckets (access_log.bucket),
// which tells which buckets are closed; the default is a minute.
func (l *Log) SetBucket(width time.Duration) *Log {
	if width > 0 {
		l.bucket = width
	}
	return l
}

// SetMode sets which ranking EachTopKey reads: ModeAuto (the default),
// ModeLive or ModeStored.
func (l *Log) SetMode(mode string) error {
	switch mode {
	case ModeAuto, ModeLive, ModeStored:
		l.mode = mode
		return nil
	}
	return fmt.Errorf("ranking mode %q: want auto, live or stored", mode)
}

// LastRanking tells where the last EachTopKey got its keys: RankingStored or
// RankingLive ("" before the first call).
func (l *Log) LastRanking() string { return l.LastRankingInfo().Source }

// DescribeLastRanking is LastRankingInfo as text (Ranking.String); a
// pre-warm's report carries it.
func (l *Log) DescribeLastRanking() string { return l.LastRankingInfo().String() }

// LastRankingInfo describes the ranking the last EachTopKey read (zero before
// the first call).
func (l *Log) LastRankingInfo() Ranking {
	if r := l.last.Load(); r != nil {
		return *r
	}
	return Ranking{}
}

// Bounds on what the access log holds. The table enforces both itself
// (migration 00004: a trigger drops a longer key or a negative count and lowers
// a larger count, counting each in RejectsTable), and the roll-up checks them
// before it writes, so that one bad member is skipped, never the batch.
const (
	// MaxKeyBytes bounds a key in the access log. A PostgreSQL btree index
	// entry is limited to about 2,700 bytes, and a longer key fails the whole
	// INSERT … ON CONFLICT statement, every key of the batch with it. No declared
	// template and member come near it (members are at most 128 bytes by
	// default), so a longer string is not a cache key.
	MaxKeyBytes = 1024
	// MaxBucketHits bounds the reads of one key in one bucket: a trillion, far
	// above any real traffic (16 billion reads a second in a one-minute
	// bucket), small enough that adding two counts cannot overflow a bigint
	// and exact in a float64 (a Redis score).
	MaxBucketHits int64 = 1_000_000_000_000
)

// topQuery ranks keys by their reads over the last $1 milliseconds ($2 keys at
// most), by the database clock. The window is a range of the primary key
// (bucket, key). The sum (numeric, it cannot overflow) is capped at the
// largest bigint and sorted as one (numeric is far slower to sort), and ties
// are broken by key, byte by byte (cheaper than the locale), so that the same
// log yields the same list. topMatchingQuery narrows its WHERE.
const topQuery = topSelect + topRanked

const topSelect = `SELECT key, LEAST(sum(hits), 9223372036854775807)::bigint AS h FROM ` + Table + `
WHERE bucket >= now() - make_interval(secs => $1::float8 / 1000)`

const topRanked = `
GROUP BY key
ORDER BY h DESC, key COLLATE "C"
LIMIT $2`

// rankChunk is how many keys one row of the stored ranking holds.
const rankChunk = 1000

// storedQuery reads the first $1 chunks of the stored ranking: one index scan,
// streaming at once.
const storedQuery = `SELECT keys FROM ` + RankTable + ` ORDER BY chunk LIMIT $1`

// rankInfoQuery reads what freshness is judged on, by the database clock:
// now, the stored ranking's metadata (NULLs without a ranking), and the start
// of the newest closed bucket of the access log ($1: the bucket width in
// milliseconds; one backward scan of the primary key).
const rankInfoQuery = `SELECT now(), i.computed_at, i.window_ms, i.top_n, i.keys,
	(SELECT max(bucket) FROM ` + Table + ` WHERE bucket <= now() - make_interval(secs => $1::float8 / 1000))
FROM (SELECT 1) one LEFT JOIN ` + RankInfoTable + ` i ON true`

// rankInfo is a row of rankInfoQuery.
type rankInfo struct {
	now, computedAt, newestClosed *time.Time
	windowMS, topN, keys          *int64
}

// stale says why the stored ranking cannot stand in for a live ranking of n
// keys over window, "" when it can.
func (r rankInfo) stale(window time.Duration, n int, maxAge, bucket time.Duration) string {
	switch {
	case r.computedAt == nil:
		return "no ranking stored yet"
	case *r.keys == 0:
		return "the stored ranking holds no keys"
	case *r.windowMS != window.Milliseconds():
		return fmt.Sprintf("the stored ranking covers a window of %s, not %s", time.Duration(*r.windowMS)*time.Millisecond, window)
	case *r.topN < int64(n) && *r.keys >= *r.topN:
		return fmt.Sprintf("the stored ranking holds %d keys, fewer than the %d wanted", *r.keys, n)
	case r.now.Sub(*r.computedAt) > maxAge:
		return fmt.Sprintf("the stored ranking is %s old, over its maximum age %s", r.now.Sub(*r.computedAt).Round(time.Second), maxAge)
	case r.newestClosed != nil && r.computedAt.Before(r.newestClosed.Add(bucket)):
		return fmt.Sprintf("the stored ranking (%s) predates the end of the newest closed bucket (%s)",
			r.computedAt.UTC().Format(time.TimeOnly), r.newestClosed.Add(bucket).UTC().Format(time.TimeOnly))
	}
	return ""
}

// rankWorkMem is the work_mem the ranking runs with: enough to aggregate and
// sort a few hundred thousand keys in memory rather than on disk. It is set for
// the ranking's own transaction only.
const rankWorkMem = "64MB"

// EachTopKey calls fn with at most n keys read over the last window, the most
// read first, as the rows arrive: from the stored ranking when it is fresh (see
// UseRanking) and the mode allows, else ranked live. LastRankingInfo tells
// which afterwards.
func (l *Log) EachTopKey(ctx context.Context, window time.Duration, n int, fn func(key string)) error {
	if n <= 0 {
		return nil
	}
	query, args := topQuery, []any{window.Milliseconds(), n}
	rk := Ranking{Source: RankingLive}
	if l.mode != ModeLive && (l.rankMaxAge > 0 || l.mode == ModeStored) {
		var ri rankInfo
		err := l.pool.QueryRow(ctx, rankInfoQuery, l.bucket.Milliseconds()).
			Scan(&ri.now, &ri.computedAt, &ri.windowMS, &ri.topN, &ri.keys, &ri.newestClosed)
		switch {
		case err != nil:
			// No table yet (an older schema): rank live.
			rk.Stale = fmt.Sprintf("no stored ranking: %v", hint(err))
		case l.rankMaxAge <= 0:
			rk.Stale = "stored rankings are off (access_log.rank_interval is 0)"
		default:
			rk.Stale = ri.stale(window, n, l.rankMaxAge, l.bucket)
		}
		if rk.Stale == "" {
			query, args = storedQuery, []any{(n + rankChunk - 1) / rankChunk}
			rk = Ranking{Source: RankingStored, At: *ri.computedAt, Age: ri.now.Sub(*ri.computedAt)}
		} else if ri.now != nil {
			rk.At = *ri.now
		}
		if l.mode == ModeStored && rk.Source != RankingStored {
			l.last.Store(&rk)
			return fmt.Errorf("read top %d keys of %s: %w: %s", n, RankTable, ErrStaleRanking, rk.Stale)
		}
	}
	if rk.At.IsZero() {
		rk.At = time.Now()
	}
	rk.From, rk.To = BucketStart(rk.At.Add(-window), l.bucket), BucketStart(rk.At, l.bucket)
	l.last.Store(&rk)
	source := rk.Source
	tx, err := l.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("read top %d keys of %s: %w", n, Table, hint(err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if source == RankingLive {
		if _, err := tx.Exec(ctx, "SET LOCAL work_mem = '"+rankWorkMem+"'"); err != nil {
			return fmt.Errorf("read top %d keys of %s: %w", n, Table, hint(err))
		}
	}
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("read top %d keys of %s: %w", n, Table, hint(err))
	}
	defer rows.Close()
	var (
		k     string
		h     int64
		chunk []string
		sent  int
	)
	for rows.Next() && sent < n {
		if source == RankingStored {
			if err := rows.Scan(&chunk); err != nil {
				return fmt.Errorf("read top keys of %s: %w", RankTable, err)
			}
			for _, k := range chunk[:min(len(chunk), n-sent)] {
				fn(k)
			}
			sent += len(chunk)
			continue
		}
		if err := rows.Scan(&k, &h); err != nil {
			return fmt.Errorf("read top keys of %s: %w", Table, err)
		}
		fn(k)
		sent++
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read top keys of %s: %w", Table, err)
	}
	return nil
}

// TopKeys returns at most n keys read over the last window, the most read first.
func (l *Log) TopKeys(ctx context.Context, window time.Duration, n int) ([]string, error) {
	var out []string
	err := l.EachTopKey(ctx, window, n, func(k string) { out = append(out, k) })
	return out, err
}

// rankSQL replaces the stored ranking with the live one, in chunks of $3
// keys, and returns how many keys it stored. It runs in one
// transaction: readers see the old ranking until it commits.
const rankSQL = `WITH ranked AS (
	SELECT key, row_number() OVER (ORDER BY h DESC, key COLLATE "C") AS rn FROM (` + topQuery + `) t
), ins AS (
	INSERT INTO ` + RankTable + ` (chunk, keys)
	SELECT (rn - 1) / $3::int, array_agg(key ORDER BY rn) FROM ranked GROUP BY 1
	RETURNING cardinality(keys) AS n
)
SELECT coalesce(sum(n), 0)::int FROM ins`

const rankInfoSQL = `INSERT INTO ` + RankInfoTable + ` (singleton, computed_at, window_ms, top_n, keys)
VALUES (true, now(), $1, $2, $3)
ON CONFLICT (singleton) DO UPDATE SET computed_at = EXCLUDED.computed_at,
	window_ms = EXCLUDED.window_ms, top_n = EXCLUDED.top_n, keys = EXCLUDED.keys`

// Rank computes the top n keys over the last window and stores them, so that a
// pre-warm can read them at once. It returns how many keys it stored. Two Rank
// calls at once run one after the other.
func (l *Log) Rank(ctx context.Context, window time.Duration, n int) (int, error) {
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("rank %s: %w", Table, hint(err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, q := range []string{
		"SET LOCAL work_mem = '" + rankWorkMem + "'",
		// Writers wait for each other; readers (plain SELECT) never wait.
		"LOCK TABLE " + RankTable + " IN EXCLUSIVE MODE",
		"DELETE FROM " + RankTable,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			return 0, fmt.Errorf("rank %s: %w", Table, hint(err))
		}
	}
	var keys int
	if err := tx.QueryRow(ctx, rankSQL, window.Milliseconds(), n, rankChunk).Scan(&keys); err != nil {
		return 0, fmt.Errorf("rank %s: %w", Table, hint(err))
	}
	if _, err := tx.Exec(ctx, rankInfoSQL, window.Milliseconds(), n, keys); err != nil {
		return 0, fmt.Errorf("rank %s: %w", Table, hint(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("rank %s: commit: %w", Table, err)
	}
	return keys, nil
}

// RecordSQL is the statement an application batches its reads into: $1 is the
// bucket start, $2 the keys (text[]) and $3 their read counts (bigint[]), one
// entry per distinct key. Counts add up, so a batch must be sent once. The
// table's guard drops a key longer than MaxKeyBytes or a negative count and
// lowers a count above MaxBucketHits, counting each (see Rejects), so that one
// bad entry never fails the batch.
const RecordSQL = `INSERT INTO ` + Table + ` (bucket, key, hits)
SELECT $1, k, h FROM unnest($2::text[], $3::bigint[]) AS t(k, h)
ON CONFLICT (bucket, key) DO UPDATE SET hits = ` + Table + `.hits + EXCLUDED.hits`

// Record adds reads to the bucket that contains at (of the given width), with
// the documented statement; it is what an application does, offered for
// tools and tests.
func (l *Log) Record(ctx context.Context, at time.Time, width time.Duration, hits map[string]int64) error {
	if len(hits) == 0 {
		return nil
	}
	keys := make([]string, 0, len(hits))
	counts := make([]int64, 0, len(hits))
	for k, n := range hits {
		keys = append(keys, k)
		counts = append(counts, n)
	}
	if _, err := l.pool.Exec(ctx, RecordSQL, BucketStart(at, width), keys, counts); err != nil {
		return fmt.Errorf("record %d keys in %s: %w", len(keys), Table, hint(err))
	}
	return nil
}

// rollupSQL adds counts read from a Redis bucket to the table. It adds rather
// than keeps the larger count: the reads of a bucket can arrive in several
// roll-ups (a straggler ZINCRBY after the bucket was renamed away lands in a new
// bucket key, rolled up by the next run), and each roll-up is applied once (see
// claimRollupSQL). The sum is computed as numeric and capped, so it cannot
// overflow whatever the table held.
var rollupSQL = `INSERT INTO ` + Table + ` (bucket, key, hits)
SELECT $1, k, h FROM unnest($2::text[], $3::bigint[]) AS t(k, h)
ON CONFLICT (bucket, key) DO UPDATE SET hits = LEAST(` + Table + `.hits::numeric + EXCLUDED.hits, ` + maxBucketHitsSQL + `)::bigint`

// maxBucketHitsSQL is MaxBucketHits as an SQL literal.
var maxBucketHitsSQL = strconv.FormatInt(MaxBucketHits, 10)

// RollupTable records the roll-ups already committed, by bucket and token.
const RollupTable = "hearth_access_rollup"

// RejectsTable counts, by reason, the rows the table's guard dropped or lowered.
const RejectsTable = "hearth_access_log_rejects"

// claimRollupSQL records that the roll-up with token $2 of bucket $1 is
// applied; in the transaction that adds its counts, so that it is applied once.
// No row inserted: it was applied before (a run crashed after its commit).
const claimRollupSQL = `INSERT INTO ` + RollupTable + ` (bucket, token) VALUES ($1, $2) ON CONFLICT DO NOTHING`

const pruneRollupsSQL = `DELETE FROM ` + RollupTable + ` WHERE bucket < $1`

const rejectsSQL = `SELECT reason, n FROM ` + RejectsTable

// Rejects returns how many rows the table's guard dropped or lowered since the
// migration, by reason: too_long, bad_count, clamped.
func (l *Log) Rejects(ctx context.Context) (map[string]int64, error) {
	rows, err := l.pool.Query(ctx, rejectsSQL)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", RejectsTable, hint(err))
	}
	out := map[string]int64{}
	var (
		reason string
		n      int64
	)
	_, err = pgx.ForEachRow(rows, []any{&reason, &n}, func() error {
		out[reason] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", RejectsTable, err)
	}
	return out, nil
}

const pruneSQL = `DELETE FROM ` + Table + ` WHERE bucket < $1`

// Prune deletes the buckets that start before cutoff and returns how many rows went.
func (l *Log) Prune(ctx context.Context, cutoff time.Time) (int64, error) {
	tag, err := l.pool.Exec(ctx, pruneSQL, cutoff)
	if err != nil {
		return 0, fmt.Errorf("prune %s before %s: %w", Table, cutoff.UTC().Format(time.RFC3339), hint(err))
	}
	return tag.RowsAffected(), nil
}

// BucketStart returns the start of the bucket of the given width that holds t:
// floor(unix seconds / width) * width, in UTC. Applications compute the same.
func BucketStart(t time.Time, width time.Duration) time.Time {
	w := int64(width / time.Second)
	if w <= 0 {
		w = 1
	}
	s := t.Unix()
	s -= ((s % w) + w) % w
	return time.Unix(s, 0).UTC()
}

// BucketKey is the Redis sorted set counting the reads of the bucket that
// starts at start: "<namespace>:access:<unix seconds>". Applications run
// ZINCRBY <BucketKey> 1 <cache key> per read.
func BucketKey(namespace string, start time.Time) string {
	return store.AccessBucketKey(namespace, start)
}

// hint adds the fix to an error about a missing table: the schema was never migrated.
func hint(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == undefinedTable {
		return fmt.Errorf("%w (create the access-log tables with `hearth migrate up`)", err)
	}
	return err
}

// undefinedTable is PostgreSQL's SQLSTATE for a missing relation.
const undefinedTable = "42P01"
