package rewarm_test

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
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/migrations"
	"github.com/hearth-dev/hearth/rewarm"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/warmer"
)

// env is a catalogue in PostgreSQL, its access log, and a warmer writing to Redis.
type env struct {
	rdb    *redis.Client
	prefix string // every cache key starts with it
	log    *accesslog.Log
	reg    *prometheus.Registry
	w      *warmer.Warmer
}

// newEnv declares a single key <prefix>top and a family <prefix>product:{id}
// with member 1 declared, over products 1..20 in the catalogue.
func newEnv(t *testing.T, rdb *redis.Client, prefix string) *env {
	t.Helper()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	e := &env{rdb: rdb, prefix: prefix, reg: prometheus.NewRegistry()}
	if _, err := pg.Pool.Exec(ctx, `CREATE TABLE products (id bigint PRIMARY KEY, v text);
		INSERT INTO products SELECT i, 'p' || i FROM generate_series(1, 20) i`); err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pg.Pool)
	defer db.Close()
	p, err := migrations.NewProvider(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`
sources: [{name: catalog, type: postgres, dsn: %q}]
keys:
  - {name: top, key: %q, source: catalog, ttl: 60s, query: "SELECT 'top'"}
  - {name: product, key: %q, source: catalog, ttl: 60s, batch_size: 100, param_pattern: "[0-9]{1,12}",
     members: ["1"], query: "SELECT id::text, v FROM products WHERE id = ANY($1::bigint[])"}
`, pg.DSN, prefix+"top", prefix+"product:{id}")))
	if err != nil {
		t.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "catalog", DSN: pg.DSN, MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	e.log = accesslog.New(pg.Pool)
	e.w, err = warmer.New(warmer.Options{
		Store: &warmer.RedisStore{Client: rdb}, Sources: map[string]warmer.Source{"catalog": src},
		Specs: cfg.Specs(), MaxConcurrentLoads: 8, Registerer: e.reg, Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// record counts reads of keys in the current bucket: the first is the hottest.
func (e *env) record(t *testing.T, keys ...string) {
	t.Helper()
	h := map[string]int64{}
	for i, k := range keys {
		h[k] = int64(1000 - i)
	}
	if err := e.log.Record(context.Background(), time.Now(), time.Minute, h); err != nil {
		t.Fatal(err)
	}
}

// prewarm is the pre-warm of the access log's top 10 keys, the one a
// re-warm runs first (rewarm.Options.Prewarm); these tests run on one
// node, so a re-warm is never scoped to some slots.
func (e *env) prewarm(t *testing.T) func(ctx context.Context, reason string, keep func(string) bool) error {
	return func(ctx context.Context, reason string, keep func(string) bool) error {
		if keep != nil {
			t.Errorf("a re-warm scoped to some slots on a single node (reason %s)", reason)
		}
		_, err := e.w.Prewarm(ctx, warmer.PrewarmOptions{AccessLog: e.log, TopN: 10, Window: time.Hour, Concurrency: 4, Reason: reason})
		return err
	}
}

// keys lists the Redis keys under the test's prefix.
func (e *env) keys(t *testing.T) []string {
	t.Helper()
	var out []string
	iter := e.rdb.Scan(context.Background(), 0, e.prefix+"*", 1000).Iterator()
	for iter.Next(context.Background()) {
		out = append(out, strings.TrimPrefix(iter.Val(), e.prefix))
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// run runs rw as a term would, once its baseline is taken, until the test
// ends; then it waits for Run to return.
func run(t *testing.T, rw *rewarm.Rewarmer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rw.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	testenv.Eventually(t, 10*time.Second, "the re-warm baseline", func() bool { return rewarm.Armed(rw) })
}
