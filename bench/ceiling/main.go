// Command ceiling is the pre-warm benchmark's honest ceiling: the fastest plain
// Go program we know for the work `hearth prewarm` does that a user needs. It
// reads the top keys of the access log (the stored ranking, or ranked live with
// the same query as Hearth's) as they stream in, cuts the ids out of the keys,
// and copies the rows from PostgreSQL to Redis in chunks: one query per chunk,
// `id = ANY($1::bigint[])` bound as a typed int8 array through a prepared
// statement, the values read in binary (text as is, jsonb as its JSON text,
// the same bytes Hearth writes), and one pipeline of `SET key value PX ttl`
// per chunk with the TTL jittered as Hearth jitters it, by N workers that start
// while the keys are still read. It does nothing Hearth must do beyond that:
// no validation, no de-duplication, no value bound, no set-if-absent, no fence.
//
// With -nx and -bound it also does the two things a pre-warm owes its users
// beyond the copy, the fastest way a plain program can: it writes with
// `SET … NX` (a value already in Redis is never replaced), and it has the server
// send no value longer than the bound (measured as the text it is sent as,
// converted once in a subquery kept apart: a longer value comes back NULL and
// is not written). The benchmark prints Hearth's ratio to both.
//
// It runs as a process of its own, as `hearth prewarm` does, so that both
// start from a fresh heap. With one connection open to each server, as
// Hearth's clock starts, it starts the clock, opens its workers' connections
// (each preparing its statements) all at once while the ranking query runs,
// copies, and prints the elapsed nanoseconds on stdout.
//
//	ceiling -dsn postgres://… -redis 127.0.0.1:6379 -prefix bench:item: -table items [-stored] [-n 100000] [-workers 4] [-chunk 1000] [-nx] [-bound 1048576]
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/accesslog"
)

func main() {
	var (
		dsn     = flag.String("dsn", "", "PostgreSQL URL: the items table and the access log")
		addr    = flag.String("redis", "127.0.0.1:6379", "Redis address")
		prefix  = flag.String("prefix", "", "the keys' prefix before the id")
		table   = flag.String("table", "items", "the table of (id bigint, v) rows")
		stored  = flag.Bool("stored", false, "read the stored ranking, not the access log ranked live")
		n       = flag.Int("n", 100_000, "keys to copy")
		chunk   = flag.Int("chunk", 1000, "ids per query")
		workers = flag.Int("workers", 4, "chunks copied at once")
		ttl     = flag.Duration("ttl", 10*time.Minute, "TTL of each key")
		jitter  = flag.Float64("jitter", 0.2, "TTL jitter: ttl * (1 + jitter*(rand-0.5)), as Hearth's refresh.jitter")
		nx      = flag.Bool("nx", false, "write with SET … NX: never replace a value already in Redis")
		bound   = flag.Int("bound", 0, "when > 0, the server sends no value longer than this many bytes (as text)")
	)
	flag.Parse()
	d, err := run(*dsn, *addr, *prefix, pgx.Identifier{*table}.Sanitize(), *stored, *n, *chunk, *workers, *ttl, *jitter, *nx, *bound)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ceiling:", err)
		os.Exit(1)
	}
	fmt.Println(d.Nanoseconds())
}

const (
	stmtLoad = "ceiling_load"
	stmtLive = "ceiling_live"
)

