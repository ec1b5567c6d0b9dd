package accesslog_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/migrations"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// migrate creates the access-log table in the pool's schema, as `hearth migrate up` does.
func migrate(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := migrations.NewProvider(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctxT(t)); err != nil {
		t.Fatalf("migrate up: %v", err)
	}
}

func hits(t *testing.T, pool *pgxpool.Pool) map[string]int64 {
	t.Helper()
	rows, err := pool.Query(ctxT(t), `SELECT extract(epoch FROM bucket)::bigint, key, hits FROM hearth_access_log`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var (
			b    int64
			k    string
			h    int64
			name string
		)
		if err := rows.Scan(&b, &k, &h); err != nil {
			t.Fatal(err)
		}
		name = fmt.Sprintf("%d/%s", b, k)
		out[name] = h
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestBucketStart(t *testing.T) {
	for _, c := range []struct {
		at    int64
		width time.Duration
		want  int64
	}{
		{1_700_000_059, time.Minute, 1_700_000_040},
		{1_700_000_040, time.Minute, 1_700_000_040},
		{1_700_000_007, 5 * time.Second, 1_700_000_005},
		{-61, time.Minute, -120},
	} {
		if got := accesslog.BucketStart(time.Unix(c.at, 0), c.width).Unix(); got != c.want {
			t.Errorf("BucketStart(%d, %s) = %d, want %d", c.at, c.width, got, c.want)
		}
	}
	if got, want := accesslog.BucketKey("hearth", time.Unix(1_700_000_040, 0)), "hearth:access:1700000040"; got != want {
		t.Errorf("BucketKey = %q, want %q", got, want)
	}
}

// TestTopKeys ranks keys by their reads summed over the buckets inside the
// window; older buckets do not count.
func TestTopKeys(t *testing.T) {
	pg := testenv.Postgres(t)
	migrate(t, pg.Pool)
	ctx := ctxT(t)
	log := accesslog.New(pg.Pool)
	now := time.Now().Truncate(time.Minute)
	record := func(ago time.Duration, h map[string]int64) {
		t.Helper()
		if err := log.Record(ctx, now.Add(-ago), time.Minute, h); err != nil {
			t.Fatal(err)
		}
	}
	// "old" was the hottest key, but two hours ago.
	record(2*time.Hour, map[string]int64{"old": 1000, "b": 1})
	record(30*time.Minute, map[string]int64{"a": 10, "b": 20, "c": 5})
	record(10*time.Minute, map[string]int64{"a": 15, "c": 5, "d": 1})
	record(0, map[string]int64{"a": 1, "c": 1})
	// Recording the same batch twice adds up (the application path adds).
	record(0, map[string]int64{"c": 20})

	t.Run("window and order", func(t *testing.T) {
		got, err := log.TopKeys(ctx, time.Hour, 10)
		if err != nil {
			t.Fatal(err)
		}
		// a = 26, c = 31, b = 20, d = 1; "old" is outside the window.
		if want := []string{"c", "a", "b", "d"}; !slices.Equal(got, want) {
			t.Errorf("TopKeys(1h) = %q, want %q", got, want)
		}
	})
	t.Run("limit", func(t *testing.T) {
		got, err := log.TopKeys(ctx, time.Hour, 2)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"c", "a"}; !slices.Equal(got, want) {
			t.Errorf("TopKeys(1h, 2) = %q, want %q", got, want)
		}
	})
	t.Run("wider window", func(t *testing.T) {
		got, err := log.TopKeys(ctx, 3*time.Hour, 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"old"}; !slices.Equal(got, want) {
			t.Errorf("TopKeys(3h, 1) = %q, want %q", got, want)
		}
	})
	t.Run("prune", func(t *testing.T) {
		n, err := log.Prune(ctx, now.Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := n, int64(2); got != want {
			t.Errorf("pruned %d rows, want %d", got, want)
		}
		got, err := log.TopKeys(ctx, 3*time.Hour, 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"c"}; !slices.Equal(got, want) {
			t.Errorf("TopKeys after prune = %q, want %q", got, want)
		}
	})
}

// TestStoredRanking: a pre-warm reads the ranking Rank stored while it is
// fresh, for the same window and enough keys, and ranks live otherwise.
func TestStoredRanking(t *testing.T) {
	pg := testenv.Postgres(t)
	migrate(t, pg.Pool)
	ctx := ctxT(t)
	log := accesslog.New(pg.Pool).UseRanking(time.Minute)
	// In a bucket closed before the rankings below, so that a minute's end
	// during the test changes nothing (TestStoredRankingFreshness covers that).
	past := time.Now().Add(-10 * time.Minute)
	if err := log.Record(ctx, past, time.Minute, map[string]int64{"a": 3, "b": 2, "c": 1}); err != nil {
		t.Fatal(err)
	}
	top := func(window time.Duration, n int) ([]string, string) {
		t.Helper()
		keys, err := log.TopKeys(ctx, window, n)
		if err != nil {
			t.Fatal(err)
		}
		return keys, log.LastRanking()
	}
	if keys, src := top(time.Hour, 10); src != accesslog.RankingLive || !slices.Equal(keys, []string{"a", "b", "c"}) {
		t.Fatalf("before any ranking: %q from %s, want a, b, c ranked live", keys, src)
	}
	n, err := log.Rank(ctx, time.Hour, 2)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("Rank stored %d keys, want 2", n)
	}
	// c becomes the hottest; the stored ranking does not know yet.
	if err := log.Record(ctx, past, time.Minute, map[string]int64{"c": 100}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		window time.Duration
		n      int
		keys   []string
		src    string
	}{
		{"fresh", time.Hour, 2, []string{"a", "b"}, accesslog.RankingStored},
		{"fewer keys", time.Hour, 1, []string{"a"}, accesslog.RankingStored},
		{"more keys than stored", time.Hour, 3, []string{"c", "a", "b"}, accesslog.RankingLive},
		{"another window", 2 * time.Hour, 2, []string{"c", "a"}, accesslog.RankingLive},
	} {
		t.Run(c.name, func(t *testing.T) {
			if keys, src := top(c.window, c.n); src != c.src || !slices.Equal(keys, c.keys) {
				t.Errorf("TopKeys(%s, %d) = %q from %s, want %q from %s", c.window, c.n, keys, src, c.keys, c.src)
			}
		})
	}
	t.Run("stale", func(t *testing.T) {
		if _, err := pg.Pool.Exec(ctx, `UPDATE hearth_access_rank_info SET computed_at = now() - interval '2 minutes'`); err != nil {
			t.Fatal(err)
		}
		if keys, src := top(time.Hour, 2); src != accesslog.RankingLive || !slices.Equal(keys, []string{"c", "a"}) {
			t.Errorf("stale ranking: %q from %s, want c, a ranked live", keys, src)
		}
	})
	t.Run("rank again", func(t *testing.T) {
		if _, err := log.Rank(ctx, time.Hour, 2); err != nil {
			t.Fatal(err)
		}
		if keys, src := top(time.Hour, 2); src != accesslog.RankingStored || !slices.Equal(keys, []string{"c", "a"}) {
			t.Errorf("after a new ranking: %q from %s, want c, a stored", keys, src)
		}
	})
}

// TestStoredRankingFreshness: a stored ranking stands in for a live one only
// when it holds keys and was computed after the newest closed bucket ended;
// ModeLive never reads it, ModeStored fails rather than rank live.
func TestStoredRankingFreshness(t *testing.T) {
	pg := testenv.Postgres(t)
	migrate(t, pg.Pool)
	ctx := ctxT(t)
	log := accesslog.New(pg.Pool).UseRanking(time.Hour).SetBucket(time.Minute)
	top := func(mode string) ([]string, accesslog.Ranking, error) {
		t.Helper()
		if err := log.SetMode(mode); err != nil {
			t.Fatal(err)
		}
		keys, err := log.TopKeys(ctx, time.Hour, 10)
		return keys, log.LastRankingInfo(), err
	}

	// A ranking of an empty log holds no keys: reads recorded since are
	// ranked live, not reported as "0 keys, stored".
	if n, err := log.Rank(ctx, time.Hour, 10); err != nil || n != 0 {
		t.Fatalf("Rank of an empty log: %d keys, %v", n, err)
	}
	if err := log.Record(ctx, time.Now(), time.Minute, map[string]int64{"a": 5}); err != nil {
		t.Fatal(err)
	}
	keys, rk, err := top(accesslog.ModeAuto)
	if err != nil || rk.Source != accesslog.RankingLive || !slices.Equal(keys, []string{"a"}) || !strings.Contains(rk.Stale, "no keys") {
		t.Fatalf("empty stored ranking, auto: %q from %+v (%v); want a ranked live, stale because empty", keys, rk, err)
	}
	if _, rk, err = top(accesslog.ModeStored); !errors.Is(err, accesslog.ErrStaleRanking) || !strings.Contains(err.Error(), "no keys") {
		t.Fatalf("empty stored ranking, stored: %+v, %v; want ErrStaleRanking naming why", rk, err)
	}

	// A ranking computed now has seen every closed bucket: used.
	if n, err := log.Rank(ctx, time.Hour, 10); err != nil || n != 1 {
		t.Fatalf("Rank: %d keys, %v", n, err)
	}
	keys, rk, err = top(accesslog.ModeAuto)
	if err != nil || rk.Source != accesslog.RankingStored || !slices.Equal(keys, []string{"a"}) || rk.Stale != "" {
		t.Fatalf("fresh ranking, auto: %q from %+v (%v); want a from the stored ranking", keys, rk, err)
	}
	if rk.Age < 0 || rk.Age > time.Minute || rk.To.Sub(rk.From) != time.Hour {
		t.Errorf("fresh ranking: age %s, buckets %s to %s; want a recent age and an hour of buckets", rk.Age, rk.From, rk.To)
	}
	keys, rk, err = top(accesslog.ModeLive)
	if err != nil || rk.Source != accesslog.RankingLive || !slices.Equal(keys, []string{"a"}) {
		t.Fatalf("fresh ranking, live: %q from %+v (%v); want a ranked live", keys, rk, err)
	}

	// The ranking predates a bucket that has closed since (well within its
	// maximum age): b, read in that bucket, must not be missed.
	if _, err := pg.Pool.Exec(ctx, `UPDATE hearth_access_rank_info SET computed_at = now() - interval '10 minutes'`); err != nil {
		t.Fatal(err)
	}
	if err := log.Record(ctx, time.Now().Add(-5*time.Minute), time.Minute, map[string]int64{"b": 50}); err != nil {
		t.Fatal(err)
	}
	keys, rk, err = top(accesslog.ModeAuto)
	if err != nil || rk.Source != accesslog.RankingLive || !slices.Equal(keys, []string{"b", "a"}) || !strings.Contains(rk.Stale, "predates") {
		t.Fatalf("ranking older than the newest closed bucket, auto: %q from %+v (%v); want b, a ranked live", keys, rk, err)
	}
	if _, _, err = top(accesslog.ModeStored); !errors.Is(err, accesslog.ErrStaleRanking) {
		t.Fatalf("ranking older than the newest closed bucket, stored: %v; want ErrStaleRanking", err)
	}
	if err := log.SetMode("newest"); err == nil {
		t.Error("SetMode(newest): no error")
	}
}

type rollupEnv struct {
	pool   *pgxpool.Pool
	rdb    *redis.Client
	ns     string
	now    time.Time
	reg    *prometheus.Registry
	roller *accesslog.Roller
}

func newRollupEnv(t testing.TB, pool *pgxpool.Pool, rdb *redis.Client, ns string) *rollupEnv {
	t.Helper()
	e := &rollupEnv{pool: pool, rdb: rdb, ns: ns, reg: prometheus.NewRegistry()}
	// Half-way through a minute bucket.
	e.now = time.Now().Truncate(time.Minute).Add(30 * time.Second)
	r, err := accesslog.NewRoller(accesslog.RollerOptions{
		Log: accesslog.New(pool), Client: rdb, Namespace: ns, Bucket: time.Minute,
		Lookback: time.Hour, Registerer: e.reg, Now: func() time.Time { return e.now },
	})
	if err != nil {
		t.Fatal(err)
	}
	e.roller = r
	return e
}

func (e *rollupEnv) bucket(ago time.Duration) (string, int64) {
	start := accesslog.BucketStart(e.now.Add(-ago), time.Minute)
	return accesslog.BucketKey(e.ns, start), start.Unix()
}

func (e *rollupEnv) incr(t *testing.T, ago time.Duration, counts map[string]float64) string {
	t.Helper()
	key, _ := e.bucket(ago)
	for k, n := range counts {
		if err := e.rdb.ZIncrBy(ctxT(t), key, n, k).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return key
}

// TestRollup moves closed Redis buckets into the table, leaves the open one,
// deletes what it rolled up, and drops members that cannot be cache keys.
func TestRollup(t *testing.T) {
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	migrate(t, pg.Pool)
	e := newRollupEnv(t, pg.Pool, rd.Client, strings.TrimSuffix(rd.Prefix, ":"))
	ctx := ctxT(t)

	k5, b5 := e.bucket(5 * time.Minute)
	k1, b1 := e.bucket(time.Minute)
	open, _ := e.bucket(0)
	e.incr(t, 5*time.Minute, map[string]float64{"product:1": 3, "product:2": 1})
	e.incr(t, time.Minute, map[string]float64{"product:1": 4, "top": 2})
	e.incr(t, 0, map[string]float64{"product:1": 100})
	// Hostile members: a NUL byte and invalid UTF-8 cannot even be stored in
	// PostgreSQL text, a control character and a huge string are no cache key.
	e.incr(t, time.Minute, map[string]float64{"a\x00b": 1, "\xff\xfe": 1, "a\nb": 1, strings.Repeat("x", accesslog.MaxKeyBytes+1): 1})

	res, err := e.roller.RollupOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res, (accesslog.RollupResult{Buckets: 2, Rows: 4, Skipped: 4}); got != want {
		t.Errorf("RollupOnce = %+v, want %+v", got, want)
	}
	want := map[string]int64{
		fmt.Sprintf("%d/product:1", b5): 3, fmt.Sprintf("%d/product:2", b5): 1,
		fmt.Sprintf("%d/product:1", b1): 4, fmt.Sprintf("%d/top", b1): 2,
	}
	if got := hits(t, pg.Pool); !mapsEqual(got, want) {
		t.Errorf("table = %v, want %v", got, want)
	}
	for _, k := range []string{k5, k1} {
		if n := rd.Client.Exists(ctx, k, accesslog.RollingKey(e.ns, k), accesslog.TokenKey(e.ns, k)).Val(); n != 0 {
			t.Errorf("closed bucket %s (or its private roll-up keys) still in Redis after roll-up", k)
		}
	}
	if n := rd.Client.Exists(ctx, open).Val(); n != 1 {
		t.Errorf("open bucket %s was rolled up before it closed", open)
	}
	wantMetric(t, e.reg, "hearth_access_log_rolled_up_rows_total", " 4")
	wantMetric(t, e.reg, "hearth_access_log_skipped_keys_total",
		`{reason="bad_score"} 0`, `{reason="malformed"} 3`, `{reason="too_long"} 1`)

	t.Run("the open bucket once closed", func(t *testing.T) {
		e.now = e.now.Add(time.Minute)
		if _, err := e.roller.RollupOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if n := rd.Client.Exists(ctx, open).Val(); n != 0 {
			t.Errorf("bucket %s not rolled up once closed", open)
		}
	})
}

// TestRollupResumed: a roll-up stopped anywhere (a crash, Redis or PostgreSQL
// going away) leaves the bucket under its private name; the next run rolls it
// up, once: stopped before its commit, the counts are added then; stopped
// after, they are not added again. A straggler ZINCRBY into a bucket already
// rolled up is added, never lost.
func TestRollupResumed(t *testing.T) {
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	migrate(t, pg.Pool)
	e := newRollupEnv(t, pg.Pool, rd.Client, strings.TrimSuffix(rd.Prefix, ":"))
	ctx := ctxT(t)
	key, b := e.bucket(2 * time.Minute)
	row := func(k string) string { return fmt.Sprintf("%d/%s", b, k) }
	crash := errors.New("crash")
	stopAt := func(stage string) {
		accesslog.SetHook(e.roller, func(s string) error {
			if s == stage {
				return crash
			}
			return nil
		})
	}

	t.Run("stopped before the commit", func(t *testing.T) {
		e.incr(t, 2*time.Minute, map[string]float64{"product:1": 7, "product:2": 3})
		stopAt("commit")
		if _, err := e.roller.RollupOnce(ctx); !errors.Is(err, crash) {
			t.Fatalf("RollupOnce = %v, want the crash", err)
		}
		if got := hits(t, pg.Pool); len(got) != 0 {
			t.Fatalf("table = %v after a roll-up that never committed", got)
		}
		if n := rd.Client.ZCard(ctx, accesslog.RollingKey(e.ns, key)).Val(); n != 2 {
			t.Fatalf("private roll-up key holds %d members, want 2", n)
		}
		// Reads keep arriving in the bucket meanwhile.
		e.incr(t, 2*time.Minute, map[string]float64{"product:1": 1})
		stopAt("")
		res, err := e.roller.RollupOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := [2]int{res.Resumed, res.Buckets}, [2]int{1, 1}; got != want {
			t.Errorf("resumed, buckets = %v, want %v", got, want)
		}
		want := map[string]int64{row("product:1"): 8, row("product:2"): 3}
		if got := hits(t, pg.Pool); !mapsEqual(got, want) {
			t.Errorf("table = %v, want %v", got, want)
		}
	})
	t.Run("stopped after the commit", func(t *testing.T) {
		e.incr(t, 2*time.Minute, map[string]float64{"product:2": 5})
		stopAt("unlink")
		if _, err := e.roller.RollupOnce(ctx); !errors.Is(err, crash) {
			t.Fatalf("RollupOnce = %v, want the crash", err)
		}
		stopAt("")
		res, err := e.roller.RollupOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := res.Resumed, 1; got != want {
			t.Errorf("resumed = %d, want %d", got, want)
		}
		want := map[string]int64{row("product:1"): 8, row("product:2"): 8}
		if got := hits(t, pg.Pool); !mapsEqual(got, want) {
			t.Errorf("table = %v, want %v (the committed roll-up added twice?)", got, want)
		}
		if n := rd.Client.Exists(ctx, key, accesslog.RollingKey(e.ns, key), accesslog.TokenKey(e.ns, key)).Val(); n != 0 {
			t.Errorf("%d keys of bucket %s left in Redis", n, key)
		}
	})
	t.Run("straggler", func(t *testing.T) {
		e.incr(t, 2*time.Minute, map[string]float64{"product:1": 1})
		if _, err := e.roller.RollupOnce(ctx); err != nil {
			t.Fatal(err)
		}
		want := map[string]int64{row("product:1"): 9, row("product:2"): 8}
		if got := hits(t, pg.Pool); !mapsEqual(got, want) {
			t.Errorf("table = %v, want %v", got, want)
		}
	})
	t.Run("foreign keys", func(t *testing.T) {
		// Not sorted sets: deleted, counted, and the other buckets roll up.
		k3, _ := e.bucket(3 * time.Minute)
		if err := rd.Client.Set(ctx, k3, "garbage", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rd.Client.RPush(ctx, accesslog.RollingKey(e.ns, key), "x").Err(); err != nil {
			t.Fatal(err)
		}
		e.incr(t, 2*time.Minute, map[string]float64{"product:2": 1})
		res, err := e.roller.RollupOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := [2]int{res.Foreign, res.Buckets}, [2]int{2, 1}; got != want {
			t.Errorf("foreign, buckets = %v, want %v", got, want)
		}
		wantMetric(t, e.reg, "hearth_access_log_foreign_buckets_total", " 2")
		if got, want := hits(t, pg.Pool)[row("product:2")], int64(9); got != want {
			t.Errorf("product:2 = %d, want %d", got, want)
		}
	})
}

// TestRollupDatabaseDown: while PostgreSQL is down the roll-up fails and the
// bucket stays in Redis; the next run after it is back writes it once.
func TestRollupDatabaseDown(t *testing.T) {
	srv := testenv.PrivatePostgres(t)
	rd := testenv.Redis(t)
	ctx := ctxT(t)
	pool, err := pgxpool.New(ctx, srv.DSN()+"&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	migrate(t, pool)
	e := newRollupEnv(t, pool, rd.Client, strings.TrimSuffix(rd.Prefix, ":"))
	key := e.incr(t, 3*time.Minute, map[string]float64{"product:9": 5})
	_, b := e.bucket(3 * time.Minute)

	srv.Stop(t)
	if _, err := e.roller.RollupOnce(ctx); err == nil {
		t.Fatal("roll-up succeeded with the database down")
	}
	if n := rd.Client.Exists(ctx, key).Val() + rd.Client.Exists(ctx, accesslog.RollingKey(e.ns, key)).Val(); n != 1 {
		t.Fatalf("bucket %s deleted although its roll-up failed", key)
	}
	wantMetric(t, e.reg, "hearth_access_log_rollups_total", `{result="error"} 1`)
	srv.Start(t)
	var rerr error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if _, rerr = e.roller.RollupOnce(ctx); rerr == nil {
			break
		}
	}
	if rerr != nil {
		t.Fatalf("roll-up after the database came back: %v", rerr)
	}
	want := map[string]int64{fmt.Sprintf("%d/product:9", b): 5}
	if got := hits(t, pool); !mapsEqual(got, want) {
		t.Errorf("table = %v, want %v", got, want)
	}
	if n := rd.Client.Exists(ctx, key, accesslog.RollingKey(e.ns, key)).Val(); n != 0 {
		t.Errorf("bucket %s left in Redis after a successful roll-up", key)
	}
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// metricHelp is the type and help of each metric the tests read back.
var metricHelp = map[string][2]string{
	"hearth_access_log_rolled_up_rows_total":  {"counter", "Access-log rows (one key in one bucket) written by roll-ups."},
	"hearth_access_log_skipped_keys_total":    {"counter", "Members of Redis access-log buckets not rolled up, by reason (too_long, malformed, bad_score)."},
	"hearth_access_log_clamped_counts_total":  {"counter", "Members of Redis access-log buckets whose count was above the per-bucket maximum, lowered to it."},
	"hearth_access_log_foreign_buckets_total": {"counter", "Redis access-log bucket keys that were no sorted set, deleted unread."},
	"hearth_access_log_rollups_total":         {"counter", "Roll-ups of the Redis access-log buckets into PostgreSQL, by result (ok, error)."},
	"hearth_access_log_recording_rejects":     {"gauge", "Rows the access-log table's guard dropped or lowered since it was created, by reason (too_long, bad_count, clamped), as of the last roll-up."},
}

// wantMetric checks every series of metric name in reg with testutil: series
// are its exposition lines after the name, in label order (`{reason="x"} 2`,
// or " 4" for a metric without labels).
func wantMetric(t *testing.T, reg *prometheus.Registry, name string, series ...string) {
	t.Helper()
	h, ok := metricHelp[name]
	if !ok {
		t.Fatalf("no help for %s", name)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, h[1], name, h[0])
	for _, s := range series {
		b.WriteString(name + s + "\n")
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(b.String()), name); err != nil {
		t.Errorf("%s: %v", name, err)
	}
}

// TestStoredRankingChunks: a ranking of more keys than one stored row holds
// reads back in the same order as the live one, cut at any n.
func TestStoredRankingChunks(t *testing.T) {
	pg := testenv.Postgres(t)
	migrate(t, pg.Pool)
	ctx := ctxT(t)
	log := accesslog.New(pg.Pool).UseRanking(time.Minute)
	hits := map[string]int64{}
	for i := range 2500 {
		hits[fmt.Sprintf("product:%d", i)] = int64(i % 97) // many ties, broken by key
	}
	if err := log.Record(ctx, time.Now(), time.Minute, hits); err != nil {
		t.Fatal(err)
	}
	live, err := accesslog.New(pg.Pool).TopKeys(ctx, time.Hour, 2500)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := log.Rank(ctx, time.Hour, 2500); err != nil || n != 2500 {
		t.Fatalf("Rank = %d, %v; want 2500 keys", n, err)
	}
	for _, n := range []int{1, 999, 1000, 1001, 2100, 2500} {
		got, err := log.TopKeys(ctx, time.Hour, n)
		if err != nil {
			t.Fatal(err)
		}
		if log.LastRanking() != accesslog.RankingStored || !slices.Equal(got, live[:n]) {
			t.Errorf("TopKeys(%d) from %s: %d keys, want the first %d of the live ranking", n, log.LastRanking(), len(got), n)
		}
	}
}

// TestRollupHostileMembers: a bucket holding, next to good keys, a member of
// 3,000 bytes (over the btree limit: it failed the whole bucket's INSERT, every
// run) and scores that are no count (±inf, negative, zero) or absurd (1e300, in
// three buckets: their sum overflowed the ranking's bigint) rolls up the good
// keys, skips and counts the bad members, lowers the absurd counts, and ranks.
func TestRollupHostileMembers(t *testing.T) {
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	migrate(t, pg.Pool)
	e := newRollupEnv(t, pg.Pool, rd.Client, strings.TrimSuffix(rd.Prefix, ":"))
	ctx := ctxT(t)
	long := incompressible(3000)                       // a repeated byte compresses below the limit
	edge := strings.Repeat("e", accesslog.MaxKeyBytes) // exactly the bound: kept
	for _, ago := range []time.Duration{2 * time.Minute, 3 * time.Minute, 4 * time.Minute} {
		key, _ := e.bucket(ago)
		for _, z := range []redis.Z{
			{Score: 5, Member: "product:1"}, {Score: 3, Member: "product:2"}, {Score: 1, Member: edge},
			{Score: 1, Member: long}, {Score: 1, Member: strings.Repeat("x", accesslog.MaxKeyBytes+1)},
			{Score: math.Inf(1), Member: "inf"}, {Score: math.Inf(-1), Member: "-inf"},
			{Score: -5, Member: "negative"}, {Score: 0, Member: "zero"}, {Score: 1e300, Member: "huge"},
		} {
			if err := rd.Client.ZAdd(ctx, key, z).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	res, err := e.roller.RollupOnce(ctx)
	if err != nil {
		t.Fatalf("RollupOnce: %v", err)
	}
	if got, want := res, (accesslog.RollupResult{Buckets: 3, Rows: 12, Skipped: 18, Clamped: 3}); got != want {
		t.Errorf("RollupResult = %+v, want %+v", got, want)
	}
	wantMetric(t, e.reg, "hearth_access_log_skipped_keys_total",
		`{reason="bad_score"} 12`, `{reason="malformed"} 0`, `{reason="too_long"} 6`)
	wantMetric(t, e.reg, "hearth_access_log_clamped_counts_total", " 3")
	log := accesslog.New(pg.Pool)
	got, err := log.TopKeys(ctx, time.Hour, 10)
	if err != nil {
		t.Fatalf("TopKeys: %v", err)
	}
	if want := []string{"huge", "product:1", "product:2", edge}; !slices.Equal(got, want) {
		t.Errorf("TopKeys = %.20q, want %.20q", got, want)
	}
	if n, err := log.Rank(ctx, time.Hour, 10); err != nil || n != 4 {
		t.Errorf("Rank = %d, %v; want 4 keys", n, err)
	}
}

// TestRankingSumCannotOverflow: rows written before the table had its guard
// (or by anyone who turned it off) may hold any bigint; the ranking's sum over
// buckets is capped instead of failing with "bigint out of range".
func TestRankingSumCannotOverflow(t *testing.T) {
	pg := testenv.Postgres(t)
	migrate(t, pg.Pool)
	ctx := ctxT(t)
	for _, q := range []string{
		`ALTER TABLE hearth_access_log DISABLE TRIGGER hearth_access_log_guard`,
		`INSERT INTO hearth_access_log (bucket, key, hits) VALUES
			(date_trunc('minute', now()), 'big', 9223372036854775807),
			(date_trunc('minute', now()) - interval '1 minute', 'big', 9223372036854775807),
			(date_trunc('minute', now()), 'small', 1)`,
	} {
		if _, err := pg.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	log := accesslog.New(pg.Pool)
	got, err := log.TopKeys(ctx, time.Hour, 10)
	if err != nil {
		t.Fatalf("TopKeys: %v", err)
	}
	if want := []string{"big", "small"}; !slices.Equal(got, want) {
		t.Errorf("TopKeys = %q, want %q", got, want)
	}
	if _, err := log.Rank(ctx, time.Hour, 10); err != nil {
		t.Errorf("Rank: %v", err)
	}
}

// TestRecordGuard: the table itself drops a key over MaxKeyBytes and a
// negative count, and lowers a count over MaxBucketHits, counting each: one bad
// entry never fails the application's batch (a 3,000-byte key did, with
// "index row size exceeds btree maximum"), and adding to a count at the bound
// cannot overflow.
func TestRecordGuard(t *testing.T) {
	pg := testenv.Postgres(t)
	migrate(t, pg.Pool)
	ctx := ctxT(t)
	log := accesslog.New(pg.Pool)
	at := time.Now()
	edge := strings.Repeat("e", accesslog.MaxKeyBytes)
	batch := map[string]int64{
		"good": 2, edge: 1, incompressible(3000): 1, strings.Repeat("y", accesslog.MaxKeyBytes+1): 1,
		"negative": -1, "huge": math.MaxInt64,
	}
	if err := log.Record(ctx, at, time.Minute, batch); err != nil {
		t.Fatalf("Record with bad entries: %v", err)
	}
	// The documented statement adds to a count at the bound: no overflow.
	if err := log.Record(ctx, at, time.Minute, map[string]int64{"huge": math.MaxInt64, "good": 1}); err != nil {
		t.Fatalf("Record onto a count at the bound: %v", err)
	}
	b := accesslog.BucketStart(at, time.Minute).Unix()
	want := map[string]int64{
		fmt.Sprintf("%d/good", b): 3, fmt.Sprintf("%d/%s", b, edge): 1, fmt.Sprintf("%d/huge", b): accesslog.MaxBucketHits,
	}
	if got := hits(t, pg.Pool); !mapsEqual(got, want) {
		t.Errorf("table holds %d rows, want %d: %.60v", len(got), len(want), got)
	}
	rejects, err := log.Rejects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// clamped: the insert of huge, then each update onto it.
	if got, want := rejects, map[string]int64{"too_long": 2, "bad_count": 1, "clamped": 3}; !mapsEqual(got, want) {
		t.Errorf("Rejects = %v, want %v", got, want)
	}
	// A roll-up exports them.
	rd := testenv.Redis(t)
	e := newRollupEnv(t, pg.Pool, rd.Client, strings.TrimSuffix(rd.Prefix, ":"))
	if _, err := e.roller.RollupOnce(ctx); err != nil {
		t.Fatal(err)
	}
	wantMetric(t, e.reg, "hearth_access_log_recording_rejects",
		`{reason="bad_count"} 1`, `{reason="clamped"} 3`, `{reason="too_long"} 2`)
}

// TestParseHits: a score is a count of reads only when finite and at least
// 0.5 (Redis refuses NaN in ZADD, but a score is read as untrusted anyway),
// and a count is at most MaxBucketHits.
func TestParseHits(t *testing.T) {
	for _, c := range []struct {
		score       float64
		hits        int64
		ok, clamped bool
	}{
		{1, 1, true, false},
		{2.6, 3, true, false},
		{0.5, 1, true, false},
		{0.4, 0, false, false},
		{0, 0, false, false},
		{-3, 0, false, false},
		{math.NaN(), 0, false, false},
		{math.Inf(1), 0, false, false},
		{math.Inf(-1), 0, false, false},
		{float64(accesslog.MaxBucketHits), accesslog.MaxBucketHits, true, false},
		{float64(accesslog.MaxBucketHits) + 1024, accesslog.MaxBucketHits, true, true},
		{1e300, accesslog.MaxBucketHits, true, true},
		{math.MaxFloat64, accesslog.MaxBucketHits, true, true},
	} {
		hits, ok, clamped := accesslog.ParseHits(c.score)
		if hits != c.hits || ok != c.ok || clamped != c.clamped {
			t.Errorf("ParseHits(%g) = %d, %v, %v; want %d, %v, %v", c.score, hits, ok, clamped, c.hits, c.ok, c.clamped)
		}
	}
}

// TestRollupConcurrentWriters: reads counted into a bucket while it is rolled
// up are never lost: with 200,000 members and a writer incrementing throughout
// the roll-up, the table's counts add up to every increment once the next run
// has rolled up what arrived late. (Scanning the bucket in place and deleting
// it afterwards lost the increments that landed during the scan.)
func TestRollupConcurrentWriters(t *testing.T) {
	if testing.Short() {
		t.Skip("200,000 members")
	}
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	migrate(t, pg.Pool)
	e := newRollupEnv(t, pg.Pool, rd.Client, strings.TrimSuffix(rd.Prefix, ":"))
	ctx := ctxT(t)
	const members = 200_000
	key, _ := e.bucket(2 * time.Minute)
	zs := make([]redis.Z, 0, 10_000)
	for i := range members {
		zs = append(zs, redis.Z{Score: 1, Member: fmt.Sprintf("product:%d", i)})
		if len(zs) == cap(zs) {
			if err := rd.Client.ZAdd(ctx, key, zs...).Err(); err != nil {
				t.Fatal(err)
			}
			zs = zs[:0]
		}
	}
	total := int64(members)

	stop, started := make(chan struct{}), make(chan struct{})
	written := make(chan int64)
	go func() {
		var n int64
		defer func() {
			if n == 0 {
				close(started) // failed at once: t.Error said why
			}
			written <- n
		}()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			pipe := rd.Client.Pipeline()
			for j := range 100 {
				pipe.ZIncrBy(ctx, key, 1, fmt.Sprintf("product:%d", (i*7919+j*104729)%members))
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Error(err)
				return
			}
			if n += 100; n == 100 {
				close(started)
			}
		}
	}()
	// The writer is running before the roll-up starts and until it ends.
	<-started
	res1, err := e.roller.RollupOnce(ctx)
	close(stop)
	total += <-written
	if err != nil {
		t.Fatal(err)
	}
	res2, err := e.roller.RollupOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	if err := pg.Pool.QueryRow(ctx, `SELECT coalesce(sum(hits), 0)::bigint FROM hearth_access_log`).Scan(&sum); err != nil {
		t.Fatal(err)
	}
	t.Logf("first run %+v, second run %+v, %d increments", res1, res2, total)
	if sum != total {
		t.Errorf("table counts add up to %d, want %d increments (%d lost)", sum, total, total-sum)
	}
	if res2.Buckets == 0 {
		t.Errorf("second run rolled up nothing: the writer never overlapped the first run")
	}
}

// incompressible returns n random hex digits: PostgreSQL compresses a long
// repetitive key below the btree limit, not this one.
func incompressible(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}
