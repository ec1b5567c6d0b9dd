package rewarm_test

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/internal/prewarmtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/prewarm"
	"github.com/hearth-dev/hearth/rewarm"
	"github.com/hearth-dev/hearth/warmer"
)

// env is internal/prewarmtest's catalogue (its access log, a warmer and its
// pre-warmer writing to Redis), under the names these tests use.
type env struct {
	p      *prewarmtest.Env
	rdb    *redis.Client
	prefix string // every cache key starts with it
	log    *accesslog.Log
	reg    *prometheus.Registry
	w      *warmer.Warmer
	pw     *prewarm.Prewarmer
}

// newEnv declares a single key <prefix>top and a family <prefix>product:{id}
// with member 1 declared, over products 1..20 in the catalogue.
func newEnv(t *testing.T, rdb *redis.Client, prefix string) *env {
	t.Helper()
	p := prewarmtest.New(t, rdb, prefix, 20, 100, "SELECT id::text, v FROM products WHERE id = ANY($1::bigint[])")
	return &env{p: p, rdb: p.RDB, prefix: p.Prefix, log: p.Log, reg: p.Reg, w: p.W, pw: p.PW}
}

// record counts reads of keys in the current bucket: the first is the hottest.
func (e *env) record(t *testing.T, keys ...string) { t.Helper(); e.p.Record(t, keys...) }

// prewarm is the pre-warm of the access log's top 10 keys, the one a
// re-warm runs first (rewarm.Options.Prewarm); these tests run on one
// node, so a re-warm is never scoped to some slots.
func (e *env) prewarm(t *testing.T) func(ctx context.Context, reason string, keep func(string) bool) error {
	return func(ctx context.Context, reason string, keep func(string) bool) error {
		if keep != nil {
			t.Errorf("a re-warm scoped to some slots on a single node (reason %s)", reason)
		}
		_, err := e.pw.Run(ctx, prewarm.Options{AccessLog: e.log, TopN: 10, Window: time.Hour, Concurrency: 4, Reason: reason})
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
