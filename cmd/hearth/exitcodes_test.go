package main_test

import (
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/e2e"
)

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestExitCodes pins the exit-code contract (docs/commands.md#exit-codes) for
// every subcommand with the built binary: 2 for every usage or config error,
// found before any connection; 1 for a runtime failure; 0 for success. The
// config points at servers that are not there, so a usage error that were
// only found after connecting would exit 1, not 2. No server is needed.
func TestExitCodes(t *testing.T) {
	t.Parallel() // no server: its own processes
	bin := e2e.Binary(t)
	e2e.WithDemo(t, bin) // hearth demo runs it
	dead := closedAddr(t)
	good := writeConfig(t, fmt.Sprintf(`
redis: {addrs: ["%[1]s"], dial_timeout: 500ms}
http: {listen: "127.0.0.1:0"}
sources:
  - {name: db, type: postgres, dsn: "postgres://nobody@%[1]s/none?sslmode=disable&connect_timeout=1"}
access_log: {source: db}
keys:
  - name: item
    key: "item:{id}"
    source: db
    ttl: 60s
    members: ["1"]
    query: "SELECT id::text, body FROM items WHERE id = ANY($1::bigint[])"
    notify: {channel: items}
`, dead))
	bad := writeConfig(t, "redis: {addrs: [\"127.0.0.1:6379\"]}\nkeys:\n  - {name: x, key: x, ttl: 0s}\n")

	cases := []struct {
		args []string
		want int
	}{
		// Success.
		{[]string{"version"}, 0},
		{[]string{"--help"}, 0},
		{[]string{"help", "run"}, 0},
		{[]string{"completion", "bash"}, 0},
		{[]string{"validate", "-c", good}, 0},
		{[]string{"notify-sql", "-c", good, "item", "--table", "items"}, 0},

		// Usage: unknown command, flag or argument, for every command.
		{[]string{"frobnicate"}, 2},
		{[]string{"--bogus"}, 2},
		{[]string{"help", "frobnicate"}, 2},
		{[]string{"run", "--bogus"}, 2},
		{[]string{"run", "extra"}, 2},
		{[]string{"validate", "--bogus"}, 2},
		{[]string{"validate", "extra"}, 2},
		{[]string{"prewarm", "--bogus"}, 2},
		{[]string{"prewarm", "extra"}, 2},
		{[]string{"migrate", "--bogus", "up"}, 2},
		{[]string{"migrate"}, 2},
		{[]string{"migrate", "sideways"}, 2},
		{[]string{"notify-sql", "--bogus"}, 2},
		{[]string{"notify-sql"}, 2},
		{[]string{"demo", "--bogus"}, 2},
		{[]string{"demo", "extra"}, 2},
		{[]string{"version", "--bogus"}, 2},
		{[]string{"version", "extra"}, 2},
		{[]string{"completion", "--bogus"}, 2},
		{[]string{"completion", "tcsh"}, 2},
		{[]string{"completion", "bash", "extra"}, 2},
		{[]string{"healthcheck", "--bogus"}, 2},
		{[]string{"healthcheck", "extra"}, 2},

		// Usage: a bad flag value, found before connecting anywhere.
		{[]string{"run", "-c", good, "--listen", "nope"}, 2},
		{[]string{"run", "-c", good, "--listen", "127.0.0.1:99999"}, 2},
		{[]string{"demo", "--ttl", "0s"}, 2},
		{[]string{"demo", "--readers", "0"}, 2},
		{[]string{"demo", "--duration", "soon"}, 2},
		{[]string{"demo", "--listen", "nope"}, 2},
		{[]string{"demo", "--log-level", "loud"}, 2},
		{[]string{"demo", "--redis", "redis://h:1/notanumber"}, 2},
		{[]string{"prewarm", "-c", good, "--min-coverage", "2"}, 2},
		{[]string{"prewarm", "-c", good, "--top", "-1"}, 2},
		{[]string{"prewarm", "-c", good, "--ranking", "newest"}, 2},
		{[]string{"prewarm", "-c", good, "--redis", "redis://h:1/notanumber"}, 2},
		{[]string{"validate", "-c", good, "--explain", "--explain-min-rows", "0"}, 2},
		{[]string{"migrate", "-c", good, "up", "--source", "nosuch"}, 2},
		{[]string{"notify-sql", "-c", good, "nosuch", "--table", "items"}, 2},
		{[]string{"healthcheck", "--url", "nope"}, 2},
		{[]string{"healthcheck", "--timeout", "0s"}, 2},
		{[]string{"healthcheck", "--ready", "--url", "http://127.0.0.1:1/readyz"}, 2},
		{[]string{"healthcheck", "-c", bad}, 2},

		// Config: invalid or missing, for every command that reads one.
		{[]string{"run", "-c", bad}, 2},
		{[]string{"validate", "-c", bad}, 2},
		{[]string{"prewarm", "-c", bad}, 2},
		{[]string{"migrate", "-c", bad, "up"}, 2},
		{[]string{"notify-sql", "-c", bad, "x", "--table", "t"}, 2},
		{[]string{"validate", "-c", "/nonexistent/hearth.yaml"}, 2},

		// Runtime: a server that is not there.
		{[]string{"run", "-c", good}, 1},
		{[]string{"prewarm", "-c", good}, 1},
		{[]string{"migrate", "-c", good, "up"}, 1},
		{[]string{"validate", "-c", good, "--explain"}, 1},
		{[]string{"healthcheck", "--url", "http://" + dead + "/healthz"}, 1},
		{[]string{"healthcheck", "-c", good, "--ready"}, 1},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), bin, c.args...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			cmd.WaitDelay = 5 * time.Second
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != c.want {
				t.Fatalf("hearth %s: exit %d, want %d; output:\n%s", strings.Join(c.args, " "), code, c.want, out.String())
			}
			if code != 0 && !strings.Contains(out.String(), "hearth: ") {
				t.Errorf("exit %d without an error message:\n%s", code, out.String())
			}
			// go-redis's own pool lines ("redis: <date> pool.go:…") go to
			// Hearth's logger at debug, not raw onto stderr.
			if strings.Contains(out.String(), "pool.go:") {
				t.Errorf("go-redis's raw log lines in the output:\n%s", out.String())
			}
		})
	}
}
