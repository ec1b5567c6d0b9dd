package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/warmer"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func setup(t *testing.T) (*postgres.Source, *testenv.PostgresEnv) {
	t.Helper()
	pg := testenv.Postgres(t)
	if _, err := pg.Pool.Exec(context.Background(), `
		CREATE TABLE items (id text PRIMARY KEY, body bytea, note text);
		INSERT INTO items VALUES ('1', '\x00ff0a'::bytea, 'one'), ('2', 'two', 'two'), ('3', NULL, 'three');`); err != nil {
		t.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN, MaxConns: 2, StatementTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	return src, pg
}

func spec(t *testing.T, key, query string) *warmer.Spec {
	t.Helper()
	tp, err := keytmpl.Parse(key)
	if err != nil {
		t.Fatal(err)
	}
	return &warmer.Spec{Name: "items", Template: tp, Query: query, MaxMembers: 100}
}

func TestLoadFamilyInOneQuery(t *testing.T) {
	src, _ := setup(t)
	s := spec(t, "item:{id}", "SELECT id, body FROM items WHERE id = ANY($1)")
	rs, err := src.Load(context.Background(), s, []string{"1", "2", "3", "404", "1' OR '1'='1"})
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]warmer.Result{}
	for _, r := range rs {
		by[r.Member] = r
	}
	if got, want := len(rs), 3; got != want {
		t.Fatalf("results = %d (%v), want %d: absent members are simply not returned", got, rs, want)
	}
	if got, want := string(by["1"].Value), "\x00\xff\n"; got != want {
		t.Errorf("bytea value = %q, want %q byte for byte", got, want)
	}
	if got, want := string(by["2"].Value), "two"; got != want {
		t.Errorf("value = %q, want %q", got, want)
	}
	if !errors.Is(by["3"].Err, warmer.ErrNullValue) {
		t.Errorf("NULL value: err = %v, want ErrNullValue", by["3"].Err)
	}
}

func TestBadQueries(t *testing.T) {
	src, _ := setup(t)
	ctx := context.Background()
	t.Run("wrong column count names the field", func(t *testing.T) {
		_, err := src.Load(ctx, spec(t, "item:{id}", "SELECT id FROM items WHERE id = ANY($1)"), []string{"1"})
		if !errors.Is(err, warmer.ErrBadPayload) || !strings.Contains(err.Error(), "keys[items].query") {
			t.Errorf("err = %v, want ErrBadPayload naming keys[items].query", err)
		}
	})
	t.Run("duplicate member is an error for that member only", func(t *testing.T) {
		rs, err := src.Load(ctx, spec(t, "item:{id}", "SELECT id, note FROM items WHERE id = ANY($1) UNION ALL SELECT '2', 'again'"), []string{"1", "2"})
		if err != nil {
			t.Fatal(err)
		}
		var dup, ok int
		for _, r := range rs {
			switch {
			case r.Member == "2" && errors.Is(r.Err, warmer.ErrDuplicate):
				dup++
			case r.Member == "1" && r.Err == nil:
				ok++
			}
		}
		if dup != 1 || ok != 1 || len(rs) != 2 {
			t.Errorf("results %+v: want member 1 ok and member 2 one duplicate error", rs)
		}
	})
	// Rows are matched to members in the order asked while they come in it;
	// a member asked twice and answered twice is still a duplicate.
	t.Run("repeated member answered twice is a duplicate", func(t *testing.T) {
		rs, err := src.Load(ctx, spec(t, "item:{id}", "SELECT id, note FROM (SELECT id, note FROM items WHERE id = ANY($1) ORDER BY id) x UNION ALL SELECT '1', 'again'"), []string{"1", "2", "1"})
		if err != nil {
			t.Fatal(err)
		}
		var dup, ok int
		for _, r := range rs {
			switch {
			case r.Member == "1" && errors.Is(r.Err, warmer.ErrDuplicate):
				dup++
			case r.Member == "2" && r.Err == nil && string(r.Value) == "two":
				ok++
			}
		}
		if dup != 1 || ok != 1 || len(rs) != 2 {
			t.Errorf("results %+v: want member 2 ok and member 1 one duplicate error", rs)
		}
	})
	t.Run("rows out of the order asked are matched", func(t *testing.T) {
		members := []string{"3", "1", "2", "404"} // rows come 1, 2, 3
		rs, err := src.Load(ctx, spec(t, "item:{id}", "SELECT id, note FROM items WHERE id = ANY($1) ORDER BY id"), members)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, r := range rs {
			if r.Err != nil {
				t.Errorf("member %s: %v", r.Member, r.Err)
			}
			got[r.Member] = string(r.Value)
		}
		if want := map[string]string{"1": "one", "2": "two", "3": "three"}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("answers %v, want %v", got, want)
		}
	})
	t.Run("statement timeout", func(t *testing.T) {
		_, err := src.Load(ctx, spec(t, "slow", "SELECT pg_sleep(2)::text"), nil)
		if err == nil || !strings.Contains(err.Error(), "statement timeout") {
			t.Errorf("err = %v, want the statement timeout", err)
		}
	})
	t.Run("syntax error", func(t *testing.T) {
		if _, err := src.Load(ctx, spec(t, "x", "SELEC 1"), nil); err == nil {
			t.Error("no error for invalid SQL")
		}
	})
}