func run(dsn, addr, prefix, table string, stored bool, n, chunkSize, workers int, ttl time.Duration, jitter float64, nx bool, bound int) (time.Duration, error) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return 0, err
	}
	cfg.MaxConns = int32(workers + 1)
	load := "SELECT id, v FROM " + table + " WHERE id = ANY($1::bigint[])"
	if bound > 0 {
		load = "SELECT id, CASE WHEN octet_length(t) <= " + strconv.Itoa(bound) + " THEN t END FROM (SELECT id, v::text FROM " + table +
			" WHERE id = ANY($1::bigint[]) OFFSET 0) AS s(id, t)"
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if _, err := c.Prepare(ctx, stmtLoad, load); err != nil {
			return err
		}
		_, err := c.Prepare(ctx, stmtLive, `SELECT key, sum(hits)::bigint AS h FROM `+accesslog.Table+`
			WHERE bucket >= now() - make_interval(secs => $1::bigint / 1000.0) GROUP BY key ORDER BY h DESC, key COLLATE "C" LIMIT $2`)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: workers})
	defer rdb.Close()
	// The clock starts where Hearth's does: one connection to each server
	// open (Hearth's start-up ping, and its pre-warm store's read of the
	// leader's keys). The rest are opened in the run, all at once, while the
	// ranking query runs on the first: the fastest honest way.
	if err := pool.Ping(ctx); err != nil {
		return 0, err
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		return 0, err
	}
	t0 := time.Now()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var (
		opened   sync.WaitGroup
		openErr  error
		openOnce sync.Once
	)
	for range workers {
		opened.Go(func() {
			c, err := pool.Acquire(ctx)
			if err != nil {
				openOnce.Do(func() { openErr = err })
				return
			}
			c.Release()
		})
	}
	chunks := make(chan []int64, workers)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
			key := make([]byte, 0, len(prefix)+20)
			for c := range chunks {
				if err := copyChunk(ctx, pool, rdb, c, prefix, key, ttl, jitter, rng, nx); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
			}
		}()
	}
	c := make([]int64, 0, chunkSize)
	readErr := readTopKeys(ctx, tx, stored, n, func(key string) {
		if s, ok := strings.CutPrefix(key, prefix); ok {
			id, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return
			}
			c = append(c, id)
			if len(c) == chunkSize {
				chunks <- c
				c = make([]int64, 0, chunkSize)
			}
		}
	})
	if len(c) > 0 {
		chunks <- c
	}
	close(chunks)
	wg.Wait()
	d := time.Since(t0)
	opened.Wait()
	if readErr != nil {
		return 0, readErr
	}
	if openErr != nil {
		return 0, openErr
	}
	return d, firstErr
}

// readTopKeys reads the top n keys of the access log, the stored ranking's
// chunks or the live ranking's rows, as they arrive.
func readTopKeys(ctx context.Context, tx pgx.Tx, stored bool, n int, each func(string)) error {
	var (
		rows pgx.Rows
		err  error
	)
	if stored {
		rows, err = tx.Query(ctx, `SELECT keys FROM `+accesslog.RankTable+` ORDER BY chunk LIMIT $1`, (n+999)/1000)
	} else {
		if _, err := tx.Exec(ctx, "SET LOCAL work_mem = '64MB'"); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, stmtLive, time.Hour.Milliseconds(), n)
	}
	if err != nil {
		return err
	}
	defer rows.Close()
	var (
		keys []string
		k    string
		h    int64
	)
	for rows.Next() {
		if stored {
			if err := rows.Scan(&keys); err != nil {
				return err
			}
			for _, k := range keys {
				each(k)
			}
			continue
		}
		if err := rows.Scan(&k, &h); err != nil {
			return err
		}
		each(k)
	}
	return rows.Err()
}

// copyChunk copies one chunk of rows with one query and one pipeline.
func copyChunk(ctx context.Context, pool *pgxpool.Pool, rdb *redis.Client, ids []int64, prefix string, key []byte,
	ttl time.Duration, jitter float64, rng *rand.Rand, nx bool) error {
	rows, err := pool.Query(ctx, stmtLoad, ids)
	if err != nil {
		return err
	}
	pipe := rdb.Pipeline()
	var (
		id int64
		v  []byte
	)
	key = append(key[:0], prefix...)
	for rows.Next() {
		v = nil // a fresh slice per row: the pipeline holds it until Exec
		if err := rows.Scan(&id, &v); err != nil {
			rows.Close()
			return err
		}
		if v == nil {
			continue // over the bound
		}
		k := string(strconv.AppendInt(key[:len(prefix)], id, 10))
		d := time.Duration(float64(ttl) * (1 + jitter*(rng.Float64()-0.5)))
		if nx {
			pipe.SetNX(ctx, k, v, d)
		} else {
			pipe.Set(ctx, k, v, d)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if pipe.Len() == 0 {
		return nil // every value over the bound
	}
	_, err = pipe.Exec(ctx)
	return err
}
