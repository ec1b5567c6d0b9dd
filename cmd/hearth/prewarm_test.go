package main_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/leadertest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/rewarm"
	"github.com/hearth-dev/hearth/store"
)

// catalogue is what a new user sets up: a products table, a config naming it,
// `hearth migrate up`, and an access log filled with the documented statement.
type catalogue struct {
	pg     *testenv.PostgresEnv
	prefix string // cache keys start with it
	ns     string // redis.namespace
	config string // path of the config file
}

// newCatalogue writes a config declaring <prefix>top and <prefix>product:{id}
// (member 1 declared; the rest come from the access log). Products 1..n exist,
// product 13's value is NULL (it cannot load). slow adds a pg_sleep to every
// family batch; extra is appended to the config.
func newCatalogue(t *testing.T, rdb *redis.Client, prefix string, n int, slow time.Duration, extra string) *catalogue {
	t.Helper()
	redisAddr := rdb.Options().Addr
	c := &catalogue{pg: testenv.Postgres(t), prefix: prefix, ns: e2e.Namespace(t, rdb)}
	ctx := context.Background()
	for _, q := range []string{
		`CREATE TABLE products (id bigint PRIMARY KEY, v text)`,
		fmt.Sprintf(`INSERT INTO products SELECT i, CASE WHEN i = 13 THEN NULL ELSE 'p' || i END FROM generate_series(1, %d) i`, n),
	} {
		if _, err := c.pg.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	query := "SELECT id::text, v FROM products WHERE id::text = ANY($1)"
	if slow > 0 {
		query = fmt.Sprintf("SELECT id::text, v FROM products, pg_sleep(%g) WHERE id::text = ANY($1)", slow.Seconds())
	}
	cfg := fmt.Sprintf(`
redis:
  addrs: [%q]
  namespace: %q
http:
  listen: %q
log: {level: debug, format: json}
sources:
  - name: catalog
    type: postgres
    dsn: %q
access_log:
  source: catalog
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
    param_pattern: "[0-9]{1,12}"
    members: ["1"]
    query: %q
%s`, redisAddr, c.ns, e2e.FreeAddr(t), c.pg.DSN, prefix+"top", prefix+"product:{id}", query, extra)
	c.config = filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(c.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := runHearth(t, "migrate", "up", "--config", c.config); code != 0 {
		t.Fatalf("hearth migrate up: exit %d\n%s", code, out)
	}
	return c
}

// record fills the access log with the documented batched upsert, in the
// current minute: the first key is the hottest.
func (c *catalogue) record(t *testing.T, keys ...string) {
	t.Helper()
	ks := make([]string, len(keys))
	hs := make([]int64, len(keys))
	for i, k := range keys {
		ks[i], hs[i] = c.prefix+k, int64(1000-i)
	}
	_, err := c.pg.Pool.Exec(context.Background(), accesslog.RecordSQL, time.Now().Truncate(time.Minute), ks, hs)
	if err != nil {
		t.Fatal(err)
	}
}

func (c *catalogue) listen(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(c.config)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(data), "listen: \"")
	addr, _, _ := strings.Cut(rest, "\"")
	return "http://" + addr
}

// runHearth runs the binary to completion and returns its exit code and output.
func runHearth(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(e2e.Binary(t), args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		}
		t.Fatalf("run hearth %v: %v", args, err)
	}
	return 0, string(out)
}

func products(ids ...int) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = fmt.Sprintf("product:%d", id)
	}
	return out
}

