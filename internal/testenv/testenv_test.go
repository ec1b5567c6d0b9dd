package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// fakeTB records Fatalf and Skipf instead of stopping the test.
type fakeTB struct {
	testing.TB
	fatal, skip string
}

func (f *fakeTB) Helper()                           {}
func (f *fakeTB) Fatalf(format string, args ...any) { f.fatal = fmt.Sprintf(format, args...) }
func (f *fakeTB) Skipf(format string, args ...any)  { f.skip = fmt.Sprintf(format, args...) }

func TestRequireServer(t *testing.T) {
	t.Setenv("CI", "true")
	f := &fakeTB{TB: t}
	testenv.RequireServer(f, "no redis: %s", "boom")
	if f.skip != "" || !strings.Contains(f.fatal, "no redis: boom") {
		t.Fatalf("CI=true: fatal %q, skip %q; want a fatal with the reason", f.fatal, f.skip)
	}

	// CI=true wins over HEARTH_ALLOW_SKIP.
	t.Setenv("HEARTH_ALLOW_SKIP", "1")
	f = &fakeTB{TB: t}
	testenv.RequireServer(f, "no redis: %s", "boom")
	if f.skip != "" || !strings.Contains(f.fatal, "no redis: boom") {
		t.Fatalf("CI=true, HEARTH_ALLOW_SKIP=1: fatal %q, skip %q; want a fatal", f.fatal, f.skip)
	}

	// Outside CI, a missing server still fails unless a skip is asked for.
	t.Setenv("CI", "")
	t.Setenv("HEARTH_ALLOW_SKIP", "")
	f = &fakeTB{TB: t}
	testenv.RequireServer(f, "no redis: %s", "boom")
	if f.skip != "" || !strings.Contains(f.fatal, "no redis: boom") || !strings.Contains(f.fatal, "HEARTH_ALLOW_SKIP=1") {
		t.Fatalf("CI unset: fatal %q, skip %q; want a fatal naming HEARTH_ALLOW_SKIP", f.fatal, f.skip)
	}

	t.Setenv("HEARTH_ALLOW_SKIP", "1")
	f = &fakeTB{TB: t}
	testenv.RequireServer(f, "no redis: %s", "boom")
	if f.fatal != "" || !strings.Contains(f.skip, "no redis: boom") {
		t.Fatalf("HEARTH_ALLOW_SKIP=1: fatal %q, skip %q; want a skip with the reason", f.fatal, f.skip)
	}
}

