package memberindex

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"testing"
)

// Property: the index answers every member's position and nothing for a
// non-member, as a map by name does, whether hashes are distinct or clash
// (a hash narrowed to a few values puts most members in the clash map).
func TestMemberIndexIsAMapByName(t *testing.T) {
	hashes := map[string]func(maphash.Seed, string) uint64{
		"maphash": maphash.String,
		"clashing": func(_ maphash.Seed, m string) uint64 {
			return uint64(len(m) % 3)
		},
	}
	for name, h := range hashes {
		t.Run(name, func(t *testing.T) {
			defer func(old func(maphash.Seed, string) uint64) { memberHash = old }(memberHash)
			memberHash = h
			r := rand.New(rand.NewPCG(3, 4))
			for round := range 200 {
				n := r.IntN(300)
				list := make([]string, 0, n)
				want := map[string]int32{}
				for len(list) < n {
					m := fmt.Sprint(r.IntN(5 * (n + 1)))
					if r.IntN(10) == 0 {
						m = "" // the empty member, as a single key's
					}
					if _, dup := want[m]; !dup {
						want[m] = int32(len(list))
					}
					list = append(list, m) // repeats too: a repeat is its first
				}
				x := New(list)
				if r.IntN(2) == 0 {
					x = x.Over(append([]string(nil), list...)) // the same members listed anew
				}
				for q := range 5*n + 2 {
					m := fmt.Sprint(q)
					if q == 5*n+1 {
						m = ""
					}
					got, ok := x.At(m)
					wantAt, wantOK := want[m]
					if ok != wantOK || got != wantAt || x.Has(m) != wantOK {
						t.Fatalf("round %d: at(%q) = %d, %v; want %d, %v", round, m, got, ok, wantAt, wantOK)
					}
				}
			}
		})
	}
	var empty Index
	if empty.Has("") {
		t.Fatal("an empty index has a member")
	}
}
