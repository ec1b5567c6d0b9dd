package main_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestKeysStayWarm runs the binary against real Redis and PostgreSQL and an HTTP
// upstream for more than three TTLs while polling every declared key: none may
// be missing at any moment after ready, and every TTL stays within its jittered
// bounds.
func TestKeysStayWarm(t *testing.T) {
	t.Parallel()
	rd := testenv.Redis(t)
	pg := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `
		CREATE TABLE items (id int PRIMARY KEY, body text NOT NULL);
		INSERT INTO items SELECT i, 'item-' || i FROM generate_series(1, 300) i;`); err != nil {
		t.Fatal(err)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/health":
			w.WriteHeader(http.StatusNoContent)
		case strings.HasPrefix(r.URL.Path, "/rates/"):
			fmt.Fprintf(w, `{"rate": {"value": "%s-1.08"}}`, strings.TrimPrefix(r.URL.Path, "/rates/"))
		case r.URL.Path == "/banner":
			_, _ = w.Write([]byte("hello\x00world"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer upstream.Close()

	listen := e2e.FreeAddr(t)
	p := rd.Prefix
	cfg := writeConfig(t, fmt.Sprintf(`
redis:
  addrs: [%q]
  namespace: %q
http:
  listen: %q
log:
  format: json
  level: debug
refresh:
  batch_size: 100
  load_timeout: 500ms
  spread: 0.3
  shutdown_timeout: 5s
sources:
  - name: db
    type: postgres
    dsn: %q
  - name: rates
    type: http
    base_url: %q
    health_path: /health
    timeout: 1s
keys:
  - name: top
    key: "%stop"
    source: db
    ttl: 3s
    query: "SELECT string_agg(body, ',' ORDER BY id) FROM (SELECT * FROM items ORDER BY id LIMIT 3) t"
  - name: items
    key: "%sitem:{id}"
    source: db
    ttl: 3s
    param_pattern: "[0-9]+"
    members_query: "SELECT id::text FROM items"
    query: "SELECT id::text, body FROM items WHERE id::text = ANY($1)"
  - name: rate
    key: "%srate:{cur}"
    source: rates
    ttl: 3s
    members: [eur, usd, gbp]
    path: "/rates/{cur}"
    json_pointer: /rate/value
  - name: banner
    key: "%sbanner"
    source: rates
    ttl: 3s
    path: /banner
`, rd.Addr, e2e.Namespace(t, rd.Client), listen, pg.DSN, upstream.URL, p, p, p, p))

	var keys []string
	keys = append(keys, p+"top", p+"banner")
	for i := 1; i <= 300; i++ {
		keys = append(keys, fmt.Sprintf("%sitem:%d", p, i))
	}
	for _, c := range []string{"eur", "usd", "gbp"} {
		keys = append(keys, p+"rate:"+c)
	}

	proc := e2e.Start(t, []string{"run", "--config", cfg})
	proc.WaitHTTP(t, "http://"+listen+"/readyz", http.StatusOK, 20*time.Second)
	ready := time.Now()

	// Poll every key continuously for more than three TTLs.
	const ttl = 3 * time.Second
	maxTTL := ttl * 11 / 10
	var (
		mu       sync.Mutex
		problems []string
		polls    int
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			pipe := rd.Client.Pipeline()
			cmds := make([]*redis.DurationCmd, len(keys))
			for i, k := range keys {
				cmds[i] = pipe.PTTL(ctx, k)
			}
			if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
				mu.Lock()
				problems = append(problems, "poll: "+err.Error())
				mu.Unlock()
				return
			}
			mu.Lock()
			polls++
			for i, c := range cmds {
				switch d := c.Val(); {
				case d == -2: // go-redis reports a missing key as -2
					problems = append(problems, fmt.Sprintf("%s missing at +%s", keys[i], time.Since(ready).Round(time.Millisecond)))
				case d < 0:
					problems = append(problems, fmt.Sprintf("%s has no TTL", keys[i]))
				case d > maxTTL:
					problems = append(problems, fmt.Sprintf("%s PTTL %s above the jittered maximum %s", keys[i], d, maxTTL))
				}
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()

	// A row updated in PostgreSQL reaches Redis within one interval.
	time.Sleep(ttl)
	if _, err := pg.Pool.Exec(ctx, `UPDATE items SET body = 'changed' WHERE id = 42`); err != nil {
		t.Fatal(err)
	}
	updated := time.Now()
	interval := ttl / 2
	for {
		if v, _ := rd.Client.Get(ctx, p+"item:42").Result(); v == "changed" {
			t.Logf("update reached Redis after %s (interval %s)", time.Since(updated).Round(time.Millisecond), interval)
			break
		}
		if time.Since(updated) > interval+time.Second {
			t.Fatalf("update not in Redis %s after the UPDATE (interval %s)", time.Since(updated), interval)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for time.Since(ready) < 3*ttl+500*time.Millisecond {
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	<-done

	mu.Lock()
	if len(problems) > 0 {
		t.Errorf("%d problems over %d polls, first ones:\n%s", len(problems), polls, strings.Join(problems[:min(10, len(problems))], "\n"))
	}
	t.Logf("%d polls of %d keys over %s", polls, len(keys), time.Since(ready).Round(time.Millisecond))
	mu.Unlock()

	if got, want := rd.Client.Get(ctx, p+"rate:usd").Val(), "usd-1.08"; got != want {
		t.Errorf("rate:usd = %q, want the JSON pointer's string %q", got, want)
	}
	if got, want := rd.Client.Get(ctx, p+"banner").Val(), "hello\x00world"; got != want {
		t.Errorf("banner = %q, want the body byte for byte %q", got, want)
	}

	m := e2e.Metrics(t, "http://"+listen+"/metrics")
	for _, fam := range []string{"top", "items", "rate", "banner"} {
		if got := e2e.Sum(m, "hearth_refresh_runs_total", `family="`+fam+`"`, `result="ok"`); got < 4 {
			t.Errorf("hearth_refresh_runs_total{family=%q,result=ok} = %g, want ≥ 4 over 3 TTLs", fam, got)
		}
	}
	if got := e2e.Sum(m, "hearth_keys_written_total", `family="items"`, `kind="value"`); got < 4*300 {
		t.Errorf("keys written for items = %g, want ≥ %d", got, 4*300)
	}
	if got := e2e.Sum(m, "hearth_schedule_lag_seconds_count", `family="items"`); got < 3 {
		t.Errorf("schedule lag observations = %g, want ≥ 3", got)
	}
	if got := e2e.Sum(m, "hearth_origin_load_duration_seconds_count", `source="db"`); got == 0 {
		t.Error("no origin load durations recorded for source db")
	}
	if got := e2e.Sum(m, "hearth_last_success_timestamp_seconds", `family="items"`); got < float64(ready.Unix()) {
		t.Errorf("last success = %g, want after ready (%d)", got, ready.Unix())
	}

	proc.Signal(t, syscall.SIGTERM)
	if code := proc.Wait(t, 8*time.Second); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}
	if out := proc.Output(); !strings.Contains(out, `"stopped"`) {
		t.Errorf("no clean stop in the log:\n%s", out)
	}
}

func TestStartupFailures(t *testing.T) {
	closed := e2e.FreeAddr(t) // nothing listens there
	base := `
http:
  listen: 127.0.0.1:0
sources:
  - name: catalog
    type: postgres
    dsn: %s
keys:
  - name: top
    key: "top"
    source: catalog
    ttl: 60s
    query: "SELECT 1"
`
	rd := testenv.Redis(t)
	pg := testenv.Postgres(t)
	cases := []struct {
		name, redis, dsn string
		code             int
		want             string
	}{
		{"redis unreachable", closed, pg.DSN, 1, "redis " + closed + " unreachable"},
		{"source unreachable", rd.Addr, "postgres://app:hunter2secret@" + closed + "/test?connect_timeout=2", 1, "source catalog unreachable"},
		{"bad config", rd.Addr, "postgres://app:hunter2secret@" + closed + "/test", 2, "keys[top].ttl"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			body := fmt.Sprintf("redis:\n  addrs: [%q]\n  password: hunter2secret\n", c.redis) + fmt.Sprintf(base, c.dsn)
			if c.code == 2 {
				body = strings.Replace(body, "ttl: 60s", "ttl: 0s", 1)
			}
			proc := e2e.Start(t, []string{"run", "--config", writeConfig(t, body)})
			if got := proc.Wait(t, 20*time.Second); got != c.code {
				t.Errorf("exit code = %d, want %d\n%s", got, c.code, proc.Output())
			}
			out := proc.Output()
			if !strings.Contains(out, c.want) {
				t.Errorf("output does not name the problem %q:\n%s", c.want, out)
			}
			if strings.Contains(out, "hunter2secret") {
				t.Errorf("output leaks a password:\n%s", out)
			}
		})
	}
}

func TestValidateAndVersion(t *testing.T) {
	t.Parallel() // no server: its own processes
	good := e2e.Start(t, []string{"validate", "--config", "../../config.yaml"})
	if code := good.Wait(t, 10*time.Second); code != 0 {
		t.Errorf("validate config.yaml exit %d:\n%s", code, good.Output())
	}
	if out := good.Output(); strings.Contains(out, "warning:") {
		t.Errorf("the shipped config.yaml draws a warning:\n%s", out)
	}
	slow := filepath.Join(t.TempDir(), "slow-breaker.yaml")
	if err := os.WriteFile(slow, []byte(`
sources: [{name: db, type: postgres, dsn: "postgres://u@127.0.0.1/test", breaker: {probe_interval: 30s}}]
keys: [{name: quick, key: quick, source: db, ttl: 20s, query: SELECT 1}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	warned := e2e.Start(t, []string{"validate", "--config", slow})
	if code := warned.Wait(t, 10*time.Second); code != 0 {
		t.Errorf("validate with a slow breaker exit %d, want 0 (a warning, not an error):\n%s", code, warned.Output())
	}
	if out := warned.Output(); !strings.Contains(out, "warning: sources[db].breaker.probe_interval: the origin's return is noticed after up to 30s, longer than the refresh interval 10s of keys[quick]") {
		t.Errorf("validate did not warn of the slow breaker:\n%s", out)
	}
	// A family needing more than half the stated write capacity is warned of.
	heavy := e2e.Start(t, []string{"validate", "--config", slow, "--capacity", "0.1"})
	if code := heavy.Wait(t, 10*time.Second); code != 0 {
		t.Errorf("validate --capacity 0.1 exit %d, want 0 (a warning, not an error):\n%s", code, heavy.Output())
	}
	if out := heavy.Output(); !strings.Contains(out, "warning: keys[quick]: 1 members every 10s need 0.1 key writes/s, over 50% of the write capacity 0.1 keys/s") {
		t.Errorf("validate --capacity 0.1 did not warn of the write rate:\n%s", out)
	}
	if out := warned.Output(); strings.Contains(out, "key writes/s") {
		t.Errorf("validate at the default capacity warned of a 0.1 keys/s declaration:\n%s", out)
	}
	badCap := e2e.Start(t, []string{"validate", "--config", slow, "--capacity", "0"})
	if code := badCap.Wait(t, 10*time.Second); code != 2 {
		t.Errorf("validate --capacity 0 exit %d, want 2:\n%s", code, badCap.Output())
	}
	bad := e2e.Start(t, []string{"validate", "--config", "../../config/testdata/invalid-overlap.yaml"})
	if code := bad.Wait(t, 10*time.Second); code != 2 {
		t.Errorf("validate invalid exit %d, want 2", code)
	}
	if out := bad.Output(); !strings.Contains(out, "overlaps") {
		t.Errorf("validate output does not explain: %s", out)
	}
	v := e2e.Start(t, []string{"version"})
	if code := v.Wait(t, 10*time.Second); code != 0 || !strings.Contains(v.Output(), "go1.") {
		t.Errorf("version exit %d: %s", code, v.Output())
	}
}
