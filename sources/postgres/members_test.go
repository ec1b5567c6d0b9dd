package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// TestNonCanonicalMembersNeverNegative runs the warmer against real
// PostgreSQL and Redis: members that pass the param_pattern but that the typed
// parameter would not give back as written ("01" for a bigint, which the query
// answers under "1"; an upper-case uuid) are counted as bad members and never
// written, above all not as the not-found sentinel while their row exists;
// the canonical members load, and a member with no row is still not found.
// For a parameter type Hearth does not parse (numeric, date), the server
// writes each member first: one it writes otherwise, or that equals an earlier
// member, is a bad member; an answer that still comes under a name not asked
// for ("1" for "1.0") is counted, and the members left without an answer are
// counted as ambiguous, not written as not found.
func TestNonCanonicalMembersNeverNegative(t *testing.T) {
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	ctx := context.Background()
	const u = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
	if _, err := pg.Pool.Exec(ctx, `
		CREATE TABLE big (id bigint PRIMARY KEY, v text NOT NULL);
		INSERT INTO big VALUES (1, 'one'), (2, 'two');
		CREATE TABLE small (id integer PRIMARY KEY, v text NOT NULL);
		INSERT INTO small VALUES (1, 'one');
		CREATE TABLE uu (id uuid PRIMARY KEY, v text NOT NULL);
		INSERT INTO uu VALUES ('`+u+`', 'uuid');
		CREATE TABLE num (id numeric PRIMARY KEY, v text NOT NULL);
		INSERT INTO num VALUES (1, 'one'), (2, 'two');
		CREATE TABLE days (d date PRIMARY KEY, v text NOT NULL);
		INSERT INTO days VALUES ('2024-01-05', 'fifth');`); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`
sources: [{name: db, type: postgres, dsn: %q}]
keys:
  - {name: big, key: "%[2]shot:{id}", source: db, ttl: 1h, negative_value: "NOT-FOUND", param_pattern: "[0-9]{1,12}",
     members: ["01", "1", "002", "404"], query: "SELECT id::text, v FROM big WHERE id = ANY($1::bigint[])"}
  - {name: small, key: "%[2]ssmall:{id}", source: db, ttl: 1h, negative_value: "NOT-FOUND",
     members: ["+1", "1.0", "01"], query: "SELECT id::text, v FROM small WHERE id = ANY($1::int[])"}
  - {name: uu, key: "%[2]suu:{id}", source: db, ttl: 1h, negative_value: "NOT-FOUND",
     members: [%[3]q, %[4]q], query: "SELECT id::text, v FROM uu WHERE id = ANY($1::uuid[])"}
  - {name: num, key: "%[2]snum:{id}", source: db, ttl: 1h, negative_value: "NOT-FOUND",
     members: ["1.0", "2"], query: "SELECT id::text, v FROM num WHERE id = ANY($1::numeric[])"}
  - {name: num2, key: "%[2]snum2:{id}", source: db, ttl: 1h, negative_value: "NOT-FOUND",
     members: ["1", "1.0", "3"], query: "SELECT id::text, v FROM num WHERE id = ANY($1::numeric[])"}
  - {name: days, key: "%[2]sday:{id}", source: db, ttl: 1h, negative_value: "NOT-FOUND",
     members: ["2024-1-5"], query: "SELECT d::text, v FROM days WHERE d = ANY($1::date[])"}
`, pg.DSN, rd.Prefix, u, strings.ToUpper(u))))
	if err != nil {
		t.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	reg := prometheus.NewRegistry()
	w, err := warmer.New(warmer.Options{Store: &store.RedisStore{Client: rd.Client}, Sources: map[string]warmer.Source{"db": src},
		Specs: cfg.Specs(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"big", "small", "uu", "num", "num2", "days"} {
		if _, err := w.Refresh(ctx, name, warmer.RunOptions{}); err != nil {
			t.Logf("refresh %s: %v", name, err)
		}
	}
	want := map[string]string{
		"hot:1": "one", "hot:404": "NOT-FOUND", "hot:01": "", "hot:002": "",
		"small:+1": "", "small:1.0": "", "small:01": "",
		"uu:" + u: "uuid", "uu:" + strings.ToUpper(u): "",
		// Types Hearth does not parse: the server says how it writes each
		// member (a date written otherwise is refused unsent, as is a member
		// equal to an earlier one); an answer that still names another
		// member (numeric "1.0" answered as "1") leaves the member without an
		// answer unwritten, not written as not found.
		"num:2": "two", "num:1.0": "", "day:2024-1-5": "",
		"num2:1": "one", "num2:1.0": "", "num2:3": "NOT-FOUND",
	}
	for k, v := range want {
		got, err := rd.Client.Get(ctx, rd.Prefix+k).Result()
		if v == "" {
			if err == nil {
				t.Errorf("%s = %q, want it never written (its answer would name another member)", k, got)
			}
			continue
		}
		if got != v {
			t.Errorf("%s = %q (%v), want %q", k, got, err, v)
		}
	}
	exp := `# HELP hearth_load_failures_total Members not refreshed, by reason; their previous values are kept.
# TYPE hearth_load_failures_total counter
hearth_load_failures_total{family="big",reason="bad_member"} 2
hearth_load_failures_total{family="days",reason="bad_member"} 1
hearth_load_failures_total{family="num",reason="ambiguous"} 1
hearth_load_failures_total{family="num",reason="unexpected_member"} 1
hearth_load_failures_total{family="num2",reason="bad_member"} 1
hearth_load_failures_total{family="small",reason="bad_member"} 3
hearth_load_failures_total{family="uu",reason="bad_member"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(exp), "hearth_load_failures_total"); err != nil {
		t.Error(err)
	}
}