func seq(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// TestPrewarmCommand runs `hearth prewarm` against an empty second Redis
// database, as before a blue-green cutover.
func TestPrewarmCommand(t *testing.T) {
	t.Parallel()
	green := testenv.PrivateRedis(t)
	const db = 1
	target := fmt.Sprintf("redis://%s/%d", green.Addr, db)
	gc := redis.NewClient(&redis.Options{Addr: green.Addr, DB: db})
	defer gc.Close()
	ctx := context.Background()
	c := newCatalogue(t, green.Client(t), "pw:", 40, 0, "")
	// 30 hot products, two hostile keys, and product 13 which cannot load.
	c.record(t, append(products(seq(1, 12)...), append([]string{"product:{id}", "user:1"}, products(seq(14, 31)...)...)...)...)

	t.Run("success", func(t *testing.T) {
		code, out := runHearth(t, "prewarm", "--config", c.config, "--redis", target, "--top", "100")
		if code != 0 {
			t.Fatalf("exit %d, want 0\n%s", code, out)
		}
		for _, want := range []string{"wanted                31", "written               31", "failed                0",
			"skipped               2 (invalid_member 1, unknown 1)", "coverage              100.000%", "keys/s"} {
			if !strings.Contains(out, want) {
				t.Errorf("summary lacks %q:\n%s", want, out)
			}
		}
		for _, id := range []int{1, 12, 14, 31} {
			k := fmt.Sprintf("%sproduct:%d", c.prefix, id)
			if got, want := gc.Get(ctx, k).Val(), fmt.Sprintf("p%d", id); got != want {
				t.Errorf("green %s = %q, want %q", k, got, want)
			}
		}
		if n := gc.DBSize(ctx).Val(); n != 31 {
			t.Errorf("green holds %d keys, want 31", n)
		}
		if n := green.Client(t).DBSize(ctx).Val(); n != 0 {
			t.Errorf("database 0 of the green server holds %d keys, want 0: --redis named database %d", n, db)
		}
	})

	t.Run("coverage shortfall", func(t *testing.T) {
		c.record(t, "product:13") // now hottest of all, and it fails to load
		code, out := runHearth(t, "prewarm", "--config", c.config, "--redis", target, "--top", "100")
		if code != 3 {
			t.Fatalf("exit %d, want 3 (coverage below --min-coverage)\n%s", code, out)
		}
		for _, want := range []string{"failed                1", "coverage              96.875% (minimum 99.000%)", "below --min-coverage"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		code, out = runHearth(t, "prewarm", "--config", c.config, "--redis", target, "--top", "100", "--min-coverage", "0.9")
		if code != 0 {
			t.Errorf("with --min-coverage 0.9: exit %d, want 0\n%s", code, out)
		}
	})

	t.Run("errors", func(t *testing.T) {
		if code, out := runHearth(t, "prewarm", "--config", c.config, "--redis", "redis://127.0.0.1:1/0"); code != 1 {
			t.Errorf("unreachable redis: exit %d, want 1\n%s", code, out)
		}
		if code, out := runHearth(t, "prewarm", "--config", c.config, "--min-coverage", "2"); code != 2 {
			t.Errorf("--min-coverage 2: exit %d, want 2\n%s", code, out)
		}
		code, out := runHearth(t, "prewarm", "--config", c.config, "--redis", "redis://:s3cret@127.0.0.1:1/0")
		if code != 1 || strings.Contains(out, "s3cret") {
			t.Errorf("exit %d, output must not hold the password:\n%s", code, out)
		}
	})
}

// TestReadyOnlyAfterPrewarm: `hearth run` answers 503 on /readyz while it
// pre-warms from a slow origin, and when it first answers 200 the top keys of
// the access log, and one counted in a Redis bucket, are in Redis.
func TestReadyOnlyAfterPrewarm(t *testing.T) {
	rd := testenv.Redis(t)
	c := newCatalogue(t, rd.Client, rd.Prefix, 60, 300*time.Millisecond, "prewarm: {concurrency: 1}\n")
	hot := products(seq(20, 50)...)
	c.record(t, hot...)
	// A read counted the Redis way, in a bucket that closed two minutes ago.
	bucket := accesslog.BucketKey(c.ns, accesslog.BucketStart(time.Now().Add(-2*time.Minute), time.Minute))
	if err := rd.Client.ZIncrBy(context.Background(), bucket, 5000, rd.Prefix+"product:55").Err(); err != nil {
		t.Fatal(err)
	}
	want := append([]string{"top", "product:1", "product:55"}, hot...)

	p := e2e.Start(t, []string{"run", "--config", c.config})
	url := c.listen(t)
	saw503 := false
	deadline := time.Now().Add(30 * time.Second)
	for {
		if time.Now().After(deadline) || p.Exited() {
			t.Fatalf("never ready (exited: %v)", p.Exited())
		}
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			saw503 = true
		}
		if resp.StatusCode == http.StatusOK {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var missing []string
	for _, k := range want {
		if rd.Client.Exists(context.Background(), rd.Prefix+k).Val() == 0 {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		t.Errorf("ready while %d top keys were missing: %q", len(missing), missing)
	}
	if !saw503 {
		t.Error("/readyz never answered 503 during the pre-warm")
	}
	if n := rd.Client.Exists(context.Background(), bucket).Val(); n != 0 {
		t.Errorf("bucket %s not rolled up at start-up", bucket)
	}
	m := e2e.Metrics(t, url+"/metrics")
	if got := e2e.Sum(m, "hearth_prewarm_runs_total", `result="ok"`); got != 1 {
		t.Errorf("hearth_prewarm_runs_total{result=ok} = %g, want 1", got)
	}
	if got := e2e.Sum(m, "hearth_access_log_rolled_up_rows_total"); got != 1 {
		t.Errorf("hearth_access_log_rolled_up_rows_total = %g, want 1", got)
	}
}

// TestRewarmAfterFlushE2E: FLUSHDB under a running hearth brings the keys back
// within seconds and counts the re-warm.
func TestRewarmAfterFlushE2E(t *testing.T) {
	srv := testenv.PrivateRedis(t)
	rdb := srv.Client(t)
	c := newCatalogue(t, rdb, "fl:", 20, 0, "prewarm: {rewarm_check: 200ms}\n")
	c.record(t, products(5, 6, 7)...)
	p := e2e.Start(t, []string{"run", "--config", c.config})
	url := c.listen(t)
	p.WaitHTTP(t, url+"/readyz", http.StatusOK, 30*time.Second)
	ctx := context.Background()
	keys := []string{"fl:top", "fl:product:1", "fl:product:5", "fl:product:6", "fl:product:7"}
	if n := rdb.Exists(ctx, keys...).Val(); n != int64(len(keys)) {
		t.Fatalf("%d of %d keys warm before the flush", n, len(keys))
	}
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var n int64
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if n = rdb.Exists(ctx, keys...).Val(); n == int64(len(keys)) {
			break
		}
	}
	if n != int64(len(keys)) {
		t.Fatalf("%d of %d keys back after the flush; redis holds %q", n, len(keys), rdb.Keys(ctx, "*").Val())
	}
	m := e2e.Metrics(t, url+"/metrics")
	if got := e2e.Sum(m, "hearth_prewarm_rewarms_total", `reason="flush"`); got < 1 {
		t.Errorf("hearth_prewarm_rewarms_total{reason=flush} = %g, want >= 1", got)
	}
	if p.Exited() {
		t.Fatal("hearth exited")
	}
}

// TestRewarmAfterRestartE2E: a restart of Redis (no persistence) under a
// running hearth brings every key back soon after Redis accepts connections
// again (the bound is generous so that it cannot flake under load;
// BenchmarkRewarmAfterFlush measures how soon), with the periodic check out of
// reach: the reconnection alone starts the re-warm. A second restart, once the
// re-warms' minimum gap has passed, is re-warmed the same way.
func TestRewarmAfterRestartE2E(t *testing.T) {
	t.Parallel() // its own Redis server and daemon; a generous bound
	srv := testenv.PrivateRedis(t)
	rdb := srv.Client(t)
	c := newCatalogue(t, rdb, "rs:", 20, 0, "prewarm: {rewarm_check: 1h}\n")
	c.record(t, products(5, 6, 7)...)
	p := e2e.Start(t, []string{"run", "--config", c.config})
	url := c.listen(t)
	p.WaitHTTP(t, url+"/readyz", http.StatusOK, 30*time.Second)
	ctx := context.Background()
	keys := []string{"rs:top", "rs:product:1", "rs:product:5", "rs:product:6", "rs:product:7"}
	if n := rdb.Exists(ctx, keys...).Val(); n != int64(len(keys)) {
		t.Fatalf("%d of %d keys warm before the restart", n, len(keys))
	}
	for i := range 2 {
		if i > 0 {
			time.Sleep(rewarm.DefaultMinGap) // a sooner loss waits for the gap: the flapping bound
		}
		up := srv.RestartTimed(t, time.Duration(i)*time.Second) // the second one stays down for 1s
		poller := srv.Client(t)
		var n int64
		for time.Since(up) < 2*time.Second {
			if n = poller.Exists(ctx, keys...).Val(); n == int64(len(keys)) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if n != int64(len(keys)) {
			t.Fatalf("restart %d: %d of %d keys back 2s after redis accepted connections; redis holds %q\n%s",
				i+1, n, len(keys), poller.Keys(ctx, "*").Val(), p.Output())
		}
		t.Logf("restart %d: every key back %s after redis accepted connections", i+1, time.Since(up).Round(time.Millisecond))
		_ = poller.Close()
	}
	m := e2e.Metrics(t, url+"/metrics")
	if got := e2e.Sum(m, "hearth_prewarm_rewarms_total", `reason="restart"`); got < 1 {
		t.Errorf("hearth_prewarm_rewarms_total{reason=restart} = %g, want >= 1", got)
	}
	if p.Exited() {
		t.Fatal("hearth exited")
	}
}

// TestPrewarmCommandLeavesPresentValues: a pre-warm into a serving Redis never
// replaces a value already there (fresher than the origin's, here) unless
// --overwrite is given, and reports the keys it found present; against a
// Redis where a Hearth leader holds the lease it says it is fenced.
func TestPrewarmCommandLeavesPresentValues(t *testing.T) {
	srv := testenv.PrivateRedis(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	c := newCatalogue(t, rdb, "pp:", 10, 0, "")
	c.record(t, products(2, 3, 4)...)
	if err := rdb.Set(ctx, "pp:product:2", "fresher", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}

	code, out := runHearth(t, "prewarm", "--config", c.config, "--top", "10")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	for _, want := range []string{"mode                  fill absent keys only\n", "wanted                4",
		"written               3", "already present       1", "coverage              100.000%"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if got := rdb.Get(ctx, "pp:product:2").Val(); got != "fresher" {
		t.Errorf("present value replaced without --overwrite: %q", got)
	}
	if got := rdb.Get(ctx, "pp:product:3").Val(); got != "p3" {
		t.Errorf("absent key = %q, want p3", got)
	}

	// A leader's lease in that Redis: the writes are fenced by its epoch.
	if err := rdb.Set(ctx, c.ns+":{lease}", "1700000000000:other/1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	code, out = runHearth(t, "prewarm", "--config", c.config, "--top", "10", "--overwrite")
	if code != 0 {
		t.Fatalf("--overwrite: exit %d\n%s", code, out)
	}
	for _, want := range []string{"mode                  overwrite, fenced by epoch 1700000000000 (leader other)",
		"written               4", "already present       0"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if got := rdb.Get(ctx, "pp:product:2").Val(); got != "p2" {
		t.Errorf("--overwrite left %q, want p2", got)
	}

	// A newer leader's fence: every write is refused and counted.
	if err := rdb.Set(ctx, c.ns+":fence", "1700000000001", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, "pp:product:2", "newer leader's", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	code, out = runHearth(t, "prewarm", "--config", c.config, "--top", "10", "--overwrite")
	if code != 3 {
		t.Fatalf("fenced: exit %d, want 3\n%s", code, out)
	}
	if !strings.Contains(out, "failed                4 (fenced 4)") {
		t.Errorf("summary lacks the fenced count:\n%s", out)
	}
	if got := rdb.Get(ctx, "pp:product:2").Val(); got != "newer leader's" {
		t.Errorf("a fenced pre-warm replaced the value: %q", got)
	}
}

// TestPrewarmOverwriteKeepsNewerVersions: `hearth prewarm --overwrite` reading
// a database that lags behind (a replica, a restored snapshot) into a Redis
// where a leader writes version-checked values replaces a value only with a
// newer version of it, and leaves a version record the leader's next write
// compares with.
func TestPrewarmOverwriteKeepsNewerVersions(t *testing.T) {
	srv := testenv.PrivateRedis(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	pg := testenv.Postgres(t)
	ns := e2e.Namespace(t, rdb)
	// The database the pre-warm reads holds version 10 of every row.
	if _, err := pg.Pool.Exec(ctx, `CREATE TABLE items (id bigint PRIMARY KEY, v text NOT NULL, ver bigint NOT NULL);
		INSERT INTO items SELECT i, 'old' || i, 10 FROM generate_series(1, 4) i`); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
redis: {addrs: [%q], namespace: %q}
log: {level: warn, format: json}
sources: [{name: db, type: postgres, dsn: %q}]
access_log: {source: db}
keys:
  - name: item
    key: "vi:item:{id}"
    source: db
    ttl: 10m
    param_pattern: "[0-9]{1,9}"
    members: ["1"]
    version_column: ver
    query: "SELECT id::text, v, ver FROM items WHERE id = ANY($1::bigint[])"
`, rdb.Options().Addr, ns, pg.DSN)), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := runHearth(t, "migrate", "up", "--config", cfg); code != 0 {
		t.Fatalf("hearth migrate up: exit %d\n%s", code, out)
	}
	keys := []string{"vi:item:1", "vi:item:2", "vi:item:3", "vi:item:4"}
	if _, err := pg.Pool.Exec(ctx, accesslog.RecordSQL, time.Now().Truncate(time.Minute), keys, []int64{4, 3, 2, 1}); err != nil {
		t.Fatal(err)
	}

	// The leader has written items 1 and 2 at version 20 and item 3 at
	// version 5; item 4 it has not written.
	in := leadertest.On(t, rdb, ns).Instance(time.Minute, 50*time.Millisecond, false)
	term := leadertest.Campaign(t, in.Lease, 5*time.Second)
	lw := in.Store.Writer(term)
	var entries []store.Entry
	for i, ver := range []int64{20, 20, 5} {
		entries = append(entries, store.Entry{Key: keys[i], Value: []byte(fmt.Sprintf("v%d-%d", ver, i+1)), TTL: 10 * time.Minute,
			Seq: int64(100 + i), Versioned: true, Version: ver, VersionTTL: 20 * time.Minute, Family: "item"})
	}
	if err := lw.Set(ctx, entries); err != nil {
		t.Fatal(err)
	}

	code, out := runHearth(t, "prewarm", "--config", cfg, "--top", "10", "--overwrite")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	for _, want := range []string{"written               2", "already present       2", "coverage              100.000%"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	for key, want := range map[string]string{keys[0]: "v20-1", keys[1]: "v20-2", keys[2]: "old3", keys[3]: "old4"} {
		if got := rdb.Get(ctx, key).Val(); got != want {
			t.Errorf("%s = %q, want %q", key, got, want)
		}
	}
	// The leader's next write of the version the pre-warm wrote, with the
	// same bytes, only extends it; an older one is refused.
	for _, e := range []store.Entry{
		{Key: keys[3], Value: []byte("old4"), TTL: 10 * time.Minute, Seq: 200, Versioned: true, Version: 10, VersionTTL: 20 * time.Minute, Family: "item"},
		{Key: keys[3], Value: []byte("v9-4"), TTL: 10 * time.Minute, Seq: 201, Versioned: true, Version: 9, VersionTTL: 20 * time.Minute, Family: "item"},
	} {
		if err := lw.Set(ctx, []store.Entry{e}); err != nil {
			t.Fatal(err)
		}
	}
	if got := rdb.Get(ctx, keys[3]).Val(); got != "old4" {
		t.Errorf("%s = %q after the leader wrote versions 10 and 9, want old4 (version 10)", keys[3], got)
	}
}

// TestPrewarmRankingFreshness: reads recorded after the leader's last stored
// ranking are pre-warmed. `hearth prewarm` (--ranking auto) ranks live when
// the stored ranking holds no keys or predates the newest closed bucket, and
// its coverage counts the new keys; --ranking stored refuses such a ranking
// (exit 1, naming why); a fresh one is read as stored.
func TestPrewarmRankingFreshness(t *testing.T) {
	t.Parallel()
	green := testenv.PrivateRedis(t)
	gc := green.Client(t)
	ctx := context.Background()
	c := newCatalogue(t, gc, "fr:", 40, 0, "")
	al := accesslog.New(c.pg.Pool)
	prewarm := func(t *testing.T, args ...string) (int, string) {
		t.Helper()
		return runHearth(t, append([]string{"prewarm", "--config", c.config, "--redis", green.Addr, "--top", "100"}, args...)...)
	}
	warm := func(t *testing.T, ids ...int) {
		t.Helper()
		for _, id := range ids {
			k := fmt.Sprintf("%sproduct:%d", c.prefix, id)
			if got, want := gc.Get(ctx, k).Val(), fmt.Sprintf("p%d", id); got != want {
				t.Errorf("%s = %q, want %q: a key read after the stored ranking was not pre-warmed", k, got, want)
			}
		}
	}

	// The leader ranked an empty access log; reads arrive afterwards.
	if n, err := al.Rank(ctx, time.Hour, 10_000); err != nil || n != 0 {
		t.Fatalf("rank the empty log: %d keys, %v", n, err)
	}
	c.record(t, products(2, 3, 4)...)

	t.Run("empty stored ranking", func(t *testing.T) {
		code, out := prewarm(t, "--ranking", "stored")
		if code != 1 || !strings.Contains(out, "holds no keys") {
			t.Errorf("--ranking stored with an empty ranking: exit %d, want 1 naming why\n%s", code, out)
		}
		if gc.Exists(ctx, c.prefix+"product:2").Val() != 0 {
			t.Errorf("--ranking stored failed, yet product:2 was loaded")
		}
		code, out = prewarm(t)
		if code != 0 {
			t.Fatalf("exit %d\n%s", code, out)
		}
		for _, want := range []string{"access-log keys read  3", "ranking               live, buckets ", "holds no keys", "wanted                4", "coverage              100.000%"} {
			if !strings.Contains(out, want) {
				t.Errorf("summary lacks %q:\n%s", want, out)
			}
		}
		warm(t, 2, 3, 4)
	})

	t.Run("ranking older than the newest closed bucket", func(t *testing.T) {
		// A ranking of product 2, two minutes old (within its maximum age of
		// 3 × rank_interval), then reads of 5 and 6 in the bucket that
		// closed since.
		if _, err := c.pg.Pool.Exec(ctx, `DELETE FROM hearth_access_log`); err != nil {
			t.Fatal(err)
		}
		c.record(t, "product:2")
		if n, err := al.Rank(ctx, time.Hour, 10_000); err != nil || n != 1 {
			t.Fatalf("rank: %d keys, %v", n, err)
		}
		if _, err := c.pg.Pool.Exec(ctx, `UPDATE hearth_access_rank_info SET computed_at = now() - interval '2 minutes'`); err != nil {
			t.Fatal(err)
		}
		closed := time.Now().Add(-time.Minute).Truncate(time.Minute)
		if _, err := c.pg.Pool.Exec(ctx, accesslog.RecordSQL, closed, []string{c.prefix + "product:5", c.prefix + "product:6"}, []int64{9, 8}); err != nil {
			t.Fatal(err)
		}
		if code, out := prewarm(t, "--ranking", "stored"); code != 1 || !strings.Contains(out, "predates the end of the newest closed bucket") {
			t.Errorf("--ranking stored with an old ranking: exit %d, want 1 naming why\n%s", code, out)
		}
		code, out := prewarm(t)
		if code != 0 {
			t.Fatalf("exit %d\n%s", code, out)
		}
		for _, want := range []string{"access-log keys read  3", "ranking               live, ", "predates", "wanted                4", "coverage              100.000%"} {
			if !strings.Contains(out, want) {
				t.Errorf("summary lacks %q:\n%s", want, out)
			}
		}
		warm(t, 5, 6)
	})

	t.Run("fresh stored ranking", func(t *testing.T) {
		// A ranking made just before a minute's bucket closes predates it a
		// moment later: rank with the bucket's minute well ahead.
		if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 20*time.Second {
			time.Sleep(left + 100*time.Millisecond)
		}
		if n, err := al.Rank(ctx, time.Hour, 10_000); err != nil || n != 3 {
			t.Fatalf("rank: %d keys, %v", n, err)
		}
		code, out := prewarm(t, "--ranking", "stored")
		if code != 0 || !regexp.MustCompile(`ranking +stored, \d+s old, buckets `).MatchString(out) || !strings.Contains(out, "access-log keys read  3") {
			t.Errorf("--ranking stored with a fresh ranking: exit %d\n%s", code, out)
		}
		code, out = prewarm(t, "--ranking", "live")
		if code != 0 || !strings.Contains(out, "ranking               live, buckets ") || strings.Contains(out, "not the stored ranking") {
			t.Errorf("--ranking live: exit %d\n%s", code, out)
		}
	})
}

// TestScheduleRunsDuringSlowPrewarm: a start-up pre-warm that takes long (a
// low prewarm.rate, a large top_n, a slow access log) must not hold the
// schedule off. The schedule opened only after the pre-warm, so with
// prewarm.rate 0.05 (one batch every 20 s) every declared key, written by the
// start-up load, expired 3 s later while the origin was healthy. Now the
// schedule opens after the start-up load and its catch-up; /readyz still
// waits for the pre-warm.
func TestScheduleRunsDuringSlowPrewarm(t *testing.T) {
	rd := testenv.Redis(t)
	c := newCatalogue(t, rd.Client, rd.Prefix, 60, 0, "refresh: {load_timeout: 500ms, batch_size: 2}\nprewarm: {concurrency: 1, rate: 0.05}\n")
	data, err := os.ReadFile(c.config)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.ReplaceAll(string(data), "    ttl: 60s\n", "    ttl: 3s\n    interval: 1s\n")
	if err := os.WriteFile(c.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c.record(t, products(seq(20, 50)...)...)
	p := e2e.Start(t, []string{"run", "--config", c.config})
	url := c.listen(t)
	ctx := context.Background()
	declared := []string{rd.Prefix + "top", rd.Prefix + "product:1"}
	testenv.Eventually(t, 15*time.Second, "declared keys written", func() bool {
		if p.Exited() {
			t.Fatalf("hearth exited:\n%s", p.Output())
		}
		return rd.Client.Exists(ctx, declared...).Val() == int64(len(declared))
	})
	// Three TTLs of polling, all of them within the pre-warm (31 keys in
	// batches of 2 at 0.05 batches/s: over 5 minutes).
	polls, absent := 0, 0
	for end := time.Now().Add(9 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		n, err := rd.Client.Exists(ctx, declared...).Result()
		if err != nil {
			continue
		}
		polls++
		if n != int64(len(declared)) {
			absent++
		}
	}
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	t.Logf("%d of %d polls found a declared key absent; /readyz %d", absent, polls, resp.StatusCode)
	if absent > 0 {
		t.Errorf("%d of %d polls over 9s found a declared key (ttl 3s, interval 1s) absent during the pre-warm", absent, polls)
	}
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz = %d during the pre-warm, want 503", resp.StatusCode)
	}
}
