package migrations_test

import (
	"context"
	"errors"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/migrations"
)

// psqlURL is pg's DSN as psql takes it: the schema as a search_path option.
func psqlURL(t *testing.T, pg *testenv.PostgresEnv, extra string) string {
	t.Helper()
	u, err := url.Parse(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Del("search_path")
	q.Set("options", "-csearch_path="+pg.Schema+extra)
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // libpq reads + as itself
	return u.String()
}

// runPsql pipes sql into psql as a user would (`hearth notify-sql … | psql`):
// without ON_ERROR_STOP, so that a statement smuggled in after a failed one
// would still run.
func runPsql(t *testing.T, conn, sql string) string {
	t.Helper()
	cmd := exec.Command("psql", "-X", "-q", conn)
	cmd.Stdin = strings.NewReader(sql)
	out, _ := cmd.CombinedOutput()
	return string(out)
}

// TestNotifySQLHostileNames: names that try to end the comment or the literal
// and run a statement of their own (a newline, a quote, a backslash read with
// standard_conforming_strings off, a Unicode line separator) are either
// refused, naming the character, or printed quoted. The printed SQL is piped
// into a real psql; the canary table survives every one of them.
func TestNotifySQLHostileNames(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `CREATE TABLE items (id bigint PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	// With the function there, the script's transaction commits: a statement
	// smuggled into it would run too.
	if _, err := pg.Pool.Exec(ctx, notifyFunction(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("psql"); err != nil {
		t.Fatalf("psql is needed to prove what a piped script does: %v", err)
	}
	const drop = "DROP TABLE canary; --"
	for _, c := range []struct {
		name, table, column string
		scsOff              bool
		refused             string // the character named in the refusal, "" if printed
	}{
		{name: "newline in column", table: "items", column: "id\n" + drop, refused: "U+000A"},
		{name: "carriage return in column", table: "items", column: "id\r" + drop, refused: "U+000D"},
		{name: "newline in table", table: "items\n" + drop, column: "id", refused: "U+000A"},
		{name: "newline in schema", table: "public\n" + drop + ".items", column: "id", refused: "U+000A"},
		{name: "tab in column", table: "items", column: "id\t", refused: "U+0009"},
		{name: "DEL in column", table: "items", column: "id\x7f", refused: "U+007F"},
		{name: "line separator in column", table: "items", column: "id\u2028" + drop, refused: "U+2028"},
		{name: "paragraph separator in table", table: "items\u2029" + drop, column: "id", refused: "U+2029"},
		{name: "C1 control in column", table: "items", column: "id\u0085" + drop, refused: "U+0085"},
		{name: "quote in column", table: "items", column: "id'); " + drop},
		{name: "quote in table", table: `items"; ` + drop, column: "id"},
		{name: "backslash, escapes read as such", table: "items", column: `id\'); ` + drop, scsOff: true},
		{name: "backslash", table: "items", column: `id\'); ` + drop},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := pg.Pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS canary (id int)`); err != nil {
				t.Fatal(err)
			}
			sql, err := migrations.NotifyTriggerSQL("item", c.table, c.column, "hearth_items")
			if c.refused != "" {
				if err == nil || !errors.Is(err, migrations.ErrIdentifier) || !strings.Contains(err.Error(), c.refused) {
					t.Errorf("got err %v, want a refusal naming %s", err, c.refused)
				}
			} else if err != nil {
				t.Fatalf("a name without control characters is printed quoted, got %v", err)
			}
			if err == nil {
				extra := ""
				if c.scsOff {
					extra = " -cstandard_conforming_strings=off"
				}
				out := runPsql(t, psqlURL(t, pg, extra), sql)
				t.Logf("psql said: %s", out)
			}
			var n int
			if err := pg.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'canary'`, pg.Schema).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 1 {
				t.Fatalf("the canary table was dropped by the printed SQL:\n%s", sql)
			}
		})
	}
}

// TestNotifySQLQuotedNames: a table and a column whose names need quoting
// (spaces, double quotes, a backslash, a schema) get working triggers through
// psql, and a change notifies the member.
func TestNotifySQLQuotedNames(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	table, column := `My "Odd" Table\x`, `the "id" col\`
	ident := pgx.Identifier{pg.Schema, table}.Sanitize()
	if _, err := pg.Pool.Exec(ctx, `CREATE TABLE `+ident+` (`+pgx.Identifier{column}.Sanitize()+` bigint PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Pool.Exec(ctx, notifyFunction(t)); err != nil {
		t.Fatal(err)
	}
	channel := "hearth_q_" + strings.ToLower(strings.TrimPrefix(pg.Schema, "t_"))
	if len(channel) > 63 {
		channel = channel[:63]
	}
	sql, err := migrations.NotifyTriggerSQL("odd.decl-1", pg.Schema+"."+table, column, channel)
	if err != nil {
		t.Fatal(err)
	}
	for _, extra := range []string{"", " -cstandard_conforming_strings=off"} {
		cmd := exec.Command("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", psqlURL(t, pg, extra))
		cmd.Stdin = strings.NewReader(sql)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("psql%s: %v\n%s\n%s", extra, err, out, sql)
		}
	}
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Pool.Exec(ctx, `INSERT INTO `+ident+` VALUES (42)`); err != nil {
		t.Fatal(err)
	}
	n, err := conn.WaitForNotification(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(n.Payload, `"ids":["42"]`) {
		t.Errorf("notification %q does not name member 42", n.Payload)
	}
}

// notifyFunction is migration 00005's function, without goose.
func notifyFunction(t *testing.T) string {
	t.Helper()
	b, err := migrations.FS.ReadFile("00005_change_notify.sql")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start, end := strings.Index(s, "-- +goose StatementBegin"), strings.Index(s, "-- +goose StatementEnd")
	if start < 0 || end < start {
		t.Fatal("migration 00005 has no statement block")
	}
	return s[start:end]
}
