// Package prewarmtest is the pre-warm tests' catalogue: products in a
// private PostgreSQL database, its access log, and a warmer and pre-warmer
// writing to a Redis. Tests only; never in the daemon's import graph.
package prewarmtest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/internal/sourcetest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/migrations"
	"github.com/hearth-dev/hearth/prewarm"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// Counting wraps a real source and records what it was asked.
type Counting struct{ *sourcetest.Recorder }

// Sorted is every member asked for, sorted ("" for the single key).
func (c *Counting) Sorted() []string {
	out := c.Asked()
	sort.Strings(out)
	return out
}

// Env is a catalogue in PostgreSQL, its access log, and a warmer and its
// pre-warmer writing to Redis.
type Env struct {
	PG     *testenv.PostgresEnv
	RDB    *redis.Client
	Prefix string // every cache key starts with it
	Log    *accesslog.Log
	Src    *Counting
	Reg    *prometheus.Registry
	W      *warmer.Warmer
	PW     *prewarm.Prewarmer
}

// New declares a single key <prefix>top and a family <prefix>product:{id}
// (digits only, batches of batch), with products 1..products in the catalogue;
// the value of product i is "p<i>", and product 13's value is NULL (a failure).
func New(t *testing.T, rdb *redis.Client, prefix string, products, batch int, query string) *Env {
	t.Helper()
	ctx := context.Background()
	e := &Env{PG: testenv.Postgres(t), RDB: rdb, Prefix: prefix, Reg: prometheus.NewRegistry()}
	for _, q := range []string{
		`CREATE TABLE products (id bigint PRIMARY KEY, v text)`,
		fmt.Sprintf(`INSERT INTO products SELECT i, CASE WHEN i = 13 THEN NULL ELSE 'p' || i END FROM generate_series(1, %d) i`, products),
	} {
		if _, err := e.PG.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	db := stdlib.OpenDBFromPool(e.PG.Pool)
	defer db.Close()
	p, err := migrations.NewProvider(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if query == "" {
		query = "SELECT id::text, v FROM products WHERE id::text = ANY($1)"
	}
	yaml := fmt.Sprintf(`
sources:
  - {name: catalog, type: postgres, dsn: %q}
keys:
  - name: top
    key: %q
    source: catalog
    ttl: 60s
    query: "SELECT 'top'"
  - name: product
    key: %q
    source: catalog
    ttl: 60s
    batch_size: %d
    param_pattern: "[0-9]{1,12}"
    members: ["1"]
    query: %q
`, e.PG.DSN, prefix+"top", prefix+"product:{id}", batch, query)
	cfg, err := config.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "catalog", DSN: e.PG.DSN, MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	e.Src = &Counting{sourcetest.Record(src)}
	e.Log = accesslog.New(e.PG.Pool)
	e.W, err = warmer.New(warmer.Options{
		Store: &store.RedisStore{Client: rdb}, Sources: map[string]warmer.Source{"catalog": e.Src},
		Specs: cfg.Specs(), MaxConcurrentLoads: 8, Registerer: e.Reg, Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.PW = prewarm.New(e.W, e.Reg, zerolog.Nop())
	return e
}

// Record counts reads of keys in the current bucket: the first is the hottest.
func (e *Env) Record(t *testing.T, keys ...string) {
	t.Helper()
	h := map[string]int64{}
	for i, k := range keys {
		h[k] = int64(1000 - i)
	}
	if err := e.Log.Record(context.Background(), time.Now(), time.Minute, h); err != nil {
		t.Fatal(err)
	}
}

// Options pre-warms the top n keys of the access log, 4 batches at a time.
func (e *Env) Options(n int) prewarm.Options {
	return prewarm.Options{AccessLog: e.Log, TopN: n, Window: time.Hour, Concurrency: 4, Reason: "test"}
}

// Keys lists the Redis keys under the test's prefix.
func (e *Env) Keys(t *testing.T) []string {
	t.Helper()
	var out []string
	iter := e.RDB.Scan(context.Background(), 0, e.Prefix+"*", 1000).Iterator()
	for iter.Next(context.Background()) {
		out = append(out, strings.TrimPrefix(iter.Val(), e.Prefix))
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// NoLaterExpiry checks that key, copied from source to copy, expires in copy
// no later than in source. It compares the absolute instants each server
// holds (PEXPIRETIME: milliseconds of the clock both servers on this machine
// read), so neither the order nor the timing of the two reads can make the
// check pass or fail, as comparing two PTTLs read one after the other could
// by the time between them.
func NoLaterExpiry(ctx context.Context, copy, source redis.Cmdable, key string) error {
	c, err := copy.PExpireTime(ctx, key).Result()
	if err != nil {
		return fmt.Errorf("copy %s: %w", key, err)
	}
	s, err := source.PExpireTime(ctx, key).Result()
	if err != nil {
		return fmt.Errorf("source %s: %w", key, err)
	}
	switch {
	case c < 0:
		return fmt.Errorf("copy %s has no expiry (PEXPIRETIME %d)", key, c)
	case s >= 0 && c > s:
		return fmt.Errorf("copy %s expires at %s, %s after its source (%s): a copy must never outlive its source",
			key, time.UnixMilli(c.Milliseconds()).UTC().Format("15:04:05.000"), c-s, time.UnixMilli(s.Milliseconds()).UTC().Format("15:04:05.000"))
	}
	return nil
}
