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
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// Secrets the daemon is given; none may appear in its output or its metrics.
const (
	pgSecret     = "pg-s3cret-Q7x"
	headerSecret = "hdr-s3cret-Q7x"
	redisSecret  = "redis-s3cret-Q7x"
	wrongSecret  = "wrong-s3cret-Q7x"
	urlSecret    = "url-s3cret-Q7x"
)

var secrets = []string{pgSecret, headerSecret, redisSecret, wrongSecret, urlSecret}

func noSecrets(t *testing.T, where, text string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(text, s) {
			t.Errorf("%s contains the secret %q:\n%s", where, s, text)
		}
	}
	if strings.Contains(text, "s3cret") {
		t.Errorf("%s contains part of a secret:\n%s", where, text)
	}
}

func get(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestSecretsNeverLeak runs the binary with a DSN password, a secret HTTP
// header and a Redis password (a private redis-server with requirepass) in
// every failure mode it can be driven into, and greps everything it printed,
// /metrics and /readyz for the secrets.
func TestSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	rs := testenv.PrivateRedis(t)
	if err := rs.Client(t).ConfigSet(context.Background(), "requirepass", redisSecret).Err(); err != nil {
		t.Fatal(err)
	}
	pg := testenv.Postgres(t)
	if _, err := pg.Pool.Exec(context.Background(), `CREATE TABLE items (id text PRIMARY KEY, body text NOT NULL);
		INSERT INTO items VALUES ('1', 'one')`); err != nil {
		t.Fatal(err)
	}
	pgURL, err := url.Parse(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	pgURL.User = url.UserPassword(pgURL.User.Username(), pgSecret)
	pgProxy := testenv.NewProxy(t, pgURL.Host)
	pgURL.Host = pgProxy.Addr
	dsn := pgURL.String()

	var upMode atomic.Int64 // 0 ok, 1 500, 2 401
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("X-Api-Key") != headerSecret || upMode.Load() == 2:
			http.Error(w, "unauthorized", http.StatusUnauthorized)
		case upMode.Load() == 1:
			http.Error(w, "boom", http.StatusInternalServerError)
		default:
			_, _ = io.WriteString(w, "v")
		}
	}))
	defer up.Close()

	config := func(redisAddr, baseURL string) string {
		return fmt.Sprintf(`
redis: {addrs: [%q], password: "${TEST_REDIS_PASSWORD}", namespace: secrets, dial_timeout: 300ms, read_timeout: 300ms}
log: {level: debug, format: json}
refresh: {negative_ttl: 1s, load_timeout: 500ms}
sources:
  - {name: db, type: postgres, dsn: "${TEST_DSN}", attempt_timeout: 200ms, retries: 1, retry_backoff: 20ms, breaker: {failures: 2, open_for: 500ms}}
  - {name: api, type: http, base_url: %q, timeout: 300ms, headers: {X-Api-Key: "${TEST_API_KEY}"}}
keys:
  - {name: item, key: "item:{id}", source: db, ttl: 2s, members: ["1", "2"], query: "SELECT id, body FROM items WHERE id = ANY($1)"}
  - {name: page, key: "page:{id}", source: api, ttl: 2s, members: [a], path: "/p/{id}"}
`, redisAddr, baseURL)
	}
	write := func(yaml string) string {
		f := filepath.Join(t.TempDir(), "hearth.yaml")
		if err := os.WriteFile(f, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	env := func(redisPass, dsn string) []string {
		return []string{"TEST_REDIS_PASSWORD=" + redisPass, "TEST_DSN=" + dsn, "TEST_API_KEY=" + headerSecret}
	}
	closed := e2e.FreeAddr(t)

	for _, c := range []struct {
		name string
		args []string
		yaml string
		env  []string
		code int
	}{
		{"wrong redis password", []string{"run"}, config(rs.Addr, up.URL), env(wrongSecret, dsn), 1},
		{"redis unreachable", []string{"run"}, config(closed, up.URL), env(redisSecret, dsn), 1},
		{"postgres unreachable", []string{"run"}, config(rs.Addr, up.URL),
			env(redisSecret, strings.Replace(dsn, pgProxy.Addr, closed, 1)), 1},
		{"http origin unreachable", []string{"run"}, config(rs.Addr, "http://"+closed), env(redisSecret, dsn), 1},
		{"unparsable dsn", []string{"validate"}, config(rs.Addr, up.URL),
			env(redisSecret, "postgres://u:"+pgSecret+"@127.0.0.1:notaport/test"), 2},
		{"credentials in an invalid base_url", []string{"validate"}, config(rs.Addr, "ftp://u:"+urlSecret+"@example.com/"),
			env(redisSecret, dsn), 2},
		{"a token in the base_url query, origin unreachable", []string{"run"},
			config(rs.Addr, "http://"+closed+"/v1?api_key="+urlSecret), env(redisSecret, dsn), 1},
		{"a token in an invalid base_url", []string{"validate"}, config(rs.Addr, "ftp://example.com/?api_key="+urlSecret),
			env(redisSecret, dsn), 2},
		{"a password in an unparsable --redis URL", []string{"prewarm", "--redis", "redis://u:" + redisSecret + "@127.0.0.1:notaport/0"},
			config(rs.Addr, up.URL), env(redisSecret, dsn), 2},
		{"a secret in a mistyped field", []string{"validate"},
			strings.Replace(config(rs.Addr, up.URL), "read_timeout: 300ms", "read_timeout: ${TEST_REDIS_PASSWORD}", 1),
			env(redisSecret, dsn), 2},
		{"a secret in a field of the wrong type", []string{"validate"},
			strings.Replace(config(rs.Addr, up.URL), "namespace: secrets", `namespace: secrets, db: "${TEST_API_KEY}"`, 1),
			env(redisSecret, dsn), 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append(c.args, "--config", write(c.yaml))
			if c.args[0] == "run" {
				args = append(args, "--listen", e2e.FreeAddr(t))
			}
			p := e2e.Start(t, args, c.env...)
			if got := p.Wait(t, 60*time.Second); got != c.code {
				t.Errorf("exit code %d, want %d:\n%s", got, c.code, p.Output())
			}
			noSecrets(t, "output", p.Output())
		})
	}

	t.Run("running through origin and redis failures", func(t *testing.T) {
		d := startFaultDaemon(t, config(rs.Addr, up.URL), env(redisSecret, dsn)...)
		for _, fault := range []func(){
			func() { upMode.Store(1) },
			func() { upMode.Store(2) },
			func() { pgProxy.Cut(t) },
			func() { pgProxy.Restore(t); pgProxy.Timeout(t) },
			func() { rs.Pause(t) },
		} {
			before := d.metric(t, "hearth_load_failures_total") + d.redisTrouble(t)
			fault()
			testenv.Eventually(t, 10*time.Second, "the fault counted", func() bool {
				return d.metric(t, "hearth_load_failures_total")+d.redisTrouble(t) > before
			})
		}
		rs.Resume(t)
		pgProxy.Restore(t)
		noSecrets(t, "/metrics", get(t, d.base+"/metrics"))
		noSecrets(t, "/readyz", get(t, d.base+"/readyz"))
		d.stop(t)
		out := d.Output()
		for _, want := range []string{"HTTP 500", "HTTP 401", "origin circuit breaker open"} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q: the failure mode was not reached", want)
			}
		}
		noSecrets(t, "output", out)
	})
}
