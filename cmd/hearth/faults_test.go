package main_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// faultDaemon is a running `hearth run` and its HTTP address.
type faultDaemon struct {
	*e2e.Proc
	base string
}

// startFaultDaemon writes the config and runs the binary until /readyz answers 200.
func startFaultDaemon(t *testing.T, yaml string, env ...string) *faultDaemon {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "hearth.yaml")
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	listen := e2e.FreeAddr(t)
	p := e2e.Start(t, []string{"run", "--config", cfg, "--listen", listen}, env...)
	d := &faultDaemon{Proc: p, base: "http://" + listen}
	d.WaitHTTP(t, d.base+"/readyz", http.StatusOK, 60*time.Second)
	return d
}

func (d *faultDaemon) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return e2e.Sum(e2e.Metrics(t, d.base+"/metrics"), name, labels...)
}

// redisTrouble sums what the daemon counts when Redis fails it: failed
// writes, and, with leadership on, failed lease renewals, lost leases and a
// standby's failed campaigns.
func (d *faultDaemon) redisTrouble(t *testing.T) float64 {
	t.Helper()
	m := e2e.Metrics(t, d.base+"/metrics")
	return e2e.Sum(m, "hearth_redis_errors_total") +
		e2e.Sum(m, "hearth_lease_renew_duration_seconds_count", `result="error"`) +
		e2e.Sum(m, "hearth_lease_renew_duration_seconds_count", `result="lost"`) +
		e2e.Sum(m, "hearth_leader_transitions_total", `result="expired"`) +
		e2e.Sum(m, "hearth_leader_transitions_total", `result="lost"`) +
		// A fault that finds the daemon standing by (the fault before cost
		// it the lease) shows in its campaign, not in writes or renewals.
		e2e.Sum(m, "hearth_lease_campaign_errors_total")
}

// alive fails the test if the daemon exited or stopped answering /healthz.
func (d *faultDaemon) alive(t *testing.T) {
	t.Helper()
	if d.Exited() {
		t.Fatalf("hearth exited during the fault:\n%s", d.Output())
	}
	d.WaitHTTP(t, d.base+"/healthz", http.StatusOK, 5*time.Second)
}

// stop sends SIGTERM and wants exit code 0.
func (d *faultDaemon) stop(t *testing.T) {
	t.Helper()
	d.Signal(t, syscall.SIGTERM)
	if code := d.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM:\n%s", code, d.Output())
	}
}

func value(c *redis.Client, key string) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c.Get(ctx, key).Val()
}

// genOrigin is an HTTP upstream answering "v<gen>-<member>" at /p/<member>.
type genOrigin struct {
	*httptest.Server
	gen atomic.Int64
}

func newGenOrigin(t *testing.T) *genOrigin {
	t.Helper()
	o := &genOrigin{}
	o.gen.Store(1)
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "v%d-%s", o.gen.Load(), strings.TrimPrefix(r.URL.Path, "/p/"))
	}))
	t.Cleanup(o.Close)
	return o
}

// httpConfig is a daemon config: one family p:{id} (members a, b) from an HTTP
// origin, refreshed every second, Redis commands bounded to 300ms.
func httpConfig(redisAddr, ns, prefix, originURL string) string {
	return fmt.Sprintf(`
redis: {addrs: [%q], namespace: %q, dial_timeout: 300ms, read_timeout: 300ms, write_timeout: 300ms}
log: {level: debug, format: json}
refresh: {negative_ttl: 1s, load_timeout: 500ms, max_stale: 1m}
sources:
  - {name: api, type: http, base_url: %q, timeout: 400ms}
keys:
  - {name: p, key: "%sp:{id}", source: api, ttl: 2s, members: [a, b], path: "/p/{id}"}
`, redisAddr, ns, originURL, prefix)
}

