package warmer_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/origintest"
	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/warmer"
)

// TestBadInput declares every kind of bad input next to good declarations and
// good members, refreshes everything at once, and checks that each bad input is
// a named error and a counted reason, that its old value is kept, and that
// everything else was written.
func TestBadInput(t *testing.T) {
	r := testenv.Redis(t)
	pg := testenv.Postgres(t)
	mustExec(t, pg, `CREATE TABLE items (id text, body text)`)
	mustExec(t, pg, `INSERT INTO items VALUES ('ok', 'fine'), ('big', repeat('x', 2000)), ('dup', 'a'), ('dup', 'b'), ('null', NULL)`)
	u := origintest.New(t, func(m string, _ int) (int, string) {
		switch m {
		case "broken":
			return http.StatusInternalServerError, "upstream down"
		case "garbage":
			return http.StatusOK, "<html>not json"
		}
		return http.StatusOK, `{"v": "json-` + m + `"}`
	})
	p := r.Prefix
	var specs []*warmer.Spec
	family := func(name, source string, members ...string) *warmer.Spec {
		s := decl(t, name, p+name+":{id}", source)
		s.Members = members
		s.MaxStale = time.Minute
		specs = append(specs, s)
		return s
	}
	pgFamily := func(name, query string, members ...string) *warmer.Spec {
		s := family(name, "db", members...)
		s.Query = query
		return s
	}
	const q = `SELECT id, body FROM items WHERE id = ANY($1)`
	pgFamily("sized", q, "ok", "big").MaxValueBytes = 1000
	pgFamily("dups", q, "ok", "dup")
	pgFamily("nulls", q, "ok", "null")
	pgFamily("cols", `SELECT id FROM items WHERE id = ANY($1)`, "ok")
	huge := pgFamily("huge", q)
	huge.Members, huge.MembersQuery, huge.MaxMembers = nil, `SELECT g::text FROM generate_series(1, 100000) g`, 100
	odd := pgFamily("odd", q)
	odd.Members, odd.MembersQuery = nil, `SELECT unnest(ARRAY['ok', 'has space', '{x}', 'ok'])`
	family("fivexx", "api", "good", "broken").Path = "/v/{id}"
	js := family("json", "api", "good", "garbage")
	js.Path, js.JSONPointer = "/v/{id}", "/v"
	good := decl(t, "good", p+"good", "db")
	good.Query = `SELECT 'still refreshed'`
	specs = append(specs, good)

	rg := newRig(t, r.Client, p, map[string]warmer.Source{"db": pgSource(t, pg.DSN), "api": u.Source(t, 4)}, specs...)
	ctx := context.Background()
	// Old values of the members that will fail: they must survive.
	for _, k := range []string{"sized:big", "dups:dup", "nulls:null", "cols:ok", "fivexx:broken", "json:garbage"} {
		if err := r.Client.Set(ctx, p+k, "old", 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The huge family's listing fails on the first run: it has no earlier
	// list to fall back on, so nothing of it is loaded.
	err := rg.w.RefreshAll(ctx)
	if err == nil {
		t.Fatal("RefreshAll reported no error")
	}
	t.Logf("RefreshAll: %v", err)

	t.Run("good keys and members were written", func(t *testing.T) {
		for k, want := range map[string]string{
			"good": "still refreshed", "sized:ok": "fine", "dups:ok": "fine", "nulls:ok": "fine",
			"odd:ok": "fine", "fivexx:good": `{"v": "json-good"}`, "json:good": "json-good",
		} {
			if got, _ := get(t, r.Client, p+k); got != want {
				t.Errorf("%s = %q, want %q", k, got, want)
			}
		}
	})
	for _, c := range []struct {
		decl, reason string
		old          string // key whose old value must survive
		msg          []string
	}{
		{"sized", "too_large", "sized:big", []string{p + "sized:big", "2000 bytes", "max_value_bytes is 1000"}},
		{"dups", "duplicate", "dups:dup", []string{p + "dups:dup", `returned member "dup" twice`}},
		{"nulls", "null_value", "nulls:null", []string{p + "nulls:null", `NULL for member "null"`}},
		{"cols", "bad_payload", "cols:ok", []string{"keys[cols].query", "must return 2 column(s) (member, value), got 1"}},
		{"huge", "too_many_members", "", []string{"keys[huge].members_query", "more than max_members 100"}},
		{"fivexx", "origin", "fivexx:broken", []string{p + "fivexx:broken", "HTTP 500"}},
		{"json", "bad_payload", "json:garbage", []string{p + "json:garbage", `keys[json].json_pointer "/v"`, "body is not JSON"}},
	} {
		t.Run(c.decl+" "+c.reason, func(t *testing.T) {
			if got := promtest.Sum(t, rg.reg, "hearth_load_failures_total", "family", c.decl, "reason", c.reason); got < 1 {
				t.Errorf("hearth_load_failures_total{family=%s,reason=%s} = %g, want >= 1", c.decl, c.reason, got)
			}
			_, err := rg.w.Refresh(ctx, c.decl, warmer.RunOptions{})
			if err == nil {
				t.Fatal("no error")
			}
			for _, m := range c.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not name %q", err, m)
				}
			}
			if c.old != "" {
				if got, _ := get(t, r.Client, p+c.old); got != "old" {
					t.Errorf("%s = %q, want the old value kept", c.old, got)
				}
			}
		})
	}
	t.Run("invalid queried members are skipped and counted", func(t *testing.T) {
		if got, want := promtest.Sum(t, rg.reg, "hearth_load_failures_total", "family", "odd", "reason", "bad_member"), 2.0; got != want {
			t.Errorf("load_failures{family=odd,reason=bad_member} = %g, want %g", got, want)
		}
		if got, want := promtest.Sum(t, rg.reg, "hearth_members", "family", "odd"), 1.0; got != want {
			t.Errorf("hearth_members{family=odd} = %g, want %g (de-duplicated, invalid ones skipped)", got, want)
		}
		n, err := r.Client.Keys(ctx, p+"odd:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(n) != 1 {
			t.Errorf("keys written for odd: %v, want only odd:ok", n)
		}
	})
}