func TestLoadSingle(t *testing.T) {
	src, _ := setup(t)
	ctx := context.Background()
	for _, c := range []struct {
		query   string
		value   string
		missing bool
		err     error
	}{
		{"SELECT note FROM items WHERE id = '2'", "two", false, nil},
		{"SELECT note FROM items WHERE id = 'nope'", "", true, nil},
		{"SELECT note FROM items", "", false, warmer.ErrDuplicate},
		{"SELECT body FROM items WHERE id = '3'", "", false, warmer.ErrNullValue},
	} {
		rs, err := src.Load(ctx, spec(t, "single", c.query), nil)
		if err != nil {
			t.Fatalf("%s: %v", c.query, err)
		}
		r := rs[0]
		if string(r.Value) != c.value || r.Missing != c.missing || !errors.Is(r.Err, c.err) {
			t.Errorf("%s: got %+v", c.query, r)
		}
	}
}

func TestListMembersIsBounded(t *testing.T) {
	src, _ := setup(t)
	s := spec(t, "item:{id}", "")
	s.MembersQuery = "SELECT id FROM items ORDER BY id"
	got, err := src.ListMembers(context.Background(), s, nil)
	if err != nil || strings.Join(got, ",") != "1,2,3" {
		t.Fatalf("ListMembers = %v, %v", got, err)
	}
	s.MaxMembers = 2
	if _, err := src.ListMembers(context.Background(), s, got); !errors.Is(err, warmer.ErrTooMany) {
		t.Errorf("err = %v, want ErrTooMany past max_members", err)
	}
}

// TestListMembersReusesUnchanged: a listing given the last one keeps its
// strings where a row repeats it (no copy of an unchanged million members),
// reads changed, new, non-text and NULL rows as before, and a listing longer
// or shorter than the hint is read whole.
func TestListMembersReusesUnchanged(t *testing.T) {
	src, pg := setup(t)
	ctx := context.Background()
	s := spec(t, "item:{id}", "")
	s.MembersQuery = "SELECT id FROM items ORDER BY id"
	first, err := src.ListMembers(ctx, s, nil)
	if err != nil || strings.Join(first, ",") != "1,2,3" {
		t.Fatalf("ListMembers = %v, %v", first, err)
	}
	again, err := src.ListMembers(ctx, s, first)
	if err != nil || strings.Join(again, ",") != "1,2,3" {
		t.Fatalf("ListMembers with the last listing = %v, %v", again, err)
	}
	for i := range again {
		if unsafe.StringData(again[i]) != unsafe.StringData(first[i]) {
			t.Errorf("member %q read anew, not reused", again[i])
		}
	}
	if _, err := pg.Pool.Exec(ctx, `UPDATE items SET id = '20' WHERE id = '2'; INSERT INTO items (id) VALUES ('4')`); err != nil {
		t.Fatal(err)
	}
	changed, err := src.ListMembers(ctx, s, first)
	if err != nil || strings.Join(changed, ",") != "1,20,3,4" {
		t.Fatalf("ListMembers after a change = %v, %v", changed, err)
	}
	if unsafe.StringData(changed[0]) != unsafe.StringData(first[0]) {
		t.Errorf("unchanged first member read anew")
	}
	// A listing far shorter than the hint does not keep the hint's room.
	big := make([]string, 1000)
	for i := range big {
		big[i] = strconv.Itoa(i)
	}
	short, err := src.ListMembers(ctx, s, big)
	if err != nil || len(short) != 4 || cap(short) >= len(big) {
		t.Errorf("ListMembers with a 1,000-member hint = %d members, capacity %d, %v; want 4 and far less room", len(short), cap(short), err)
	}
	for _, c := range []struct{ query, want string }{
		{"SELECT note FROM items WHERE id < '3' ORDER BY id", "one,two"}, // shorter than the hint
		{"SELECT NULLIF(id, '20') FROM items ORDER BY id", "1,3,4"},      // a NULL is no member
		{"SELECT length(id) * 10 FROM items ORDER BY id", "10,20,10,10"}, // not text: scanned
		{"SELECT id::varchar FROM items ORDER BY id", "1,20,3,4"},
	} {
		s.MembersQuery = c.query
		got, err := src.ListMembers(ctx, s, first)
		if err != nil || strings.Join(got, ",") != c.want {
			t.Errorf("%s: ListMembers = %v, %v; want %s", c.query, got, err, c.want)
		}
	}
}

