package main_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/hearth-dev/hearth/internal/e2e"
)

// TestNotifySQLRefusesControlCharacters: `hearth notify-sql` refuses a
// --column or --table with a control character before printing anything,
// naming the flag and the character, with exit code 2; a name with quotes is
// printed quoted only.
func TestNotifySQLRefusesControlCharacters(t *testing.T) {
	cfg := writeConfig(t, `
redis: {addrs: ["127.0.0.1:6379"]}
sources: [{name: db, type: postgres, dsn: "postgres://root@127.0.0.1:5432/test"}]
keys:
  - name: item
    key: "item:{id}"
    source: db
    ttl: 60s
    members: ["1"]
    query: "SELECT id::text, v FROM items WHERE id = ANY($1::bigint[])"
    notify: {channel: hearth_items}
`)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--table", "items", "--column", "id\nDROP TABLE important; --"}, "--column"},
		{[]string{"--table", "items\nDROP TABLE important; --"}, "--table"},
		{[]string{"--table", "public.items\u2028DROP TABLE important; --"}, "--table"},
	} {
		cmd := exec.Command(e2e.Binary(t), append([]string{"notify-sql", "item", "--config", cfg}, c.args...)...)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%q: exit %v, want 2", c.args, err)
		}
		if stdout.Len() != 0 {
			t.Errorf("%q printed SQL:\n%s", c.args, stdout.String())
		}
		if msg := stderr.String(); !strings.Contains(msg, c.want) || !strings.Contains(msg, "control character U+") {
			t.Errorf("%q: the refusal names neither the flag %s nor the character:\n%s", c.args, c.want, msg)
		}
	}
	out, err := exec.Command(e2e.Binary(t), "notify-sql", "item", "--config", cfg, "--table", `it"ems`, "--column", `i'd`).Output()
	if err != nil {
		t.Fatalf("a quoted name: %v", err)
	}
	if s := string(out); strings.Contains(s, `it"ems`) || !strings.Contains(s, `"it""ems"`) || !strings.Contains(s, `'i''d'`) {
		t.Errorf("a name is printed unquoted:\n%s", s)
	}
}
