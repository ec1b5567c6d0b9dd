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
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Table is the access-log table, resolved through the connection's search_path.
const Table = "hearth_access_log"

// Log reads and writes the access-log table.
type Log struct {
	pool *pgxpool.Pool
}

// New returns the access log held in the database pool connects to.
func New(pool *pgxpool.Pool) *Log { return &Log{pool: pool} }

// topQuery ranks keys by their reads since $1 ($2 keys at most). The window is
// a range of the primary key (bucket, key); ties are broken by key so that the
// same log always yields the same list.
const topQuery = `SELECT key FROM ` + Table + `
WHERE bucket >= $1
GROUP BY key
ORDER BY sum(hits) DESC, key
LIMIT $2`

// TopKeys returns at most n keys read in buckets starting at or after since,
// the most read first.
func (l *Log) TopKeys(ctx context.Context, since time.Time, n int) ([]string, error) {
	if n <= 0 {
		return nil, nil
	}
	rows, err := l.pool.Query(ctx, topQuery, since, n)
	if err != nil {
		return nil, fmt.Errorf("read top %d keys of %s: %w", n, Table, err)
	}
	defer rows.Close()
	out := make([]string, 0, min(n, 1<<16))
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, fmt.Errorf("read top keys of %s: %w", Table, err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read top keys of %s: %w", Table, err)
	}
	return out, nil
}

// RecordSQL is the statement an application batches its reads into: $1 is the
// bucket start, $2 the keys (text[]) and $3 their read counts (bigint[]), one
// entry per distinct key. Counts add up, so a batch must be sent once.
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
		return fmt.Errorf("record %d keys in %s: %w", len(keys), Table, err)
	}
	return nil
}

// rollupSQL writes one closed bucket's counts, read from Redis. It keeps the
// larger of the stored and the new count rather than adding: running it again
// with the same counts (a retried roll-up) changes nothing, and a few reads
// that land in Redis after the bucket was rolled up can never lower a count.
const rollupSQL = `INSERT INTO ` + Table + ` (bucket, key, hits)
SELECT $1, k, h FROM unnest($2::text[], $3::bigint[]) AS t(k, h)
ON CONFLICT (bucket, key) DO UPDATE SET hits = GREATEST(` + Table + `.hits, EXCLUDED.hits)`

const pruneSQL = `DELETE FROM ` + Table + ` WHERE bucket < $1`

// Prune deletes the buckets that start before cutoff and returns how many rows went.
func (l *Log) Prune(ctx context.Context, cutoff time.Time) (int64, error) {
	tag, err := l.pool.Exec(ctx, pruneSQL, cutoff)
	if err != nil {
		return 0, fmt.Errorf("prune %s before %s: %w", Table, cutoff.UTC().Format(time.RFC3339), err)
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
	return namespace + ":access:" + strconv.FormatInt(start.Unix(), 10)
}

// ErrClosed is returned by a Roller used after Close.
var ErrClosed = errors.New("access-log roller closed")
