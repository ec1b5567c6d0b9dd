// Package memberindex finds a member's position in a list of members.
package memberindex

import "hash/maphash"

// Index finds a member's position in a list (a declaration's members). It is keyed by
// the member's 64-bit hash, not by the member, so that its million entries
// hold no pointer: the garbage collector does not trace it (a map keyed by
// the member strings was most of the daemon's traced heap, and tracing it
// most of its collector's work). A hash is confirmed against the list, and
// the members whose hash another member of the list has are kept by name.
type Index struct {
	list  []string
	seed  maphash.Seed
	first map[uint64]int32 // hash → position of the first member with it
	clash map[string]int32 // the other members with a hash already taken; rare
}

// memberHash is the index's hash (a test narrows it to force clashes).
var memberHash = maphash.String

// New indexes list, whose members are distinct (a repeat's position is its
// first). The list is the Index's: it must not change.
func New(list []string) Index {
	x := Index{list: list, seed: maphash.MakeSeed(), first: make(map[uint64]int32, len(list))}
	for i, m := range list {
		h := memberHash(x.seed, m)
		j, taken := x.first[h]
		switch {
		case !taken:
			x.first[h] = int32(i)
		case list[j] == m: // a repeat
		default:
			if x.clash == nil {
				x.clash = map[string]int32{}
			}
			if _, ok := x.clash[m]; !ok {
				x.clash[m] = int32(i)
			}
		}
	}
	return x
}

// At is m's position in the list.
func (x *Index) At(m string) (int32, bool) {
	if len(x.list) == 0 {
		return 0, false
	}
	if i, ok := x.first[memberHash(x.seed, m)]; ok && x.list[i] == m {
		return i, true
	}
	i, ok := x.clash[m]
	return i, ok
}

// Has reports whether m is in the list.
func (x *Index) Has(m string) bool {
	_, ok := x.At(m)
	return ok
}

// Over is x over list, which holds x's members in x's order (the same
// members listed anew), so that the index is not built again.
func (x Index) Over(list []string) Index {
	x.list = list
	return x
}

// Is reports whether list is the very slice indexed, not only an equal one
// (a members query's reused list, declared again).
func (x *Index) Is(list []string) bool {
	return len(list) == len(x.list) && len(list) > 0 && &list[0] == &x.list[0]
}

// List is the indexed list.
func (x *Index) List() []string { return x.list }

// Len is the list's length.
func (x *Index) Len() int { return len(x.list) }
