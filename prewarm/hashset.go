package prewarm

import "math/bits"

// hashSet is a set of 64-bit hashes: open addressing, linear probing, at most
// three quarters full. A pre-warm checks every access-log key against it, and
// once the set outgrows the CPU caches each check is a memory access: here
// one, where a map[uint64]struct{} takes two (its control word, then its
// slot), which `BenchmarkHashSetCold` shows as about three times the time.
//
// The low bit of every hash is set, so that 0 can mark an empty slot; two
// hashes that differ only in that bit count as one (63 bits are left).
//
// The set is as long as its hashes need, not rounded up to a power of two: a
// hash's first slot is the hash scaled to the length (home). The set lives
// for the whole pre-warm, and what is live when the collector runs sets how
// far the heap grows, every page of it faulted in once: at most half full in
// a power of two, 100,000 keys took 2 MiB; three quarters full at their
// count, 1.07 MiB.
type hashSet struct {
	slots   []uint64
	n       int
	touched uint64 // addAll's reads, summed only so that they are made
}

// newHashSet returns a set sized for n hashes without growing.
func newHashSet(n int) *hashSet {
	return &hashSet{slots: newSlots(max(16, n+n/3+1))}
}

// home is the slot h's probe starts at: the high word of h × the length, so
// every slot is as likely and the length need not be a power of two.
func (s *hashSet) home(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(len(s.slots)))
	return int(hi)
}

// full says the set holds more than three quarters of its length.
func (s *hashSet) full() bool { return 4*s.n > 3*len(s.slots) }

// newSlots returns n empty slots, every page of them written once. Memory
// fresh from the kernel is mapped on first touch, and a page first read is
// mapped to the shared zero page and faults again at its first write: the
// set's reads before writes (addAll's, grow's) would take every page's fault
// twice, in a pre-warm of 100,000 keys 262 faults more of a 1 MiB set, which
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
	for i := s.home(h); ; i++ {
		if i == len(s.slots) {
			i = 0
		}
		switch s.slots[i] {
		case h:
			return false
		case 0:
			s.slots[i] = h
			s.n++
			if s.full() {
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
	var sum uint64
	for _, h := range hs {
		sum += s.slots[s.home(h|1)]
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
	for _, h := range old {
		if h == 0 {
			continue
		}
		i := s.home(h)
		for s.slots[i] != 0 {
			if i++; i == len(s.slots) {
				i = 0
			}
		}
		s.slots[i] = h
	}
}