func TestPasswordNeverInErrors(t *testing.T) {
	dsn := "postgres://app:Sup3rS3cret@127.0.0.1:1/test?connect_timeout=1"
	if got := postgres.Redact(dsn); strings.Contains(got, "Sup3rS3cret") || !strings.Contains(got, "app@127.0.0.1:1/test") {
		t.Errorf("Redact = %q", got)
	}
	src, err := postgres.New(postgres.Config{Name: "db", DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	err = src.Ping(context.Background())
	if err == nil {
		t.Fatal("ping of a closed port succeeded")
	}
	if strings.Contains(err.Error(), "Sup3rS3cret") {
		t.Errorf("error leaks the password: %v", err)
	}
	if _, err := postgres.New(postgres.Config{Name: "db", DSN: "postgres://app:Sup3rS3cret@host:notaport/db"}); err == nil || strings.Contains(err.Error(), "Sup3rS3cret") {
		t.Errorf("bad DSN error = %v", err)
	}
}

// The first loads of a query, arriving together as a pre-warm's first batches
// do, describe it once between them: the others wait for that description
// rather than each taking a connection to describe it again.
func TestConcurrentFirstLoadsDescribeOnce(t *testing.T) {
	src, _ := setup(t)
	s := spec(t, "item:{id}", "SELECT id, note FROM items WHERE id = ANY($1)")
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs, err := src.Load(context.Background(), s, []string{"1", "2"})
			if err == nil && len(rs) != 2 {
				err = fmt.Errorf("%d results, want 2", len(rs))
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := src.Described(); got != 1 {
		t.Errorf("the query was described %d times by 16 concurrent first loads, want once", got)
	}
}

// A load that waits for another's description is not failed by that other
// load giving up: it describes the query itself, within its own deadline.
func TestDescriptionOutlivesTheLoadThatStartedIt(t *testing.T) {
	src, _ := setup(t)
	s := spec(t, "item:{id}", "SELECT id, note FROM items WHERE id = ANY($1)")
	ctx := context.Background()
	// Hold both connections: the description waits for one.
	var held []*pgxpool.Conn
	for range 2 {
		c, err := src.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	release := func() {
		for _, c := range held {
			c.Release()
		}
		held = nil
	}
	defer release()

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	first := make(chan error, 1)
	go func() {
		_, err := src.Load(short, s, []string{"1"})
		first <- err
	}()
	time.Sleep(30 * time.Millisecond) // the second load joins the first one's description
	second := make(chan error, 1)
	go func() {
		rs, err := src.Load(ctx, s, []string{"1", "2"})
		if err == nil && len(rs) != 2 {
			err = fmt.Errorf("%d results, want 2", len(rs))
		}
		second <- err
	}()
	if err := <-first; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first load: err = %v, want its deadline", err)
	}
	select {
	case err := <-second:
		t.Fatalf("second load ended with the first one (err = %v); it had time left", err)
	case <-time.After(100 * time.Millisecond):
	}
	release()
	if err := <-second; err != nil {
		t.Fatalf("second load: %v", err)
	}
	if got := src.Described(); got != 2 {
		t.Errorf("described %d times, want 2: the given-up description, then the second load's own", got)
	}
}

// Prepare opens the connections the first loads will use (at once, each back
// in the pool as soon as it is open, so how many depends on the timing; never
// more than the pool holds) and describes the query once, so that a
// pre-warm's first batches neither connect nor describe; a query that cannot
// be described fails only the loads that follow, with the usual error.
func TestPrepareOpensConnectionsAndDescribes(t *testing.T) {
	src, _ := setup(t) // a pool of 2
	ctx := context.Background()
	s := spec(t, "item:{id}", "SELECT id, note FROM items WHERE id = ANY($1)")
	src.Prepare(ctx, []*warmer.Spec{s}, 5)
	opened := src.Pool().Stat().TotalConns()
	if opened < 1 || opened > 2 {
		t.Errorf("Prepare for 5 loads left %d connections, want 1 or 2 (a pool of 2)", opened)
	}
	if got := src.Described(); got != 1 {
		t.Errorf("described %d times by Prepare, want once", got)
	}
	rs, err := src.Load(ctx, s, []string{"1", "2"})
	if err != nil || len(rs) != 2 {
		t.Fatalf("load after Prepare: %v, %d results", err, len(rs))
	}
	if got := src.Described(); got != 1 {
		t.Errorf("described %d times after a load, want still once: the load used Prepare's description", got)
	}
	if got := src.Pool().Stat().TotalConns(); got != opened {
		t.Errorf("%d connections after the load, want %d: it took one Prepare opened", got, opened)
	}

	bad := spec(t, "bad:{id}", "SELECT id, nope FROM items WHERE id = ANY($1)")
	src.Prepare(ctx, []*warmer.Spec{bad}, 1)
	if _, err := src.Load(ctx, bad, []string{"1"}); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("load of a query Prepare could not describe: err = %v, want the server's error naming the column", err)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	fresh, err := postgres.New(postgres.Config{Name: "db", DSN: src.Pool().Config().ConnString(), MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	fresh.Prepare(cancelled, []*warmer.Spec{s}, 4)
	if got := fresh.Pool().Stat().TotalConns(); got != 0 {
		t.Errorf("Prepare with an ended context opened %d connections, want none", got)
	}
}

// An empty text value is a value: written as zero bytes, never taken for
// NULL, whether it comes first in its batch or after another value.
func TestEmptyTextIsNotNull(t *testing.T) {
	src, pg := setup(t)
	if _, err := pg.Pool.Exec(context.Background(), `INSERT INTO items VALUES ('0', '', ''), ('4', '', '')`); err != nil {
		t.Fatal(err)
	}
	s := spec(t, "item:{id}", "SELECT id, note FROM items WHERE id = ANY($1) ORDER BY id")
	rs, err := src.Load(context.Background(), s, []string{"0", "1", "4"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 {
		t.Fatalf("results %v, want 3", rs)
	}
	for _, r := range rs {
		want := map[string]string{"0": "", "1": "one", "4": ""}[r.Member]
		if r.Err != nil || string(r.Value) != want || r.Value == nil {
			t.Errorf("member %s: value %q (nil %v), err %v; want %q, a value", r.Member, r.Value, r.Value == nil, r.Err, want)
		}
	}
}

// An integer member column (SELECT id, …, no ::text) is read in binary and
// answers exactly as the same query with the column cast to text does: for
// bigint, integer and smallint ids, negative and extreme ones among them,
// members asked in random order with repeats and absent ones.
func TestIntegerMemberColumnAnswersAsText(t *testing.T) {
	src, pg := setup(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `
		CREATE TABLE nums (i8 bigint PRIMARY KEY, i4 integer UNIQUE, i2 smallint UNIQUE, v text);
		INSERT INTO nums SELECT n, n, n, 'v' || n FROM generate_series(-300, 300) n;
		INSERT INTO nums VALUES (9223372036854775807, 2147483647, 32767, 'max'), (-9223372036854775808, -2147483648, -32768, 'min');`); err != nil {
		t.Fatal(err)
	}
	pool := []string{"9223372036854775807", "-9223372036854775808", "2147483647", "-2147483648", "32767", "-32768", "0", "404", "-404"}
	for n := -300; n <= 300; n += 7 {
		pool = append(pool, strconv.Itoa(n))
	}
	answers := func(t *testing.T, query string, members []string) map[string]string {
		t.Helper()
		rs, err := src.Load(ctx, spec(t, "n:{id}", query), members)
		if err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		got := map[string]string{}
		for _, r := range rs {
			if r.Err != nil {
				got[r.Member] = "error: " + r.Err.Error()
				continue
			}
			got[r.Member] = string(r.Value)
		}
		return got
	}
	for _, col := range []struct{ name, typ string }{{"i8", "bigint"}, {"i4", "integer"}, {"i2", "smallint"}} {
		for round := range 20 {
			var members []string
			for k := range 1 + round%9 {
				members = append(members, pool[(round*31+k*17)%len(pool)])
			}
			if round%3 == 0 {
				members = append(members, members[0]) // a repeat
			}
			where := fmt.Sprintf(" FROM nums WHERE %s = ANY($1::%s[])", col.name, col.typ)
			if round%2 == 0 {
				where += " ORDER BY v" // out of the order asked
			}
			got := answers(t, "SELECT "+col.name+", v"+where, members)
			want := answers(t, "SELECT "+col.name+"::text, v"+where, members)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s round %d, members %q: integer column answered %v, its text %v", col.typ, round, members, got, want)
			}
			if len(want) == 0 && round%9 > 2 {
				t.Errorf("%s round %d: no answers at all to compare (members %q)", col.typ, round, members)
			}
		}
	}
}
