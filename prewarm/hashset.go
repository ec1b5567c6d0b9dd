package prewarm

// hashSet is a set of 64-bit hashes: open addressing, linear probing, at most
// half full. A pre-warm checks every access-log key against it, and once the
// set outgrows the CPU caches each check is a memory access: here one, where a
// map[uint64]struct{} takes two (its control word, then its slot), which
// `BenchmarkHashSetCold` shows as about three times the time.
//
// The low bit of every hash is set, so that 0 can mark an empty slot; two
// hashes that differ only in that bit count as one (63 bits are left).
type hashSet struct {
	slots   []uint64
	n       int
	touched uint64 // addAll's reads, summed only so that they are made
}

// newHashSet returns a set sized for n hashes without growing.
func newHashSet(n int) *hashSet {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	return &hashSet{slots: newSlots(size)}
}

// newSlots returns n empty slots, every page of them written once. Memory
// fresh from the kernel is mapped on first touch, and a page first read is
// mapped to the shared zero page and faults again at its first write: the
// set's reads before writes (addAll's, grow's) would take every page's fault
// twice, in a pre-warm of 100,000 keys 512 faults more of a 2 MB set, which
// cost more than the set's every other access on a virtual machine that
// makes page faults dear.
func newSlots(n int) []uint64 {
	slots := make([]uint64, n)
	const perPage = 4096 / 8 // the smallest page: larger ones are written more than once
	for i := 0; i < n; i += perPage {
		slots[i] = 0
	}
	return slots
}

// add adds h and reports whether it was new.
func (s *hashSet) add(h uint64) bool {
	h |= 1
	mask := uint64(len(s.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch s.slots[i] {
		case h:
			return false
		case 0:
			s.slots[i] = h
			s.n++
			if 2*s.n > len(s.slots) {
				s.grow()
			}
			return true
		}
	}
}

// addAll adds hs in order, as add would one at a time, and sets fresh[i]
// (len(fresh) >= len(hs)) to whether hs[i] was new; a hash repeated within hs
// is new the first time only. It first reads every hash's home slot, reads
// that do not wait for each other, so that their cache misses overlap (a
// pre-warm's set is larger than the caches PostgreSQL and Redis share with it);
// the adds then find their slots in cache, where add alone waits for each miss
// in turn.
func (s *hashSet) addAll(hs []uint64, fresh []bool) {
	mask := uint64(len(s.slots) - 1)
	var sum uint64
	for _, h := range hs {
		sum += s.slots[(h|1)&mask]
	}
	s.touched += sum // keeps the reads from being dropped
	for i, h := range hs {
		fresh[i] = s.add(h)
	}
}

// len is how many hashes the set holds.
func (s *hashSet) len() int { return s.n }

func (s *hashSet) grow() {
	old := s.slots
	s.slots = newSlots(2 * len(old))
	mask := uint64(len(s.slots) - 1)
	for _, h := range old {
		if h == 0 {
			continue
		}
		i := h & mask
		for s.slots[i] != 0 {
			i = (i + 1) & mask
		}
		s.slots[i] = h
	}
}
