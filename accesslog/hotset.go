package accesslog

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// topMatchingQuery is topQuery restricted to the keys LIKE $3 (a family's
// prefix, at least one character, its suffix; bound, with '!' escaping the
// wildcards of the literal parts).
const topMatchingQuery = topSelect + ` AND key LIKE $3 ESCAPE '!'` + topRanked

// storedInfoQuery tells how many keys the stored ranking of a window holds
// and how many it was asked for, when it is at most $2 milliseconds old.
const storedInfoQuery = `SELECT top_n, keys FROM ` + RankInfoTable + `
WHERE window_ms = $1 AND computed_at >= now() - make_interval(secs => $2::float8 / 1000)`

// storedAllQuery streams the whole stored ranking, chunk by chunk.
const storedAllQuery = `SELECT keys FROM ` + RankTable + ` ORDER BY chunk`

// LikePattern is the LIKE pattern (escape character '!') of the keys that
// start with prefix, end with suffix and have at least one character between.
func LikePattern(prefix, suffix string) string {
	esc := strings.NewReplacer("!", "!!", "%", "!%", "_", "!_")
	return esc.Replace(prefix) + "_%" + esc.Replace(suffix)
}

// EachTopMatching calls fn with at most n of the keys read over the last
// window that start with prefix and end with suffix (a family's keys), the
// most read first, until fn returns false. It reads the stored ranking when it
// is fresh (see UseRanking) and covers the window, filtering it in order: the
// global ranking's order is the family's order. When the stored ranking ran
// out before fn had enough and it does not hold every key there was, it ranks
// live, the family's keys only. It returns where the keys came from.
func (l *Log) EachTopMatching(ctx context.Context, window time.Duration, n int, prefix, suffix string, fn func(key string) bool) (string, error) {
	if n <= 0 {
		return RankingLive, nil
	}
	if l.rankMaxAge > 0 {
		keys, done, err := l.storedMatching(ctx, window, n, prefix, suffix)
		if err != nil {
			return RankingStored, err
		}
		if done {
			for _, k := range keys {
				if !fn(k) {
					break
				}
			}
			return RankingStored, nil
		}
	}
	tx, err := l.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return RankingLive, fmt.Errorf("rank keys %s…%s of %s: %w", prefix, suffix, Table, hint(err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SET LOCAL work_mem = '"+rankWorkMem+"'"); err != nil {
		return RankingLive, fmt.Errorf("rank keys of %s: %w", Table, hint(err))
	}
	rows, err := tx.Query(ctx, topMatchingQuery, window.Milliseconds(), n, LikePattern(prefix, suffix))
	if err != nil {
		return RankingLive, fmt.Errorf("rank keys of %s: %w", Table, hint(err))
	}
	defer rows.Close()
	var (
		k string
		h int64
	)
	for rows.Next() {
		if err := rows.Scan(&k, &h); err != nil {
			return RankingLive, fmt.Errorf("rank keys of %s: %w", Table, err)
		}
		if !fn(k) {
			break
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return RankingLive, fmt.Errorf("rank keys of %s: %w", Table, err)
	}
	return RankingLive, nil
}

// storedMatching returns the first n keys of the stored ranking that match,
// and whether they are the answer: n matched, or the ranking holds every key
// of the window. It reports false (rank live) when there is no fresh ranking
// of the window, or it holds too few matching keys.
func (l *Log) storedMatching(ctx context.Context, window time.Duration, n int, prefix, suffix string) ([]string, bool, error) {
	var topN, keys int
	err := l.pool.QueryRow(ctx, storedInfoQuery, window.Milliseconds(), l.rankMaxAge.Milliseconds()).Scan(&topN, &keys)
	if err != nil {
		// No row, or no table yet (an older schema): rank live.
		return nil, false, nil
	}
	// One snapshot: a Rank committing meanwhile is not half seen.
	tx, err := l.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", RankTable, hint(err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, storedAllQuery)
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", RankTable, hint(err))
	}
	defer rows.Close()
	var (
		chunk []string
		out   []string
	)
	for rows.Next() {
		if err := rows.Scan(&chunk); err != nil {
			return nil, false, fmt.Errorf("read %s: %w", RankTable, err)
		}
		for _, k := range chunk {
			if len(k) <= len(prefix)+len(suffix) || !strings.HasPrefix(k, prefix) || !strings.HasSuffix(k, suffix) {
				continue
			}
			if out = append(out, k); len(out) >= n {
				return out, true, nil
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("read %s: %w", RankTable, err)
	}
	// Every key there was is in it: nothing more matches.
	return out, keys < topN, nil
}
