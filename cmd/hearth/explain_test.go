package main_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// TestValidateExplain is what a new user runs: a 100,000-row products table
// (bigint id, 512-byte payload) and a family query in the cast form is
// flagged by `hearth validate --explain` (exit 4, naming the declaration and
// the typed form) and warned about by `hearth run` at start-up, which keeps
// running; the typed form passes (exit 0).
func TestValidateExplain(t *testing.T) {
	t.Parallel() // its own database, prefix and processes
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `
		CREATE TABLE products (id bigint PRIMARY KEY, payload text NOT NULL);
		INSERT INTO products SELECT i, repeat(md5(i::text), 16) FROM generate_series(1, 100000) i;
		ANALYZE products;`); err != nil {
		t.Fatal(err)
	}
	write := func(query, listen string) string {
		t.Helper()
		cfg := fmt.Sprintf(`
redis:
  addrs: [%q]
  namespace: %q
http:
  listen: %q
sources:
  - name: catalog
    type: postgres
    dsn: %q
keys:
  - name: product
    key: %q
    source: catalog
    ttl: 60s
    param_pattern: "[0-9]{1,12}"
    members: ["1", "2", "3"]
    query: %q
`, rd.Addr, e2e.Namespace(t, rd.Client), listen, pg.DSN, rd.Prefix+"product:{id}", query)
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	cast := write("SELECT id::text, payload FROM products WHERE id::text = ANY($1)", e2e.FreeAddr(t))
	typed := write("SELECT id::text, payload FROM products WHERE id = ANY($1::bigint[])", e2e.FreeAddr(t))

	code, out := runHearth(t, "validate", "--config", cast, "--explain")
	if code != 4 {
		t.Fatalf("cast form: exit %d, want 4\n%s", code, out)
	}
	t.Logf("hearth validate --explain:\n%s", out)
	for _, want := range []string{"keys[product].query: Seq Scan on", "products", "id = ANY($1::bigint[])"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Without declared members the sample is a whole batch (500): the
	// finding's filter still fits a line.
	batch := strings.Replace(cast, "config.yaml", "batch.yaml", 1)
	data, err := os.ReadFile(cast)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(batch, []byte(strings.Replace(string(data), `members: ["1", "2", "3"]`, `members_query: "SELECT id::text FROM products LIMIT 10"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out = runHearth(t, "validate", "--config", batch, "--explain")
	if code != 4 || !strings.Contains(out, "497 more") {
		t.Errorf("a 500-member sample: exit %d, want 4 with the sample shortened\n%s", code, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if len(line) > 600 {
			t.Errorf("a line of %d bytes: %.200s…", len(line), line)
		}
	}
	if code, out := runHearth(t, "validate", "--config", typed, "--explain"); code != 0 || !strings.Contains(out, "query plans: ok") {
		t.Errorf("typed form: exit %d, want 0\n%s", code, out)
	}
	if code, out := runHearth(t, "validate", "--config", cast); code != 0 {
		t.Errorf("without --explain: exit %d, want 0 (the plan is not checked)\n%s", code, out)
	}
	if code, out := runHearth(t, "validate", "--config", cast, "--explain", "--explain-min-rows", "200000"); code != 0 {
		t.Errorf("table below --explain-min-rows: exit %d, want 0\n%s", code, out)
	}

	p := e2e.Start(t, []string{"run", "--config", cast})
	data, _ = os.ReadFile(cast)
	_, rest, _ := strings.Cut(string(data), "listen: \"")
	addr, _, _ := strings.Cut(rest, "\"")
	p.WaitHTTP(t, "http://"+addr+"/readyz", http.StatusOK, 30*time.Second)
	if out := p.Output(); !strings.Contains(out, "query plan: sequential scan") || !strings.Contains(out, `"family":"product"`) {
		t.Errorf("hearth run logged no plan warning for the cast form:\n%s", out)
	}
	if got := rd.Client.Get(ctx, rd.Prefix+"product:2").Val(); got == "" {
		t.Error("hearth run did not warm product:2: the warning must not stop it")
	}
}
