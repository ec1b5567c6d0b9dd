// Command ceiling is the pre-warm benchmark's honest ceiling: a plain Go
// program that reads the top keys of the access log (the stored ranking, or
// ranked live with the same query as Hearth's), cuts the ids out of the keys,
// and copies the rows from PostgreSQL to Redis in chunks with pipelined
// SET … PX, 4 workers, which start while the keys are read. It does nothing
// Hearth must do beyond that: no validation, no de-duplication, no value
// bound, no fencing.
//
// It runs as a process of its own, as `hearth prewarm` does, so that both
// start from a fresh heap. Connected to both servers, it starts the clock,
// copies, and prints the elapsed nanoseconds on stdout.
//
//	ceiling -dsn postgres://… -redis 127.0.0.1:6379 -prefix bench:item: [-stored] [-n 100000]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
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
		stored  = flag.Bool("stored", false, "read the stored ranking, not the access log ranked live")
		n       = flag.Int("n", 100_000, "keys to copy")
		chunk   = flag.Int("chunk", 1000, "ids per query")
		workers = flag.Int("workers", 4, "chunks copied at once")
		ttl     = flag.Duration("ttl", 10*time.Minute, "TTL of each key")
	)
	flag.Parse()
	d, err := run(*dsn, *addr, *prefix, *stored, *n, *chunk, *workers, *ttl)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ceiling:", err)
		os.Exit(1)
	}
	fmt.Println(d.Nanoseconds())
}

func run(dsn, addr, prefix string, stored bool, n, chunkSize, workers int, ttl time.Duration) (time.Duration, error) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	// Connect both before the clock starts, as hearth has by the time it reports.
	if err := pool.Ping(ctx); err != nil {
		return 0, err
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		return 0, err
	}
	chunks := make(chan []string, workers)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	t0 := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range chunks {
				if err := copyChunk(ctx, pool, rdb, c, prefix, ttl); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
			}
		}()
	}
	c := make([]string, 0, chunkSize)
	readErr := readTopKeys(ctx, pool, stored, n, func(key string) {
		if id, ok := strings.CutPrefix(key, prefix); ok {
			c = append(c, id)
			if len(c) == chunkSize {
				chunks <- c
				c = make([]string, 0, chunkSize)
			}
		}
	})
	if len(c) > 0 {
		chunks <- c
	}
	close(chunks)
	wg.Wait()
	d := time.Since(t0)
	if readErr != nil {
		return 0, readErr
	}
	return d, firstErr
}

// readTopKeys reads the top n keys of the access log, the stored ranking's
// chunks or the live ranking's rows, as they arrive.
func readTopKeys(ctx context.Context, pool *pgxpool.Pool, stored bool, n int, each func(string)) error {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var rows pgx.Rows
	if stored {
		rows, err = tx.Query(ctx, `SELECT keys FROM `+accesslog.RankTable+` ORDER BY chunk LIMIT $1`, (n+999)/1000)
	} else {
		if _, err := tx.Exec(ctx, "SET LOCAL work_mem = '64MB'"); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT key, sum(hits)::bigint AS h FROM `+accesslog.Table+`
			WHERE bucket >= now() - interval '1 hour' GROUP BY key ORDER BY h DESC, key COLLATE "C" LIMIT $1`, n)
	}
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if stored {
			var keys []string
			if err := rows.Scan(&keys); err != nil {
				return err
			}
			for _, k := range keys {
				each(k)
			}
			continue
		}
		var (
			k string
			h int64
		)
		if err := rows.Scan(&k, &h); err != nil {
			return err
		}
		each(k)
	}
	return rows.Err()
}

// copyChunk copies one chunk of rows with one query and one pipeline.
func copyChunk(ctx context.Context, pool *pgxpool.Pool, rdb *redis.Client, ids []string, prefix string, ttl time.Duration) error {
	rows, err := pool.Query(ctx, "SELECT id::text, v FROM items WHERE id = ANY($1::bigint[])", ids)
	if err != nil {
		return err
	}
	pipe := rdb.Pipeline()
	for rows.Next() {
		var (
			id string
			v  []byte
		)
		if err := rows.Scan(&id, &v); err != nil {
			rows.Close()
			return err
		}
		pipe.Set(ctx, prefix+id, v, ttl)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	_, err = pipe.Exec(ctx)
	return err
}
