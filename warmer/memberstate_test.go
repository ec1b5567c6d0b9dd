package warmer_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/warmer"
)

func members(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

func statusMembers(t *testing.T, w *warmer.Warmer, name string) int {
	t.Helper()
	for _, s := range w.Status() {
		if s.Name == name {
			return s.NumMembers
		}
	}
	t.Fatalf("no status for %s", name)
	return 0
}

// TestOneOffStateIsPruned: members loaded outside the declaration (an admin
// refresh, a pre-warm) are not counted as members and are forgotten once no
// value of theirs can be alive; the state gauge shows both.
func TestOneOffStateIsPruned(t *testing.T) {
	o := newOrigin()
	env := testenv.Redis(t)
	spec := family(t, env.Prefix, "f", 3)
	extra := members("x", 500)
	for _, m := range append(append([]string{}, spec.Members...), extra[:250]...) {
		o.set(m, []byte("v"))
	}
	f := newFixture(t, o, spec)
	ctx := context.Background()
	if _, err := f.w.Refresh(ctx, "f", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, batch := range [][]string{extra[:100], extra[100:]} {
		if _, err := f.w.RefreshMembers(ctx, "f", batch); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := statusMembers(t, f.w, "f"), 3; got != want {
		t.Errorf("status members after loading 500 undeclared ones = %d, want the %d declared", got, want)
	}
	if got, want := promtest.Value(t, f.reg, "hearth_warmer_state_members", "family", "f", "kind", "one_off"), 500.0; got != want {
		t.Errorf("one_off state = %g, want %g", got, want)
	}
	if got, want := promtest.Value(t, f.reg, "hearth_warmer_state_members", "family", "f", "kind", "declared"), 3.0; got != want {
		t.Errorf("declared state = %g, want %g", got, want)
	}

	// Within the horizon (max of max_stale 1m and the TTL), a run keeps them.
	f.now.Add(30 * time.Second)
	if _, err := f.w.Refresh(ctx, "f", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := promtest.Value(t, f.reg, "hearth_warmer_state_members", "family", "f", "kind", "one_off"); got != 500 {
		t.Errorf("one_off state within the horizon = %g, want 500", got)
	}
	f.now.Add(31 * time.Second)
	if _, err := f.w.Refresh(ctx, "f", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := promtest.Value(t, f.reg, "hearth_warmer_state_members", "family", "f", "kind", "one_off"); got != 0 {
		t.Errorf("one_off state past the horizon = %g, want 0", got)
	}
	if got := promtest.Value(t, f.reg, "hearth_warmer_state_pruned_total", "family", "f", "reason", "expired"); got != 500 {
		t.Errorf("pruned expired = %g, want 500", got)
	}
	if got := len(f.w.Negatives("f")); got != 0 {
		t.Errorf("negatives after a run = %d, want 0 (the 250 missing one-offs are not declared)", got)
	}
	if got, want := statusMembers(t, f.w, "f"), 3; got != want {
		t.Errorf("status members = %d, want %d", got, want)
	}
}

// TestOneOffStateKeepsMaxStale: a one-off member, and a member that left the
// declaration, keep their stale budget from their last success while it
// matters: a failure 55s after it extends by at most the 5s left of max_stale
// 1m, not by a fresh budget.
func TestOneOffStateKeepsMaxStale(t *testing.T) {
	o := newOrigin()
	env := testenv.Redis(t)
	spec := family(t, env.Prefix, "s", 3)
	spec.TTL, spec.Interval = 20*time.Second, 10*time.Second
	for _, m := range []string{"0", "1", "2", "adhoc"} {
		o.set(m, []byte("v"+m))
	}
	f := newFixture(t, o, spec)
	ctx := context.Background()
	if _, err := f.w.Refresh(ctx, "s", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.w.RefreshMembers(ctx, "s", []string{"adhoc"}); err != nil {
		t.Fatal(err)
	}
	// "2" leaves the family.
	shrunk := *spec
	shrunk.Members = []string{"0", "1"}
	if _, err := f.w.Apply([]*warmer.Spec{&shrunk}); err != nil {
		t.Fatal(err)
	}
	f.now.Add(20 * time.Second)
	if _, err := f.w.Refresh(ctx, "s", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, want := statusMembers(t, f.w, "s"), 2; got != want {
		t.Errorf("status members after the family shrank = %d, want %d", got, want)
	}
	if got := promtest.Value(t, f.reg, "hearth_warmer_state_members", "family", "s", "kind", "one_off"); got != 2 {
		t.Errorf("one_off state = %g, want 2 (adhoc, and 2 that left)", got)
	}
	f.now.Add(35 * time.Second) // 55s after their last success
	o.setFail(errors.New("connection refused"))
	for _, m := range []string{"adhoc", "2"} {
		key := shrunk.Template.Key(m)
		// Let the TTL run down, so that an extension is visible (it never shortens).
		if err := f.env.Client.PExpire(ctx, key, time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		out, err := f.w.RefreshMembers(ctx, "s", []string{m})
		if err == nil || out.Extended != 1 {
			t.Fatalf("failing refresh of %s: extended %d, err %v; want 1 extended and an error", m, out.Extended, err)
		}
		if ttl := f.env.Client.PTTL(ctx, key).Val(); ttl <= time.Second || ttl > 5*time.Second {
			t.Errorf("PTTL of %s after the failure = %s, want within (1s, 5s]: max_stale counts from its last success", key, ttl)
		}
	}
}

// TestOneOffStateIsCapped: however many distinct members are loaded outside
// the declaration, at most MaxOneOffMembers are remembered; the excess is
// evicted, least recently loaded first, and counted.
func TestOneOffStateIsCapped(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100,000 keys")
	}
	o := newOrigin()
	env := testenv.Redis(t)
	spec := family(t, env.Prefix, "c", 1)
	spec.BatchSize = 5000
	f := newFixture(t, o, spec)
	ctx := context.Background()
	n := warmer.MaxOneOffMembers + 100
	all := members("m", n)
	for i := 0; i < n; i += spec.BatchSize {
		if _, err := f.w.RefreshMembers(ctx, "c", all[i:min(i+spec.BatchSize, n)]); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := promtest.Value(t, f.reg, "hearth_warmer_state_members", "family", "c", "kind", "one_off"), float64(warmer.MaxOneOffMembers); got != want {
		t.Errorf("one_off state after %d distinct members = %g, want the bound %g", n, got, want)
	}
	if got := promtest.Value(t, f.reg, "hearth_warmer_state_pruned_total", "family", "c", "reason", "evicted"); got != 100 {
		t.Errorf("evicted = %g, want 100", got)
	}
}
