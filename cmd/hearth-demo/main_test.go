package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// summaryRow returns the two numbers of a summary row ("origin calls  205  140").
func summaryRow(t *testing.T, out, name string) (without, with int64) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if n := len(f); n >= 3 && strings.Join(f[:n-2], " ") == name {
			a, err1 := strconv.ParseInt(f[n-2], 10, 64)
			b, err2 := strconv.ParseInt(f[n-1], 10, 64)
			if err1 == nil && err2 == nil {
				return a, b
			}
		}
	}
	t.Fatalf("no %q row in the summary:\n%s", name, out)
	return 0, 0
}

// liveLine is one second of the live view: t, reads/s, misses/s, origin calls/s.
var liveLine = regexp.MustCompile(`(?m)^ +\d+s +\d+ +\d+ +\d+ `)

func TestDemo(t *testing.T) {
	t.Parallel()
	t.Run("stampede without Hearth, no miss with it", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), []string{"--duration", "4s", "--ttl", "3s", "--readers", "8", "--keys", "10", "--origin-latency", "20ms"}, &stdout, &stderr)
		out := stdout.String()
		if code != 0 {
			t.Fatalf("exit %d\n%s\n%s", code, out, stderr.String())
		}
		without, with := summaryRow(t, out, "misses")
		if without == 0 {
			t.Errorf("misses without Hearth = 0, want > 0 (no stampede shown)\n%s", out)
		}
		if with != 0 {
			t.Errorf("misses with Hearth = %d, want 0\n%s", with, out)
		}
		if reads, _ := summaryRow(t, out, "reads"); reads == 0 {
			t.Errorf("no reads\n%s", out)
		}
		if calls, _ := summaryRow(t, out, "origin calls"); calls < without {
			t.Errorf("origin calls without Hearth = %d, fewer than the %d misses", calls, without)
		}
		if got := len(liveLine.FindAllString(out, -1)); got < 6 {
			t.Errorf("%d live per-second lines, want at least 3 per phase\n%s", got, out)
		}
	})

	t.Run("real Redis and PostgreSQL, cleaned up after", func(t *testing.T) {
		rd, pg := testenv.Redis(t), testenv.Postgres(t)
		schemas := func() int {
			var n int
			if err := pg.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'hearth\_demo\_%'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		demoKeys := func() int {
			keys, err := rd.Client.Keys(t.Context(), "hearth-demo:*").Result()
			if err != nil {
				t.Fatal(err)
			}
			return len(keys)
		}
		schemas0, keys0 := schemas(), demoKeys()
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), []string{"--duration", "3s", "--ttl", "3s", "--readers", "4", "--keys", "5",
			"--origin-latency", "10ms", "--redis", rd.Addr, "--postgres", pg.DSN}, &stdout, &stderr)
		out := stdout.String()
		if code != 0 {
			t.Fatalf("exit %d\n%s\n%s", code, out, stderr.String())
		}
		if !strings.Contains(out, "Origin: PostgreSQL") {
			t.Errorf("the origin is not PostgreSQL:\n%s", out)
		}
		if without, with := summaryRow(t, out, "misses"); without == 0 || with != 0 {
			t.Errorf("misses = %d without, %d with Hearth; want > 0 and 0\n%s", without, with, out)
		}
		if got := schemas(); got > schemas0 {
			t.Errorf("%d demo schemas left behind", got-schemas0)
		}
		if got := demoKeys(); got > keys0 {
			t.Errorf("%d demo keys left behind in Redis", got-keys0)
		}
	})

	t.Run("bad flags", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			msg  string
		}{
			{[]string{"--ttl", "500ms"}, "--ttl: must be at least 1s"},
			{[]string{"--readers", "0"}, "--readers: must be between 1 and 1000"},
			{[]string{"--ttl", "2s", "--origin-latency", "1s"}, "--origin-latency: must be between 0 and 200ms"},
		} {
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), c.args, &stdout, &stderr)
			if code == 0 || !strings.Contains(stderr.String(), c.msg) {
				t.Errorf("demo %v: exit %d, stderr %q; want an error with %q", c.args, code, stderr.String(), c.msg)
			}
		}
	})
}

// TestExitCodes pins the demo's part of hearth's exit-code contract
// (docs/commands.md#exit-codes), which `hearth demo` passes on: 2 for a usage
// error, found before anything starts, 1 for a runtime failure.
func TestExitCodes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"--help"}, 0},
		{[]string{"--bogus"}, 2},
		{[]string{"extra"}, 2},
		{[]string{"--ttl", "0s"}, 2},
		{[]string{"--readers", "0"}, 2},
		{[]string{"--duration", "soon"}, 2},
		{[]string{"--listen", "nope"}, 2},
		{[]string{"--listen", "127.0.0.1:99999"}, 2},
		{[]string{"--log-level", "loud"}, 2},
		{[]string{"--redis", "redis://h:1/notanumber"}, 2},
		// What `hearth --config FILE demo` passes on: ignored.
		{[]string{"--config", "nowhere.yaml", "--help"}, 0},
		{[]string{"--redis", e2e.FreeAddr(t), "--duration", "1s"}, 1},
	} {
		var stdout, stderr bytes.Buffer
		if got := run(t.Context(), c.args, &stdout, &stderr); got != c.want {
			t.Errorf("hearth-demo %v: exit %d, want %d\n%s", c.args, got, c.want, stderr.String())
		}
		if c.want != 0 && !strings.HasPrefix(stderr.String(), "hearth: ") {
			t.Errorf("hearth-demo %v: stderr %q, want it to start with \"hearth: \"", c.args, stderr.String())
		}
	}
}

// TestCompletion: the demo completes its own flags' values, which `hearth
// demo` relays to the shell.
func TestCompletion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	run(t.Context(), []string{"__complete", "--log-level", ""}, &stdout, &stderr)
	if got := stdout.String(); !strings.Contains(got, "debug\ninfo\nwarn\nerror\n") {
		t.Errorf("completion of --log-level = %q", got)
	}
}

var updateHelp = flag.Bool("update-help", false, "rewrite testdata/help.txt from the current --help output")

// TestHelpUnchanged pins `hearth-demo --help` (what `hearth demo --help`
// prints) to testdata/help.txt: its flags and defaults are the demo's command
// line, moved here from hearth's. A deliberate change reruns it with -update-help.
func TestHelpUnchanged(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--help: exit %d: %s", code, stderr.String())
	}
	file := filepath.Join("testdata", "help.txt")
	if *updateHelp {
		if err := os.WriteFile(file, stdout.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if got := stdout.String(); got != string(want) {
		t.Errorf("--help changed; got:\n%s\nwant (%s):\n%s", got, file, want)
	}
}