// TestRedisOutage stops, pauses and restarts a Redis of the test's own under
// a running daemon: it never exits, counts the errors, and writes again as
// soon as Redis is back.
func TestRedisOutage(t *testing.T) {
	rs := testenv.PrivateRedis(t)
	rdb := rs.Client(t)
	o := newGenOrigin(t)
	d := startFaultDaemon(t, httpConfig(rs.Addr, "hearth-test", "", o.URL))
	testenv.Eventually(t, 10*time.Second, "p:a written", func() bool { return value(rdb, "p:a") == "v1-a" })

	for _, fault := range []struct {
		name          string
		inject, clear func(testing.TB)
	}{
		{"stopped", rs.Stop, rs.Start},
		{"paused (SIGSTOP)", rs.Pause, rs.Resume},
		{"restarted empty", rs.Restart, func(testing.TB) {}},
	} {
		t.Run(fault.name, func(t *testing.T) {
			before := d.redisTrouble(t)
			fault.inject(t)
			if fault.name != "restarted empty" {
				testenv.Eventually(t, 10*time.Second, "Redis errors counted", func() bool {
					return d.redisTrouble(t) > before
				})
				d.alive(t)
			}
			gen := o.gen.Add(1)
			fault.clear(t)
			want := fmt.Sprintf("v%d-a", gen)
			testenv.Eventually(t, 10*time.Second, "writes resume: p:a = "+want, func() bool { return value(rdb, "p:a") == want })
			d.alive(t)
		})
	}
	d.stop(t)
}

// TestRedisThroughFaultyProxy puts a Toxiproxy proxy between the daemon and the
// shared Redis: latency past the read timeout, cut connections, a black hole.
func TestRedisThroughFaultyProxy(t *testing.T) {
	r := testenv.Redis(t)
	proxy := testenv.NewProxy(t, r.Addr)
	o := newGenOrigin(t)
	d := startFaultDaemon(t, httpConfig(proxy.Addr, e2e.Namespace(t, r.Client), r.Prefix, o.URL))
	key := r.Prefix + "p:a"
	testenv.Eventually(t, 10*time.Second, "p:a written", func() bool { return value(r.Client, key) == "v1-a" })

	for _, fault := range []struct {
		name   string
		inject func(testing.TB)
	}{
		{"latency 600ms", func(t testing.TB) { proxy.SetLatency(t, 600*time.Millisecond) }},
		{"connections cut", proxy.Cut},
		{"black hole", proxy.Timeout},
	} {
		t.Run(fault.name, func(t *testing.T) {
			before := d.redisTrouble(t)
			fault.inject(t)
			testenv.Eventually(t, 10*time.Second, "Redis errors counted", func() bool {
				return d.redisTrouble(t) > before
			})
			d.alive(t)
			gen := o.gen.Add(1)
			proxy.Restore(t)
			want := fmt.Sprintf("v%d-a", gen)
			testenv.Eventually(t, 10*time.Second, "writes resume: p:a = "+want, func() bool { return value(r.Client, key) == want })
		})
	}
	d.stop(t)
}

// TestPostgresThroughFaultyProxy black-holes and cuts the daemon's connections
// to PostgreSQL: values stay readable and untouched (stale extensions), calls
// time out and are retried, the breaker opens; once restored, refreshes resume
// and the breaker closes.
func TestPostgresThroughFaultyProxy(t *testing.T) {
	r := testenv.Redis(t)
	pg := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `CREATE TABLE items (id text PRIMARY KEY, body text NOT NULL);
		INSERT INTO items VALUES ('1', 'one-1'), ('2', 'two-1')`); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr
	d := startFaultDaemon(t, fmt.Sprintf(`
redis: {addrs: [%q], namespace: %q}
log: {level: debug, format: json}
refresh: {negative_ttl: 1s, max_stale: 1m}
sources:
  - name: db
    type: postgres
    dsn: %q
    attempt_timeout: 300ms
    retries: 1
    retry_backoff: 50ms
    breaker: {failures: 3, open_for: 1s}
keys:
  - {name: item, key: "%sitem:{id}", source: db, ttl: 3s, load_timeout: 1s, members: ["1", "2"],
     query: "SELECT id, body FROM items WHERE id = ANY($1)"}
`, r.Addr, e2e.Namespace(t, r.Client), u.String(), r.Prefix))
	key := r.Prefix + "item:1"
	testenv.Eventually(t, 10*time.Second, "item:1 written", func() bool { return value(r.Client, key) == "one-1" })

	for i, fault := range []struct {
		name   string
		inject func(testing.TB)
	}{
		{"black hole", proxy.Timeout},
		{"connections cut", proxy.Cut},
	} {
		t.Run(fault.name, func(t *testing.T) {
			extended := d.metric(t, "hearth_stale_extensions_total", `family="item"`)
			fault.inject(t)
			old := fmt.Sprintf("one-%d", i+1)
			sawOpen := false
			testenv.Eventually(t, 15*time.Second, "stale extensions counted and the breaker open", func() bool {
				if got := value(r.Client, key); got != old {
					t.Fatalf("%s = %q during the fault, want %q untouched", key, got, old)
				}
				m := e2e.Metrics(t, d.base+"/metrics")
				sawOpen = sawOpen || e2e.Sum(m, "hearth_origin_breaker_state", `source="db"`) == 2
				return sawOpen && e2e.Sum(m, "hearth_stale_extensions_total", `family="item"`) >= extended+4
			})
			if got := d.metric(t, "hearth_origin_retries_total", `source="db"`); got < 1 {
				t.Errorf("hearth_origin_retries_total{source=db} = %g, want >= 1", got)
			}
			d.alive(t)
			next := fmt.Sprintf("one-%d", i+2)
			if _, err := pg.Pool.Exec(ctx, `UPDATE items SET body = $1 WHERE id = '1'`, next); err != nil {
				t.Fatal(err)
			}
			proxy.Restore(t)
			testenv.Eventually(t, 15*time.Second, "refreshes resume: item:1 = "+next, func() bool { return value(r.Client, key) == next })
			testenv.Eventually(t, 10*time.Second, "the breaker closes", func() bool {
				return d.metric(t, "hearth_origin_breaker_state", `source="db"`) == 0
			})
		})
	}
	d.stop(t)
}