// TestNothingUserControlledIsSpliced: members reach SQL only as bound
// parameters and URLs only escaped, as one path segment; a member that would
// be a traversal once a proxy decodes it never reaches the origin.
func TestNothingUserControlledIsSpliced(t *testing.T) {
	r := testenv.Redis(t)
	pg := testenv.Postgres(t)
	mustExec(t, pg, `CREATE TABLE items (id text PRIMARY KEY, body text NOT NULL)`)
	mustExec(t, pg, `INSERT INTO items VALUES ('1', 'one')`)
	u := origintest.New(t, func(m string, _ int) (int, string) { return http.StatusOK, "v" })
	sqlEvil := `1';DROP/**/TABLE/**/items;--`
	urlEvil, urlOdd := `../admin?x=1#frag`, `x?y=1#frag`
	s := decl(t, "item", r.Prefix+"item:{id}", "db")
	s.Members, s.Query = []string{"1", sqlEvil}, `SELECT id, body FROM items WHERE id = ANY($1)`
	h := decl(t, "page", r.Prefix+"page:{id}", "api")
	h.Members, h.Path = []string{urlEvil, urlOdd}, "/v/{id}"
	rg := newRig(t, r.Client, r.Prefix, map[string]warmer.Source{"db": pgSource(t, pg.DSN), "api": u.Source(t, 1)}, s, h)
	if err := rg.w.RefreshAll(context.Background()); err != nil && !errors.Is(err, warmer.ErrBadMember) {
		t.Fatal(err)
	}
	var n int
	if err := pg.Pool.QueryRow(context.Background(), `SELECT count(*) FROM items`).Scan(&n); err != nil {
		t.Fatalf("the table is gone: %v", err)
	}
	if v, ok := get(t, r.Client, r.Prefix+"item:"+sqlEvil); !ok || v != "" {
		t.Errorf("the hostile member = %q (exists %v), want the not-found sentinel", v, ok)
	}
	hits := u.Hits()
	if got, want := hits[urlOdd], 1; got != want {
		t.Errorf("upstream saw the member %d times as one path segment (hits %v), want %d", got, hits, want)
	}
	for path := range hits {
		if strings.Contains(path, "admin") {
			t.Errorf("a member that is a traversal once decoded was requested: %q", path)
		}
	}
	if _, ok := get(t, r.Client, r.Prefix+"page:"+urlEvil); ok {
		t.Errorf("the traversal member was written")
	}
	if got := promtest.Sum(t, rg.reg, "hearth_load_failures_total", "family", "page", "reason", "bad_member"); got != 1 {
		t.Errorf("load_failures{family=page,reason=bad_member} = %g, want 1", got)
	}
}
