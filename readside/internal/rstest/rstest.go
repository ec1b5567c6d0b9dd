// Package rstest is the read side's test harness: a test's isolated view of
// the shared Redis, polling, a log sink and metric reads. It is a trimmed
// copy of the daemon's internal/testenv and internal/promtest, which this
// module cannot import (they are the daemon module's internal packages, and
// importing them would pull the daemon's dependencies into every
// application's module graph).
package rstest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
)

// DefaultRedisAddr is the shared Redis server's address, overridden by
// HEARTH_TEST_REDIS_ADDR.
const DefaultRedisAddr = "127.0.0.1:6379"

// RedisAddr is the shared Redis server's address.
func RedisAddr() string {
	if a := os.Getenv("HEARTH_TEST_REDIS_ADDR"); a != "" {
		return a
	}
	return DefaultRedisAddr
}

// RedisEnv is a test's isolated view of the shared Redis server.
type RedisEnv struct {
	// Addr is the server's address, host:port.
	Addr string
	// Prefix is unique to this call; the test puts all its keys under it.
	Prefix string
	// Client is connected to Addr and closed at cleanup.
	Client *redis.Client
}

// Redis returns the shared Redis server and a unique key prefix,
// "t:<sanitised test name>:<random>:", whose keys are deleted at cleanup. A
// server that does not answer fails the test (see RequireServer). The test
// must not flush, stop or pause the server.
func Redis(t testing.TB) *RedisEnv {
	t.Helper()
	addr := RedisAddr()
	c := redis.NewClient(&redis.Options{Addr: addr})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		RequireServer(t, "redis at %s is not reachable: %v", addr, err)
		return nil
	}
	env := &RedisEnv{Addr: addr, Prefix: "t:" + sanitize(t.Name()) + ":" + randomHex(4) + ":", Client: c}
	t.Cleanup(func() {
		if err := deleteKeys(addr, env.Prefix); err != nil {
			t.Errorf("rstest: deleting redis keys under %q: %v", env.Prefix, err)
		}
		_ = c.Close()
	})
	return env
}

// RequireServer fails the test, as the daemon's harness does: a missing
// server must not pass silently as a skip. HEARTH_ALLOW_SKIP=1 (never with
// CI=true) turns the failure into a skip.
func RequireServer(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "true" && os.Getenv("HEARTH_ALLOW_SKIP") == "1" {
		t.Skipf("rstest: %s (skipping: HEARTH_ALLOW_SKIP=1)", msg)
	}
	t.Fatalf("rstest: %s (a missing server is a failure; run `make test`, which starts one, or set HEARTH_ALLOW_SKIP=1 to skip)", msg)
}

// deleteKeys removes every key under prefix with a client of its own.
func deleteKeys(addr, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, escapeGlob(prefix)+"*", 1000).Result()
		if err != nil {
			return fmt.Errorf("scan: %w", err)
		}
		if len(keys) > 0 {
			if err := c.Unlink(ctx, keys...).Err(); err != nil {
				return fmt.Errorf("unlink: %w", err)
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// escapeGlob escapes the characters that are special in Redis glob patterns.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '\\', '*', '?', '[', ']', '^', '-':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// sanitize keeps ASCII letters and digits of s, maps every other run of
// characters to one underscore, and cuts the result to 80 bytes.
func sanitize(s string) string {
	var b strings.Builder
	under := false
	for _, r := range s {
		if (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			under = false
		} else if !under {
			b.WriteByte('_')
			under = true
		}
	}
	out := strings.Trim(b.String(), "_")
	if len(out) > 80 {
		out = out[:80]
	}
	if out == "" {
		out = "x"
	}
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand since Go 1.24)
	return hex.EncodeToString(b)
}

// Eventually polls cond every 20ms until it holds, or fails the test after
// d, naming what it waited for.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SyncBuffer is a log sink a test reads while the cache writes to it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Sum is the value of every series of family name whose labels include each
// given name/value pair, summed: a counter's or gauge's value, a histogram's
// sample count; 0 when none matches.
func Sum(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("labels of %s must be name/value pairs: %v", name, labels)
	}
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i < len(labels); i += 2 {
				if !hasLabel(m, labels[i], labels[i+1]) {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}

// PutList puts a list in place of whatever key held, as another client
// could: a foreign value of the wrong type.
func PutList(c *redis.Client, key string) error {
	ctx := context.Background()
	if err := c.Del(ctx, key).Err(); err != nil {
		return err
	}
	return c.RPush(ctx, key, "x").Err()
}
