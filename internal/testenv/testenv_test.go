package testenv_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

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

	t.Setenv("CI", "")
	f = &fakeTB{TB: t}
	testenv.RequireServer(f, "no redis: %s", "boom")
	if f.fatal != "" || !strings.Contains(f.skip, "no redis: boom") {
		t.Fatalf("CI unset: fatal %q, skip %q; want a skip with the reason", f.fatal, f.skip)
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
