package main_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// TestFreshnessAsANewUser follows docs/freshness.md with the built binary:
// the README's example table, `hearth migrate up`, `hearth notify-sql` piped
// into the database, `hearth run`; then an UPDATE, a DELETE and a re-INSERT
// reach Redis by notification (the schedule's interval is 30 s, far longer
// than the test waits).
func TestFreshnessAsANewUser(t *testing.T) {
	t.Parallel()
	rd := testenv.Redis(t)
	pg := testenv.Postgres(t)
	ctx := context.Background()
	example, err := os.ReadFile("../../examples/products.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Pool.Exec(ctx, string(example)); err != nil {
		t.Fatal(err)
	}
	channel := "hearth_e2e_" + strconv.FormatUint(rand.Uint64()%1e12, 10)
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
sources:
  - name: catalog
    type: postgres
    dsn: %q
keys:
  - name: product
    key: "%sproduct:{id}"
    source: catalog
    ttl: 60s
    param_pattern: "[0-9]{1,12}"
    members_query: "SELECT id::text FROM products ORDER BY id"
    query: >-
      SELECT id::text, json_build_object('id', id, 'name', name, 'price_cents', price_cents)::text, updated_at
      FROM products WHERE id = ANY($1::bigint[])
    version_column: updated_at
    notify:
      channel: %s
`, rd.Addr, e2e.Namespace(t, rd.Client), listen, pg.DSN, p, channel))

	if out, err := exec.Command(e2e.Binary(t), "migrate", "up", "--source", "catalog", "--config", cfg).CombinedOutput(); err != nil {
		t.Fatalf("migrate up: %v\n%s", err, out)
	}
	sql, err := exec.Command(e2e.Binary(t), "notify-sql", "product", "--table", "products", "--config", cfg).Output()
	if err != nil {
		t.Fatalf("notify-sql: %v", err)
	}
	if _, err := pg.Pool.Exec(ctx, string(sql)); err != nil {
		t.Fatalf("the printed SQL: %v\n%s", err, sql)
	}

	proc := e2e.Start(t, []string{"run", "--config", cfg})
	proc.WaitHTTP(t, "http://"+listen+"/readyz", http.StatusOK, 30*time.Second)
	metrics := "http://" + listen + "/metrics"
	testenv.Eventually(t, 20*time.Second, "the listener connected", func() bool {
		return e2e.Sum(e2e.Metrics(t, metrics), "hearth_change_listen_connected") == 1
	})
	get := func(id int) (string, bool) {
		v, err := rd.Client.Get(ctx, p+"product:"+strconv.Itoa(id)).Result()
		return v, err == nil
	}
	if v, _ := get(7); !strings.Contains(v, `"product 7"`) {
		t.Fatalf("product:7 = %q before the update", v)
	}
	exec := func(q string) {
		t.Helper()
		if _, err := pg.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	exec(`UPDATE products SET name = 'renamed', updated_at = now() WHERE id = 7`)
	testenv.Eventually(t, 10*time.Second, "the update in Redis", func() bool {
		v, _ := get(7)
		return strings.Contains(v, `"renamed"`)
	})
	exec(`DELETE FROM products WHERE id = 8`)
	testenv.Eventually(t, 10*time.Second, "the sentinel for the deleted row", func() bool {
		v, ok := get(8)
		return ok && v == ""
	})
	exec(`INSERT INTO products (id, name, price_cents) VALUES (8, 'back again', 5)`)
	testenv.Eventually(t, 10*time.Second, "the re-inserted row in Redis", func() bool {
		v, _ := get(8)
		return strings.Contains(v, `"back again"`)
	})
	// Three changes, each waited for: the first may be merged into the
	// session's opening full refresh if that was still pending, the other
	// two are member refreshes of their own.
	m := e2e.Metrics(t, metrics)
	if got := e2e.Sum(m, "hearth_change_refreshes_total", `kind="members"`); got < 2 {
		t.Errorf("change-driven refreshes %v, want at least 2", got)
	}
	if got := e2e.Sum(m, "hearth_change_lag_seconds_count"); got < 2 {
		t.Errorf("change lag observations %v, want at least 2", got)
	}

	// A reload that moves the declaration to another channel: the listener
	// follows it, and its new session refreshes the family in full once.
	data, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	moved := channel + "_moved"
	fulls := e2e.Sum(e2e.Metrics(t, metrics), "hearth_change_refreshes_total", `kind="full"`)
	if err := os.WriteFile(cfg, []byte(strings.Replace(string(data), "channel: "+channel, "channel: "+moved, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	proc.Signal(t, syscall.SIGHUP)
	testenv.Eventually(t, 20*time.Second, "the listener restarted on the new channel", func() bool {
		m := e2e.Metrics(t, metrics)
		return e2e.Sum(m, "hearth_change_refreshes_total", `kind="full"`) > fulls &&
			e2e.Sum(m, "hearth_change_listen_connected") == 1
	})
	exec(`UPDATE products SET name = 'heard on the moved channel', updated_at = now() WHERE id = 9`)
	exec(`SELECT pg_notify('` + moved + `', '{"hearth":1,"ts":0,"ids":["9"]}')`)
	testenv.Eventually(t, 10*time.Second, "the change named on the moved channel heard and in Redis", func() bool {
		v, _ := get(9)
		return strings.Contains(v, `"heard on the moved channel"`) &&
			e2e.Sum(e2e.Metrics(t, metrics), "hearth_change_notifications_total", `channel="`+moved+`"`, `result="ok"`) == 1
	})
	proc.Signal(t, syscall.SIGTERM)
	if code := proc.Wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, proc.Output())
	}
}