func TestFreePort(t *testing.T) {
	t.Parallel()
	a, b := testenv.FreePort(t), testenv.FreePort(t)
	if a == b {
		t.Fatalf("two calls returned the same port %d", a)
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", a))
	if err != nil {
		t.Fatalf("port %d from FreePort is not free: %v", a, err)
	}
	l.Close()
}

func TestRedisPrefixIsolationAndCleanup(t *testing.T) {
	t.Parallel()
	outer := testenv.Redis(t)
	ctx := ctxT(t)
	if err := outer.Client.Set(ctx, outer.Prefix+"keep", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}

	var inner string
	t.Run("inner", func(t *testing.T) {
		env := testenv.Redis(t)
		inner = env.Prefix
		if env.Prefix == outer.Prefix || strings.HasPrefix(env.Prefix, outer.Prefix) || strings.HasPrefix(outer.Prefix, env.Prefix) {
			t.Fatalf("prefixes overlap: %q and %q", env.Prefix, outer.Prefix)
		}
		if !strings.HasPrefix(env.Prefix, "t:") || !strings.HasSuffix(env.Prefix, ":") {
			t.Fatalf("prefix %q is not of the form t:<name>:<random>:", env.Prefix)
		}
		for i := range 50 {
			if err := env.Client.Set(ctx, fmt.Sprintf("%sk%d", env.Prefix, i), i, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		// Keys whose names contain glob characters are ordinary keys under
		// the prefix.
		if err := env.Client.Set(ctx, env.Prefix+"*[x]?", "glob", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if n := countKeys(t, env.Client, env.Prefix); n != 51 {
			t.Fatalf("inner env sees %d keys under its prefix, want 51", n)
		}
		if n := countKeys(t, env.Client, outer.Prefix); n != 1 {
			t.Fatalf("outer prefix has %d keys, want 1", n)
		}
	})

	if n := countKeys(t, outer.Client, inner); n != 0 {
		t.Fatalf("%d keys left under %q after cleanup", n, inner)
	}
	if v, err := outer.Client.Get(ctx, outer.Prefix+"keep").Result(); err != nil || v != "1" {
		t.Fatalf("outer key after inner cleanup: %q, %v; want it untouched", v, err)
	}
}

// countKeys counts the keys that start with prefix, without glob matching.
func countKeys(t *testing.T, c *redis.Client, prefix string) int {
	t.Helper()
	n := 0
	iter := c.Scan(ctxT(t), 0, "", 1000).Iterator()
	for iter.Next(ctxT(t)) {
		if strings.HasPrefix(iter.Val(), prefix) {
			n++
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

func runID(t *testing.T, c *redis.Client) string {
	t.Helper()
	info, err := c.Info(ctxT(t), "server").Result()
	if err != nil {
		t.Fatalf("info server: %v", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return v
		}
	}
	t.Fatalf("no run_id in INFO server:\n%s", info)
	return ""
}

func TestPrivateRedisStopStartRestart(t *testing.T) {
	t.Parallel()
	s := testenv.PrivateRedis(t)
	c := s.Client(t)
	ctx := ctxT(t)
	if want := fmt.Sprintf("127.0.0.1:%d", s.Port); s.Addr != want {
		t.Fatalf("Addr %q, want %q", s.Addr, want)
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	id1 := runID(t, c)
	port := s.Port

	s.Stop(t)
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("ping succeeded on a stopped server")
	}
	s.Stop(t) // stopping twice is harmless

	s.Start(t)
	if s.Port != port {
		t.Fatalf("port changed from %d to %d", port, s.Port)
	}
	id2 := runID(t, c)
	if id2 == id1 {
		t.Fatal("run_id did not change across stop and start")
	}

	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Restart(t)
	if s.Port != port {
		t.Fatalf("port changed from %d to %d", port, s.Port)
	}
	if id3 := runID(t, c); id3 == id2 || id3 == id1 {
		t.Fatal("run_id did not change across restart")
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("exists after restart: %d, %v; want empty data", n, err)
	}
}

func TestPrivateRedisPauseResume(t *testing.T) {
	t.Parallel()
	s := testenv.PrivateRedis(t)
	c := redis.NewClient(&redis.Options{
		Addr:         s.Addr,
		DialTimeout:  200 * time.Millisecond,
		ReadTimeout:  200 * time.Millisecond,
		WriteTimeout: 200 * time.Millisecond,
		MaxRetries:   -1,
	})
	t.Cleanup(func() { c.Close() })
	ctx := ctxT(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	s.Pause(t)
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("ping answered by a paused server")
	}

	s.Resume(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping after resume: %v", err)
	}
	// Stop works on a paused server too (cleanup relies on it).
	s.Pause(t)
	s.Stop(t)
}

func TestPostgresSchemaIsolation(t *testing.T) {
	t.Parallel()
	a, b := testenv.Postgres(t), testenv.Postgres(t)
	ctx := ctxT(t)
	if a.Schema == b.Schema {
		t.Fatalf("two envs got the same schema %q", a.Schema)
	}
	if !strings.Contains(a.DSN, "search_path="+a.Schema) {
		t.Fatalf("DSN %q lacks search_path=%s", a.DSN, a.Schema)
	}

	for _, env := range []*testenv.PostgresEnv{a, b} {
		var sp, cur string
		if err := env.Pool.QueryRow(ctx, "SELECT current_setting('search_path'), current_schema()").Scan(&sp, &cur); err != nil {
			t.Fatal(err)
		}
		if sp != env.Schema || cur != env.Schema {
			t.Fatalf("search_path %q, current_schema %q; want %q", sp, cur, env.Schema)
		}
	}

	// An unqualified table lands in the env's schema and is not visible from
	// the other env.
	if _, err := a.Pool.Exec(ctx, "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	var where string
	if err := a.Pool.QueryRow(ctx, "SELECT table_schema FROM information_schema.tables WHERE table_name = 'items' AND table_schema = $1", a.Schema).Scan(&where); err != nil {
		t.Fatalf("items is not in schema %s: %v", a.Schema, err)
	}
	var reg *string
	if err := b.Pool.QueryRow(ctx, "SELECT to_regclass('items')::text").Scan(&reg); err != nil {
		t.Fatal(err)
	}
	if reg != nil {
		t.Fatalf("env b sees env a's table as %q", *reg)
	}
	if _, err := b.Pool.Exec(ctx, "CREATE TABLE items (id int PRIMARY KEY)"); err != nil {
		t.Fatalf("env b cannot create its own items: %v", err)
	}

	// The DSN works on its own, with a plain pgx connection.
	conn, err := pgx.Connect(ctx, a.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n); err != nil || n != 1 {
		t.Fatalf("count(*) from items via DSN: %d, %v; want 1", n, err)
	}
}

func TestPostgresSchemaDroppedAtCleanup(t *testing.T) {
	t.Parallel()
	outer := testenv.Postgres(t)
	var schema string
	t.Run("inner", func(t *testing.T) {
		env := testenv.Postgres(t)
		schema = env.Schema
		if _, err := env.Pool.Exec(ctxT(t), "CREATE TABLE t (x int)"); err != nil {
			t.Fatal(err)
		}
	})
	var n int
	if err := outer.Pool.QueryRow(ctxT(t), "SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("schema %s still exists after cleanup", schema)
	}
}

func TestPrivatePostgresStopStart(t *testing.T) {
	t.Parallel()
	s := testenv.PrivatePostgres(t)
	ctx := ctxT(t)
	wantDSN := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/test?sslmode=disable", s.Port)
	if s.DSN() != wantDSN {
		t.Fatalf("DSN %q, want %q", s.DSN(), wantDSN)
	}
	exec := func(sql string) error {
		conn, err := pgx.Connect(ctx, s.DSN()+"&connect_timeout=2")
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec("CREATE TABLE kept (x int); INSERT INTO kept VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	port := s.Port

	s.Stop(t)
	if err := exec("SELECT 1"); err == nil {
		t.Fatal("query succeeded on a stopped server")
	}
	s.Start(t)
	if s.Port != port {
		t.Fatalf("port changed from %d to %d", port, s.Port)
	}
	if err := exec("SELECT x FROM kept"); err != nil {
		t.Fatalf("data lost across stop and start: %v", err)
	}
	s.Stop(t)
	s.Start(t)
	if err := exec("SELECT 1"); err != nil {
		t.Fatal(err)
	}
}

// echoServer echoes every connection's bytes back until it closes.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

// roundTrip sends msg on c and reads it back, with a deadline.
func roundTrip(c net.Conn, msg string, timeout time.Duration) error {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return fmt.Errorf("echo %q, want %q", buf, msg)
	}
	return nil
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestProxyPassesTrafficAndAddsLatency(t *testing.T) {
	t.Parallel()
	p := testenv.NewProxy(t, echoServer(t))
	c := dial(t, p.Addr)
	if err := roundTrip(c, "hello", 5*time.Second); err != nil {
		t.Fatalf("through proxy: %v", err)
	}

	const d = 50 * time.Millisecond
	p.SetLatency(t, d)
	// Both directions are delayed, on the existing connection and new ones.
	for _, conn := range []net.Conn{c, dial(t, p.Addr)} {
		start := time.Now()
		if err := roundTrip(conn, "slow", 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if rtt := time.Since(start); rtt < 2*d {
			t.Fatalf("round trip took %v with latency %v each way; want at least %v", rtt, d, 2*d)
		} else {
			t.Logf("round trip with %v latency each way: %v", d, rtt)
		}
	}

	// Setting it again replaces it.
	p.SetLatency(t, 2*d)
	start := time.Now()
	if err := roundTrip(c, "slower", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 4*d {
		t.Fatalf("round trip took %v with latency %v each way; want at least %v", rtt, 2*d, 4*d)
	}

	p.Restore(t)
	if err := roundTrip(c, "fast again", 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestProxyCutAndRestore(t *testing.T) {
	t.Parallel()
	p := testenv.NewProxy(t, echoServer(t))
	c := dial(t, p.Addr)
	if err := roundTrip(c, "before", 5*time.Second); err != nil {
		t.Fatal(err)
	}

	p.Cut(t)
	if err := roundTrip(c, "during", 5*time.Second); err == nil {
		t.Fatal("existing connection still works after Cut")
	} else if isTimeout(err) {
		t.Fatalf("existing connection hung after Cut instead of closing: %v", err)
	}
	if nc, err := net.DialTimeout("tcp", p.Addr, 2*time.Second); err == nil {
		err = roundTrip(nc, "new", 2*time.Second)
		nc.Close()
		if err == nil || isTimeout(err) {
			t.Fatalf("new connection during Cut: %v; want refused or closed at once", err)
		}
	}

	p.Restore(t)
	if err := roundTrip(dial(t, p.Addr), "after", 5*time.Second); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
}

func TestProxyTimeoutAndRestore(t *testing.T) {
	t.Parallel()
	p := testenv.NewProxy(t, echoServer(t))
	old := dial(t, p.Addr)
	if err := roundTrip(old, "before", 5*time.Second); err != nil {
		t.Fatal(err)
	}

	p.Timeout(t)
	for _, c := range []net.Conn{old, dial(t, p.Addr)} {
		err := roundTrip(c, "lost", 300*time.Millisecond)
		if !isTimeout(err) {
			t.Fatalf("round trip through black hole: %v; want a timeout", err)
		}
	}

	// Cut then Timeout: the proxy listens again but delivers nothing.
	p.Cut(t)
	p.Timeout(t)
	if err := roundTrip(dial(t, p.Addr), "lost", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("round trip through black hole after cut: %v; want a timeout", err)
	}

	p.Restore(t)
	if err := roundTrip(dial(t, p.Addr), "after", 5*time.Second); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
}

func TestProxyBandwidthReplyLatencyAndResets(t *testing.T) {
	t.Parallel()
	p := testenv.NewProxy(t, echoServer(t))
	c := dial(t, p.Addr)

	// 20 KB at 10 KB/s each way: at least a second or so.
	p.SetBandwidth(t, 10)
	msg := strings.Repeat("x", 20<<10)
	start := time.Now()
	if err := roundTrip(c, msg, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 1500*time.Millisecond {
		t.Fatalf("20 KB at 10 KB/s took %v; want at least 1.5s", rtt)
	}
	p.Restore(t)

	// Replies only: one delay per round trip, not two.
	const d = 100 * time.Millisecond
	p.SetReplyLatency(t, d)
	start = time.Now()
	if err := roundTrip(c, "late", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < d {
		t.Fatalf("round trip took %v with %v on the replies; want at least %v", rtt, d, d)
	}
	p.Restore(t)

	p.ResetPeers(t)
	for _, conn := range []net.Conn{c, dial(t, p.Addr)} {
		if err := roundTrip(conn, "reset", 2*time.Second); err == nil || isTimeout(err) {
			t.Fatalf("round trip with resets: %v; want the connection reset at once", err)
		}
	}
	p.Restore(t)
	if err := roundTrip(dial(t, p.Addr), "after", 5*time.Second); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
}

// TestProxyRedis checks the proxy with a real client: a cut fails commands on
// pooled connections, and they work again after Restore.
func TestProxyRedis(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	p := testenv.NewProxy(t, env.Addr)
	c := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1, ReadTimeout: time.Second, DialTimeout: time.Second})
	t.Cleanup(func() { c.Close() })
	ctx := ctxT(t)
	if err := c.Set(ctx, env.Prefix+"k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	p.Cut(t)
	if err := c.Get(ctx, env.Prefix+"k").Err(); err == nil {
		t.Fatal("get through a cut proxy succeeded")
	}
	p.Restore(t)
	if v, err := c.Get(ctx, env.Prefix+"k").Result(); err != nil || v != "v" {
		t.Fatalf("get after restore: %q, %v", v, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
