package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/leadertest"
	"github.com/hearth-dev/hearth/internal/prewarmtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/store"
)

// blueGreen is a serving ("blue") Redis written by a Hearth leader and an
// empty "green" one (two private servers), with a config whose
// origin is a postgres table (version 10 of every row) and whose access log
// lives in a second source, so that the origin can be made unreachable while
// the access log is read.
type blueGreen struct {
	srv, gsrv    *testenv.RedisServer
	slow         bool // configs pace the pre-warm: batches of 2, 4 a second
	onGreen      bool // configs name green (db 1) and turn the start-up pre-warm off: a daemon's
	blue, green  *redis.Client
	from         redis.UniversalClient // what checkCopied compares green with (default blue)
	ns, dir      string
	pgDSN        string
	pg           *testenv.PostgresEnv
	blueURL      string
	greenURL     string
	itemVTTL     time.Duration
	itemKeys     []string // bg:item:1..20
	sentinelKey  string   // bg:item:21, a not-found sentinel in blue
	undeclared   string   // bg:other:1, in blue and in the access log, declared nowhere
	blueVersions map[string]int64
}

const bgItems = 20

func newBlueGreen(t *testing.T) *blueGreen {
	t.Helper()
	srv, gsrv := testenv.PrivateRedis(t), testenv.PrivateRedis(t)
	b := &blueGreen{srv: srv, gsrv: gsrv, blue: srv.Client(t), pg: testenv.Postgres(t),
		blueURL: fmt.Sprintf("redis://%s/0", srv.Addr), greenURL: fmt.Sprintf("redis://%s/1", gsrv.Addr),
		// jitter 0.2 on 10m: the longest value TTL is 11m, records live twice that.
		itemVTTL: 22 * time.Minute, sentinelKey: "bg:item:21", undeclared: "bg:other:1", blueVersions: map[string]int64{}}
	b.green = redis.NewClient(&redis.Options{Addr: gsrv.Addr, DB: 1})
	b.from = b.blue
	t.Cleanup(func() { b.green.Close() })
	b.ns = e2e.Namespace(t, b.blue)
	b.pgDSN = b.pg.DSN
	b.dir = t.TempDir()
	ctx := context.Background()
	if _, err := b.pg.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE items (id bigint PRIMARY KEY, v text NOT NULL, ver bigint NOT NULL);
		INSERT INTO items SELECT i, 'old' || i, 10 FROM generate_series(1, %d) i`, bgItems)); err != nil {
		t.Fatal(err)
	}
	if code, out := runHearth(t, "migrate", "up", "--config", b.config(t, b.pgDSN)); code != 0 {
		t.Fatalf("hearth migrate up: exit %d\n%s", code, out)
	}
	for i := 1; i <= bgItems; i++ {
		b.itemKeys = append(b.itemKeys, fmt.Sprintf("bg:item:%d", i))
	}
	logged := append(append([]string{}, b.itemKeys...), b.sentinelKey, b.undeclared, "bg:item:{id}")
	hits := make([]int64, len(logged))
	for i := range hits {
		hits[i] = int64(1000 - i)
	}
	if _, err := b.pg.Pool.Exec(ctx, accesslog.RecordSQL, time.Now().Truncate(time.Minute), logged, hits); err != nil {
		t.Fatal(err)
	}

	// Blue's leader wrote version 50 of every item (newer than the origin
	// this test's pre-warm could read), a sentinel for item 21, and the
	// single key; and someone else wrote an undeclared key.
	in := leadertest.On(t, b.blue, b.ns).Instance(time.Minute, 50*time.Millisecond, false)
	term := leadertest.Campaign(t, in.Lease, 5*time.Second)
	lw := in.Store.Writer(term)
	var entries []store.Entry
	for i, k := range b.itemKeys {
		// TTLs spread over 5..9 minutes, as a leader's jittered writes are.
		ttl := 5*time.Minute + time.Duration(i)*12*time.Second
		entries = append(entries, store.Entry{Key: k, Value: []byte(fmt.Sprintf("v50-%d-%s", i+1, strings.Repeat("x", i))), TTL: ttl,
			Seq: int64(100 + i), Versioned: true, Version: 50, VersionTTL: b.itemVTTL, Family: "item"})
		b.blueVersions[k] = 50
	}
	entries = append(entries,
		store.Entry{Key: b.sentinelKey, Value: []byte{}, TTL: 40 * time.Second, Seq: 200, VersionTTL: b.itemVTTL, Family: "item"},
		store.Entry{Key: "bg:top", Value: []byte("top-blue"), TTL: 7 * time.Minute})
	if err := lw.Set(ctx, entries); err != nil {
		t.Fatal(err)
	}
	if err := b.blue.Set(ctx, b.undeclared, "not hearth's", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	return b
}

// config writes a config whose origin is dsn; the access log is readable.
func (b *blueGreen) config(t *testing.T, dsn string) string {
	t.Helper()
	return b.configLog(t, dsn, b.pg.DSN)
}

// configLog writes a config whose origin is dsn and whose access log is in logDSN.
func (b *blueGreen) configLog(t *testing.T, dsn, logDSN string) string {
	t.Helper()
	path := filepath.Join(b.dir, fmt.Sprintf("config-%d.yaml", time.Now().UnixNano()))
	pace, batch, rdb := "", "", fmt.Sprintf("{addrs: [%q], namespace: %q}", b.srv.Addr, b.ns)
	if b.slow {
		pace, batch = "prewarm: {rate: 4, concurrency: 1}", "batch_size: 2"
	}
	if b.onGreen {
		pace, rdb = "prewarm: {enabled: false}", fmt.Sprintf("{addrs: [%q], db: 1, namespace: %q}", b.gsrv.Addr, b.ns)
	}
	if err := os.WriteFile(path, []byte(fmt.Sprintf(`
redis: %s
log: {level: warn, format: json}
sources:
  - {name: db, type: postgres, dsn: %q}
  - {name: logs, type: postgres, dsn: %q}
access_log: {source: logs}
%s
keys:
  - name: top
    key: "bg:top"
    source: db
    ttl: 10m
    query: "SELECT 'top-origin'"
  - name: item
    key: "bg:item:{id}"
    source: db
    ttl: 10m
    negative_ttl: 1m
    param_pattern: "[0-9]{1,9}"
    members: ["1"]
    version_column: ver
    %s
    query: "SELECT id::text, v, ver FROM items WHERE id = ANY($1::bigint[])"
`, rdb, dsn, logDSN, pace, batch)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// closedDSN is an origin nothing listens on.
func (b *blueGreen) closedDSN(t *testing.T) string {
	return "postgres://root@" + e2e.FreeAddr(t) + "/test?connect_timeout=2"
}

func wantSummary(t *testing.T, out string, lines ...string) {
	t.Helper()
	for _, want := range lines {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}

// checkCopied checks every key of keys in green against blue: the same bytes,
// and a remaining TTL no longer than blue's (blue's is read first, so it can
// only have shrunk by the time green's is read).
func (b *blueGreen) checkCopied(t *testing.T, keys []string) {
	t.Helper()
	ctx := context.Background()
	for _, k := range keys {
		bv, err := b.from.Get(ctx, k).Result()
		if err != nil {
			t.Fatalf("blue %s: %v", k, err)
		}
		gv, err := b.green.Get(ctx, k).Result()
		if err != nil {
			t.Errorf("green %s: %v, want blue's value", k, err)
			continue
		}
		if gv != bv {
			t.Errorf("green %s = %q, blue holds %q", k, gv, bv)
		}
		if err := prewarmtest.NoLaterExpiry(ctx, b.green, b.from, k); err != nil {
			t.Error(err)
		}
	}
}

// TestPrewarmFromOnlyOriginDown: with the origin unreachable, `hearth prewarm
// --from blue --from-only` copies every wanted key (the declared single key,
// the access log's items and the sentinel) byte for byte with TTLs never past
// blue's, skips the undeclared and hostile access-log keys, and the version
// records travel: green's first leader cannot replace a copied version 50
// with the origin's version 10.
func TestPrewarmFromOnlyOriginDown(t *testing.T) {
	t.Parallel()
	b := newBlueGreen(t)
	ctx := context.Background()
	down := b.config(t, b.closedDSN(t))
	// Without --from-only the origin is needed: it cannot be opened.
	if code, out := runHearth(t, "prewarm", "--config", down, "--redis", b.greenURL, "--from", b.blueURL, "--top", "100"); code != 1 {
		t.Fatalf("--from with the origin down and without --from-only: exit %d, want 1\n%s", code, out)
	}
	code, out := runHearth(t, "prewarm", "--config", down, "--redis", b.greenURL, "--from", b.blueURL, "--from-only", "--top", "100")
	if code != 0 {
		t.Fatalf("exit %d, want 0\n%s", code, out)
	}
	wantSummary(t, out, "wanted                22", "copied                22 (with version record 20)", "loaded from origin    0",
		"negative              1", "failed                0", "skipped               2 (invalid_member 1, unknown 1)",
		"coverage              100.000%")
	b.checkCopied(t, append([]string{"bg:top", b.sentinelKey}, b.itemKeys...))
	if n := b.green.Exists(ctx, b.undeclared).Val(); n != 0 {
		t.Errorf("green holds the undeclared %s", b.undeclared)
	}
	for _, k := range b.itemKeys {
		rec, err := b.green.Get(ctx, store.VersionKey(b.ns, k)).Result()
		if err != nil {
			t.Fatalf("green's version record of %s: %v", k, err)
		}
		if v, ok := store.ParseVersionRecord(rec); !ok || v != 50 {
			t.Errorf("green's version record of %s = %q, want version 50", k, rec)
		}
	}

	// Green's first leader loads an older row (version 10) of item 1: refused.
	in := leadertest.On(t, b.green, b.ns).Instance(time.Minute, 50*time.Millisecond, false)
	term := leadertest.Campaign(t, in.Lease, 5*time.Second)
	before := b.green.Get(ctx, b.itemKeys[0]).Val()
	if err := in.Store.Writer(term).Set(ctx, []store.Entry{{Key: b.itemKeys[0], Value: []byte("old1"), TTL: 10 * time.Minute,
		Seq: 1, Versioned: true, Version: 10, VersionTTL: b.itemVTTL, Family: "item"}}); err != nil {
		t.Fatal(err)
	}
	if got := b.green.Get(ctx, b.itemKeys[0]).Val(); got != before {
		t.Errorf("%s = %q after green's leader wrote version 10, want the copied version 50 %q", b.itemKeys[0], got, before)
	}
}

// TestPrewarmFromMixed: keys blue lacks are loaded from the origin, counted
// apart from the copied; the copied ones are blue's values, not the origin's.
func TestPrewarmFromMixed(t *testing.T) {
	t.Parallel()
	b := newBlueGreen(t)
	ctx := context.Background()
	if err := b.blue.Del(ctx, b.itemKeys[10:]...).Err(); err != nil {
		t.Fatal(err)
	}
	code, out := runHearth(t, "prewarm", "--config", b.config(t, b.pgDSN), "--redis", b.greenURL, "--from", b.blueURL, "--top", "100")
	if code != 0 {
		t.Fatalf("exit %d, want 0\n%s", code, out)
	}
	wantSummary(t, out, "wanted                22", "copied                12 (with version record 10)", "loaded from origin    10",
		"not in source         10", "failed                0", "coverage              100.000%")
	b.checkCopied(t, append([]string{"bg:top", b.sentinelKey}, b.itemKeys[:10]...))
	for i, k := range b.itemKeys[10:] {
		if got, want := b.green.Get(ctx, k).Val(), fmt.Sprintf("old%d", i+11); got != want {
			t.Errorf("green %s = %q, want the origin's %q", k, got, want)
		}
		// Loaded from the origin into a green Redis with no leader yet: the
		// row's version is recorded too.
		if v, ok := store.ParseVersionRecord(b.green.Get(ctx, store.VersionKey(b.ns, k)).Val()); !ok || v != 10 {
			t.Errorf("green's record of %s: version %d (ok %v), want the origin's 10", k, v, ok)
		}
	}
}

// TestPrewarmFromForeign: a source key of another type, one without a TTL
// and an undeclared one are never copied; the first two are counted by
// reason and, with --from-only, fail the coverage (exit 3).
func TestPrewarmFromForeign(t *testing.T) {
	t.Parallel()
	b := newBlueGreen(t)
	ctx := context.Background()
	b.blue.Del(ctx, b.itemKeys[2])
	b.blue.HSet(ctx, b.itemKeys[2], "f", "v")
	b.blue.Persist(ctx, b.itemKeys[3])
	// A planted record claiming version 99 for item 5, which its value does
	// not back: the value is copied, the version is not.
	b.blue.Set(ctx, store.VersionKey(b.ns, b.itemKeys[4]), "1:1:"+store.EncodeVersion(99)+":"+strings.Repeat("ab", 20), time.Hour)
	code, out := runHearth(t, "prewarm", "--config", b.config(t, b.closedDSN(t)), "--redis", b.greenURL, "--from", b.blueURL, "--from-only", "--top", "100")
	if code != 3 {
		t.Fatalf("exit %d, want 3 (two keys could not be copied)\n%s", code, out)
	}
	wantSummary(t, out, "copied                20", "not in source         2 (skipped no_ttl 1, wrong_type 1)", "failed                2")
	for _, k := range []string{b.itemKeys[2], b.itemKeys[3], b.undeclared} {
		if n := b.green.Exists(ctx, k).Val(); n != 0 {
			t.Errorf("green holds %s, which was not Hearth's in blue", k)
		}
	}
	b.checkCopied(t, b.itemKeys[4:])
	wantSummary(t, out, "(with version record 17)")
	if v, ok := store.ParseVersionRecord(b.green.Get(ctx, store.VersionKey(b.ns, b.itemKeys[4])).Val()); ok {
		t.Errorf("green's record of %s carries version %d from a record its value did not back", b.itemKeys[4], v)
	}
}

// TestPrewarmFromScanWithoutAccessLog: origin and access log both
// unreachable, `--from-only` selects the keys by a SCAN of blue under each
// family's template: every item and the sentinel are copied, a key of blue
// that fails the member rules is skipped and counted, an undeclared one is
// never looked at.
func TestPrewarmFromScanWithoutAccessLog(t *testing.T) {
	t.Parallel()
	b := newBlueGreen(t)
	ctx := context.Background()
	b.blue.Set(ctx, "bg:item:x1", "planted", time.Hour) // fails param_pattern
	closed := b.closedDSN(t)
	code, out := runHearth(t, "prewarm", "--config", b.configLog(t, closed, closed), "--redis", b.greenURL, "--from", b.blueURL, "--from-only", "--top", "100")
	if code != 0 {
		t.Fatalf("exit %d, want 0\n%s", code, out)
	}
	wantSummary(t, out, "selection             scan of the source", "wanted                22", "copied                22 (with version record 20)",
		"skipped               1 (invalid_member 1)", "coverage              100.000%")
	b.checkCopied(t, append([]string{"bg:top", b.sentinelKey}, b.itemKeys...))
	for _, k := range []string{"bg:item:x1", b.undeclared} {
		if n := b.green.Exists(ctx, k).Val(); n != 0 {
			t.Errorf("green holds %s", k)
		}
	}
}

// summaryCount reads one count line of the summary ("copied   22 (...)" -> 22).
func summaryCount(t *testing.T, out, name string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(name) + ` +(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("summary has no %q count:\n%s", name, out)
	}
	var n int
	fmt.Sscan(m[1], &n)
	return n
}

// greenItems is how many of the wanted keys green holds.
func (b *blueGreen) greenItems(t *testing.T) int {
	n := 0
	for _, k := range append([]string{"bg:top", b.sentinelKey}, b.itemKeys...) {
		n += int(b.green.Exists(context.Background(), k).Val())
	}
	return n
}

// TestPrewarmFromFencedMidCopy: a leader takes green over while the copy runs
// (green already held a leader's epoch counter, so the copy writes fenced):
// its fence refuses every later write of the copy, counted as fenced, exit 3;
// what was written before stays, and nothing lands after.
func TestPrewarmFromFencedMidCopy(t *testing.T) {
	t.Parallel()
	b := newBlueGreen(t)
	b.slow = true
	ctx := context.Background()
	if err := b.green.Set(ctx, b.ns+":{lease}:epoch", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	p := e2e.Start(t, []string{"prewarm", "--config", b.config(t, b.closedDSN(t)), "--redis", b.greenURL, "--from", b.blueURL, "--from-only", "--top", "100"})
	testenv.Eventually(t, 20*time.Second, "the copy has written a few keys", func() bool { return b.greenItems(t) >= 4 })
	in := leadertest.On(t, b.green, b.ns).Instance(time.Minute, 50*time.Millisecond, false)
	leadertest.Campaign(t, in.Lease, 5*time.Second)
	atTakeover := b.greenItems(t)
	code := p.Wait(t, 30*time.Second)
	out := p.Output()
	if code != 3 {
		t.Fatalf("exit %d, want 3 (the leader's fence refused the rest)\n%s", code, out)
	}
	copied, fenced := summaryCount(t, out, "copied"), 0
	if m := regexp.MustCompile(`failed +(\d+) \(fenced (\d+)\)`).FindStringSubmatch(out); m != nil {
		fmt.Sscan(m[2], &fenced)
	}
	if fenced == 0 || copied+fenced != 22 {
		t.Errorf("copied %d + fenced %d, want 22 with some fenced:\n%s", copied, fenced, out)
	}
	got := b.greenItems(t)
	if got != copied {
		t.Errorf("green holds %d of the wanted keys, the summary says %d copied", got, copied)
	}
	// A write or two may have been in flight when the leader took over.
	if got > atTakeover+2 {
		t.Errorf("green held %d keys at the takeover and %d after: the copy wrote past the fence", atTakeover, got)
	}
}

// TestPrewarmFromSourceDies: blue dies mid-copy: the run ends with exit 3
// and the error named, and what was copied stays in green.
func TestPrewarmFromSourceDies(t *testing.T) {
	t.Parallel()
	b := newBlueGreen(t)
	b.slow = true
	p := e2e.Start(t, []string{"prewarm", "--config", b.config(t, b.closedDSN(t)), "--redis", b.greenURL, "--from", b.blueURL, "--from-only", "--top", "100"})
	testenv.Eventually(t, 20*time.Second, "the copy has written a few keys", func() bool { return b.greenItems(t) >= 4 })
	b.srv.Kill(t)
	t.Cleanup(func() { b.srv.Start(t) }) // for the namespace's cleanup, which runs after
	code := p.Wait(t, 60*time.Second)
	out := p.Output()
	if code != 3 {
		t.Fatalf("exit %d, want 3\n%s", code, out)
	}
	wantSummary(t, out, "error                 ", "from the source redis")
	copied := summaryCount(t, out, "copied")
	if copied < 4 || copied >= 22 {
		t.Errorf("copied %d, want some but not all", copied)
	}
	if got := b.greenItems(t); got != copied {
		t.Errorf("green holds %d of the wanted keys after blue died, the summary says %d copied", got, copied)
	}
}

// TestPrewarmFromCluster: the source is a Redis Cluster (redis+cluster://,
// as --redis takes), filled by an origin pre-warm: --from-only copies every
// key with its record from the masters that hold them, and, with the access
// log down too, finds them by a SCAN of every master.
func TestPrewarmFromCluster(t *testing.T) {
	t.Parallel()
	b := newBlueGreen(t)
	cl := testenv.RedisCluster(t)
	cc := cl.Client(t)
	b.from = cc
	clusterURL := "redis+cluster://" + strings.Join(cl.Addrs()[:2], ",")
	if code, out := runHearth(t, "prewarm", "--config", b.config(t, b.pgDSN), "--redis", clusterURL, "--top", "100"); code != 0 {
		t.Fatalf("filling the cluster from the origin: exit %d\n%s", code, out)
	}
	closed := b.closedDSN(t)
	for _, tc := range []struct{ name, config, want string }{
		{"access log", b.config(t, closed), "access-log keys read"},
		{"scan", b.configLog(t, closed, closed), "selection             scan of the source"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := b.green.FlushDB(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			code, out := runHearth(t, "prewarm", "--config", tc.config, "--redis", b.greenURL, "--from", clusterURL, "--from-only", "--top", "100")
			if code != 0 {
				t.Fatalf("exit %d, want 0\n%s", code, out)
			}
			wantSummary(t, out, tc.want, "wanted                22", "copied                22 (with version record 20)", "negative              1", "coverage              100.000%")
			b.checkCopied(t, append([]string{"bg:top", b.sentinelKey}, b.itemKeys...))
		})
	}
}

// TestPrewarmFromSentinel: the source is named by its Sentinels
// (redis+sentinel://, as --redis takes), filled by an origin pre-warm through
// the same URL: --from-only asks the Sentinels for the master and copies every
// key with its record from it, with the origin closed.
func TestPrewarmFromSentinel(t *testing.T) {
	t.Parallel()
	b := newBlueGreen(t)
	s := testenv.RedisSentinel(t)
	master := s.CurrentMaster(t)
	b.from = master.Client(t)
	sentinelURL := "redis+sentinel://" + strings.Join(s.SentinelAddrs(), ",") + "/" + testenv.SentinelMaster
	if code, out := runHearth(t, "prewarm", "--config", b.config(t, b.pgDSN), "--redis", sentinelURL, "--top", "100"); code != 0 {
		t.Fatalf("filling the sentinel master from the origin: exit %d\n%s", code, out)
	}
	code, out := runHearth(t, "prewarm", "--config", b.config(t, b.closedDSN(t)), "--redis", b.greenURL, "--from", sentinelURL, "--from-only", "--top", "100")
	if code != 0 {
		t.Fatalf("exit %d, want 0\n%s", code, out)
	}
	wantSummary(t, out, "access-log keys read", "wanted                22", "copied                22 (with version record 20)", "negative              1", "coverage              100.000%")
	b.checkCopied(t, append([]string{"bg:top", b.sentinelKey}, b.itemKeys...))
}

// TestAdminPrewarmFrom: a leader running on green, asked through the admin
// API to pre-warm from blue with from_only, copies blue's values and version
// records with no origin load, leaves alone the keys it wrote itself (its
// start-up load of the declared ones), and answers a bad request with a
// clear 4xx naming the field and no password.
func TestAdminPrewarmFrom(t *testing.T) {
	t.Parallel()
	b := newBlueGreen(t)
	b.onGreen = true
	ctx := context.Background()
	d := startDaemonPath(t, b.config(t, b.pgDSN), "HEARTH_ADMIN_TOKEN="+adminToken)
	bearer := "Bearer " + adminToken
	// The leader's start-up load wrote the declared keys from the origin.
	own := map[string]string{"bg:top": "top-origin", b.itemKeys[0]: "old1"}
	for k, v := range own {
		if got := b.green.Get(ctx, k).Val(); got != v {
			t.Fatalf("green %s = %q after the start-up load, want the origin's %q", k, got, v)
		}
	}
	post := func(body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("POST", d.URL+"/admin/prewarm", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", bearer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	for _, c := range []struct {
		body, want string
		code       int
	}{
		{`{"from": "redis://:hunter2@127.0.0.1:notaport/0"}`, `from: parse`, http.StatusUnprocessableEntity},
		{`{"from": "redis://:hunter2@` + e2e.FreeAddr(t) + `/0"}`, `from: redis `, http.StatusUnprocessableEntity},
		{`{"from_only": true}`, `from_only: needs from`, http.StatusUnprocessableEntity},
		{`{"form": "redis://x"}`, `unknown field \"form\"`, http.StatusBadRequest},
	} {
		code, body := post(c.body)
		if code != c.code || !strings.Contains(body, c.want) || strings.Contains(body, "hunter2") {
			t.Errorf("POST %s: %d %s, want %d naming %s without the password", c.body, code, body, c.code, c.want)
		}
	}

	loads := d.metric(t, "hearth_origin_load_duration_seconds_count")
	if code, body := post(fmt.Sprintf(`{"from": %q, "from_only": true}`, b.blueURL)); code != http.StatusAccepted {
		t.Fatalf("POST /admin/prewarm from blue: %d %s, want 202", code, body)
	}
	var st struct {
		Running bool `json:"running"`
		Report  *struct {
			From       string  `json:"from"`
			Wanted     int     `json:"wanted"`
			Copied     int     `json:"copied"`
			Records    int     `json:"records_copied"`
			Present    int     `json:"present"`
			FromOrigin int     `json:"from_origin"`
			Failed     int     `json:"failed"`
			Coverage   float64 `json:"coverage"`
		} `json:"report"`
	}
	var body string
	testenv.Eventually(t, 30*time.Second, "the admin copy finishes", func() bool {
		var code int
		code, body = call(t, "GET", d.URL+"/admin/prewarm", bearer)
		st.Report = nil
		return code == http.StatusOK && json.Unmarshal([]byte(body), &st) == nil && !st.Running && st.Report != nil && st.Report.From != ""
	})
	// Wanted: top, items 1..20 and the sentinel; the leader's two are present.
	if r := st.Report; r.Wanted != 22 || r.Copied != 20 || r.Records != 20 || r.Present != 2 || r.FromOrigin != 0 || r.Failed != 0 || r.Coverage != 1 {
		t.Errorf("GET /admin/prewarm = %s, want 22 wanted: 20 copied (20 carried their record, item 1's to a present key), 2 present, none from the origin", body)
	}
	if got := d.metric(t, "hearth_origin_load_duration_seconds_count") - loads; got != 0 {
		t.Errorf("the copy made %g origin loads, want 0", got)
	}
	for k, v := range own {
		if got := b.green.Get(ctx, k).Val(); got != v {
			t.Errorf("green %s = %q after the copy, want the leader's %q: a copy never overwrites", k, got, v)
		}
	}
	b.checkCopied(t, append([]string{b.sentinelKey}, b.itemKeys[1:]...))
	for _, k := range b.itemKeys[1:] {
		rec, err := b.green.Get(ctx, store.VersionKey(b.ns, k)).Result()
		if v, ok := store.ParseVersionRecord(rec); err != nil || !ok || v != 50 {
			t.Errorf("green's version record of %s = %q (%v), want version 50", k, rec, err)
		}
	}
}
