package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// TestNoGoroutineOutlivesShutdown runs the daemon in process against real
// Redis, PostgreSQL and an HTTP origin, stops it as SIGTERM would, and checks
// that every goroutine it started has ended: scheduler, sources, pools, HTTP.
func TestNoGoroutineOutlivesShutdown(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
	r := testenv.Redis(t)
	pg := testenv.Postgres(t)
	if _, err := pg.Pool.Exec(context.Background(), `CREATE TABLE items (id text PRIMARY KEY, body text NOT NULL);
		INSERT INTO items VALUES ('1', 'one'), ('2', 'two')`); err != nil {
		t.Fatal(err)
	}
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "v"+r.URL.Path)
	}))
	defer origin.Close()
	listen := e2e.FreeAddr(t)
	cfg := filepath.Join(t.TempDir(), "hearth.yaml")
	yaml := fmt.Sprintf(`
redis: {addrs: [%q], namespace: %q}
http: {listen: %q}
log: {level: debug, format: json}
refresh: {negative_ttl: 1s}
sources:
  - {name: db, type: postgres, dsn: %q}
  - {name: api, type: http, base_url: %q, timeout: 1s}
keys:
  - {name: item, key: "%sitem:{id}", source: db, ttl: 2s, load_timeout: 500ms,
     members: ["1", "2", "3"], query: "SELECT id, body FROM items WHERE id = ANY($1)"}
  - {name: page, key: "%spage:{id}", source: api, ttl: 2s, load_timeout: 500ms, members: [a, b], path: "/p/{id}"}
`, r.Addr, e2e.Namespace(t, r.Client), listen, pg.DSN, origin.URL, r.Prefix, r.Prefix)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var (
		wg   sync.WaitGroup
		code int
		out  = &testenv.SyncBuffer{}
	)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon output:\n%s", out)
		}
	})
	wg.Go(func() { code = run(ctx, []string{"run", "--config", cfg}, io.Discard, out) })
	e2e.WaitHTTP(t, "http://"+listen+"/readyz", http.StatusOK, 20*time.Second)
	// Let a few scheduled refreshes and negative re-checks run.
	deadline := time.Now().Add(10 * time.Second)
	for r.Client.Get(ctx, r.Prefix+"page:a").Val() != "v/p/a" || time.Now().Before(deadline.Add(-8*time.Second)) {
		if time.Now().After(deadline) {
			t.Fatal("keys not written")
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	wg.Wait()
	if code != 0 {
		t.Fatalf("run exited %d", code)
	}
}
