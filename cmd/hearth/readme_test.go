package main_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// quickStartMarker precedes the README's quick-start block.
const quickStartMarker = "<!-- quickstart:"

// readmeQuickStart returns the commands of the README's quick-start block: the
// first fenced sh block after the marker.
func readmeQuickStart(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), quickStartMarker)
	if !ok {
		t.Fatalf("README.md has no %q marker before its quick start", quickStartMarker)
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	if !ok {
		t.Fatal("README.md: no ```sh block after the quick-start marker")
	}
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("README.md: the quick-start block does not end")
	}
	return block
}

// TestReadmeQuickStart runs the README's quick start as it is written, in
// bash from the repository's root, against a private PostgreSQL and Redis: the
// variables the README tells users to set (PGHOST, PGPORT, PGUSER,
// REDIS_ADDR) name them, and HEARTH_HTTP_LISTEN (which the README names to move
// the listener) keeps it off a port something else may hold. Every command
// must succeed, and what the README says they print must be what they print.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting for make build's link
	block := readmeQuickStart(t)
	for _, want := range []string{"make build", "createdb", "hearth run", "redis-cli"} {
		if !strings.Contains(block, want) {
			t.Fatalf("the quick start lost %q:\n%s", want, block)
		}
	}
	pg := testenv.PrivatePostgres(t)
	rs := testenv.PrivateRedis(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "hearth.pid")); err == nil {
		t.Fatal("hearth.pid exists in the repository root: another quick start is running")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", block)
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"PGHOST=127.0.0.1", "PGPORT="+strconv.Itoa(pg.Port), "PGUSER=postgres",
		"REDIS_ADDR="+rs.Addr, "HEARTH_HTTP_LISTEN="+e2e.FreeAddr(t),
		// Not a terminal: JSON logs, no progress bar.
		"TERM=dumb",
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// bash and the hearth it starts in the background share a process
	// group: a failed command must not leave hearth running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	runErr := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if runErr != nil {
		t.Fatalf("the README's quick start failed: %v\n%s", runErr, out.String())
	}
	t.Logf("quick start output:\n%s", out.String())

	text := out.String()
	if !strings.Contains(text, `{"id" : 7, "name" : "product 7", "price_cents" : 107}`) {
		t.Errorf("redis-cli get product:7 did not print product 7's JSON:\n%s", text)
	}
	m := regexp.MustCompile(`(?m)^(\d+)$`).FindAllStringSubmatch(text, -1)
	if len(m) == 0 {
		t.Fatalf("no PTTL in the output:\n%s", text)
	}
	if pttl, _ := strconv.Atoi(m[len(m)-1][1]); pttl < 24000 || pttl > 66000 {
		t.Errorf("pttl product:7 = %d ms, want between 24000 and 66000 (TTL 60 s, jitter 0.2)", pttl)
	}
	if !strings.Contains(text, `"message":"stopped"`) {
		t.Errorf("hearth did not stop cleanly:\n%s", text)
	}
	if _, err := os.Stat(filepath.Join(root, "hearth.pid")); err == nil {
		t.Error("hearth.pid left behind: hearth run --pid-file must remove it on exit")
	}

	// What the README promises about isolation: its own database (dropped
	// at the end), Redis database 5 and the namespace quickstart.
	conn, err := pgx.Connect(context.Background(), pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_database WHERE datname = 'hearth_quickstart'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("database hearth_quickstart: %d left (%v), want dropped", n, err)
	}
	db0 := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer db0.Close()
	db5 := redis.NewClient(&redis.Options{Addr: rs.Addr, DB: 5})
	defer db5.Close()
	if keys := db0.Keys(context.Background(), "*").Val(); len(keys) != 0 {
		t.Errorf("Redis database 0 holds %d keys (%.5q): the quick start must keep to database 5", len(keys), keys)
	}
	if got := db5.Exists(context.Background(), "product:7", "top-products:global").Val(); got != 2 {
		t.Errorf("database 5 holds %d of product:7 and top-products:global, want 2", got)
	}
	if own := db5.Keys(context.Background(), "quickstart:*").Val(); len(own) == 0 {
		t.Errorf("no Hearth keys under quickstart: in database 5 (namespace not applied)")
	}
	for _, k := range db5.Keys(context.Background(), "hearth:*").Val() {
		t.Errorf("a key %s in the default namespace: HEARTH_REDIS_NAMESPACE not applied", k)
	}
}
