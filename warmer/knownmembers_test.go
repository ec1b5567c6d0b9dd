package warmer_test

import (
	"context"
	"testing"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/warmer"
)

// TestRefreshWhereKnownMembers: the re-warm's refresh (RefreshWhere) of a
// members_query family loads the members of its last listing without listing
// them again — a member added since is not written by it — and lists them
// when there is no listing yet; the next scheduled run lists again.
func TestRefreshWhereKnownMembers(t *testing.T) {
	r := testenv.Redis(t)
	pg := testenv.Postgres(t)
	mustExec(t, pg, `CREATE TABLE items (id text PRIMARY KEY, body text NOT NULL)`)
	mustExec(t, pg, `INSERT INTO items VALUES ('1', 'one'), ('2', 'two')`)
	s := decl(t, "item", r.Prefix+"item:{id}", "db")
	s.Query = `SELECT id, body FROM items WHERE id = ANY($1)`
	s.Members, s.MembersQuery = nil, `SELECT id FROM items`
	rg := newRig(t, r.Client, r.Prefix, map[string]warmer.Source{"db": pgSource(t, pg.DSN)}, s)
	ctx := context.Background()
	key := func(m string) string { return r.Prefix + "item:" + m }

	// No listing yet: the re-warm lists.
	if err := rg.w.RefreshWhere(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"1", "2"} {
		if _, ok := get(t, r.Client, key(m)); !ok {
			t.Fatalf("%s not written by the first re-warm (no listing yet)", key(m))
		}
	}

	mustExec(t, pg, `INSERT INTO items VALUES ('3', 'three')`)
	if err := r.Client.Del(ctx, key("1"), key("2")).Err(); err != nil {
		t.Fatal(err)
	}
	for _, keep := range []func(string) bool{nil, func(string) bool { return true }} {
		if err := rg.w.RefreshWhere(ctx, keep); err != nil {
			t.Fatal(err)
		}
		for _, m := range []string{"1", "2"} {
			if _, ok := get(t, r.Client, key(m)); !ok {
				t.Errorf("%s not re-warmed (keep nil: %v)", key(m), keep == nil)
			}
		}
		if v, ok := get(t, r.Client, key("3")); ok {
			t.Errorf("%s = %q after a re-warm (keep nil: %v): the members were listed again", key("3"), v, keep == nil)
		}
	}

	if err := rg.w.RefreshAll(ctx); err != nil {
		t.Fatal(err)
	}
	if v, ok := get(t, r.Client, key("3")); !ok || v != "three" {
		t.Errorf("%s = %q, %v after a scheduled run, want three: it lists the members", key("3"), v, ok)
	}
}
