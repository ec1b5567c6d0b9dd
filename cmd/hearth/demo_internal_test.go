package main

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"

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
		code := run(t.Context(), []string{"demo", "--duration", "4s", "--ttl", "3s", "--readers", "8", "--keys", "10", "--origin-latency", "20ms"}, &stdout, &stderr)
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
		code := run(t.Context(), []string{"demo", "--duration", "3s", "--ttl", "3s", "--readers", "4", "--keys", "5",
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
			code := run(t.Context(), append([]string{"demo"}, c.args...), &stdout, &stderr)
			if code == 0 || !strings.Contains(stderr.String(), c.msg) {
				t.Errorf("demo %v: exit %d, stderr %q; want an error with %q", c.args, code, stderr.String(), c.msg)
			}
		}
	})
}