// TestHTTPUpstreamFaults: an origin answering 500, 404, too slowly and with
// garbage, member by member; the good member is written, the missing one gets
// the sentinel, the others keep their old values, each counted by reason.
func TestHTTPUpstreamFaults(t *testing.T) {
	r := testenv.Redis(t)
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		calls.Add(1)
		switch strings.TrimPrefix(req.URL.Path, "/p/") {
		case "five":
			http.Error(w, "boom", http.StatusInternalServerError)
		case "gone":
			http.NotFound(w, req)
		case "slow":
			select {
			case <-time.After(2 * time.Second):
			case <-req.Context().Done():
			}
			_, _ = io.WriteString(w, `{"v": "late"}`)
		case "junk":
			_, _ = io.WriteString(w, "\x00\x01<html>")
		default:
			_, _ = io.WriteString(w, `{"v": "good"}`)
		}
	}))
	defer up.Close()
	p := r.Prefix
	for _, m := range []string{"five", "slow", "junk", "gone"} {
		if err := r.Client.Set(context.Background(), p+"p:"+m, "old", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	d := startFaultDaemon(t, fmt.Sprintf(`
redis: {addrs: [%q], namespace: %q}
log: {level: debug, format: json}
refresh: {negative_ttl: 1s, load_timeout: 900ms, max_stale: 1m}
sources:
  - {name: api, type: http, base_url: %q, timeout: 300ms, retries: 1, retry_backoff: 20ms}
keys:
  - {name: p, key: "%sp:{id}", source: api, ttl: 3s, members: [ok, five, gone, slow, junk], path: "/p/{id}", json_pointer: /v}
`, r.Addr, e2e.Namespace(t, r.Client), up.URL, p))
	testenv.Eventually(t, 10*time.Second, "every reason counted", func() bool {
		m := e2e.Metrics(t, d.base+"/metrics")
		for _, reason := range []string{"origin", "timeout", "bad_payload"} {
			if e2e.Sum(m, "hearth_load_failures_total", `family="p"`, `reason="`+reason+`"`) < 1 {
				return false
			}
		}
		return true
	})
	for k, want := range map[string]string{"ok": "good", "gone": "", "five": "old", "slow": "old", "junk": "old"} {
		if got, err := r.Client.Get(context.Background(), p+"p:"+k).Result(); err != nil || got != want {
			t.Errorf("p:%s = %q (%v), want %q", k, got, err, want)
		}
	}
	if got := d.metric(t, "hearth_origin_retries_total", `source="api"`); got < 1 {
		t.Errorf("hearth_origin_retries_total = %g, want >= 1 (the 500 and the timeout retried)", got)
	}
	if got := d.metric(t, "hearth_origin_breaker_state", `source="api"`); got != 0 {
		t.Errorf("breaker state %g: two failing members in five must not open it", got)
	}
	out := d.Output()
	for _, want := range []string{
		`p:junk from api: keys[p].json_pointer \"/v\": bad payload: body is not JSON`,
		`p:five from api: origin error: origin unavailable: HTTP 500`,
		`p:slow from api: origin error: `,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log does not name the bad input %q", want)
		}
	}
	d.alive(t)
	d.stop(t)
}
