package prewarm

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// A member list holds what a []string would, through any sequence of adds
// and filters (a batch checked for repeats as it fills, some of its members
// dropped each time), for members empty, short, long and multi-byte.
func TestMemberListAgreesWithStrings(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	pool := []string{"", "1", "42", "9999999999", "ü-ß", strings.Repeat("x", 300), "a:b"}
	for round := range 500 {
		var l memberList
		var want []string
		checked := 0
		for step := range 1 + r.IntN(12) {
			for range r.IntN(40) {
				m := pool[r.IntN(len(pool))] + strings.Repeat("7", r.IntN(3))
				l.add(m)
				want = append(want, m)
			}
			keep := make([]bool, len(want)-checked)
			var kept []string
			for i := range keep {
				keep[i] = r.IntN(3) > 0
				if keep[i] {
					kept = append(kept, want[checked+i])
				}
			}
			l.filter(checked, keep)
			want = append(want[:checked:checked], kept...)
			checked = len(want)
			if got := l.strings(); l.len() != len(want) || !slices.Equal(got, want) {
				t.Fatalf("round %d step %d: the list holds %q (len %d), want %q", round, step, got, l.len(), want)
			}
		}
	}
	one := oneMember("")
	if got := one.strings(); !slices.Equal(got, []string{""}) {
		t.Fatalf("a single key's list holds %q, want one empty member", got)
	}
}
