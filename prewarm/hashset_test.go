package prewarm

import (
	"hash/maphash"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// The set answers as a map does, across growth, for hashes with the low
// bit clear, zero, and the largest value.
func TestHashSetAgreesWithMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	s := newHashSet(4) // grows several times
	m := map[uint64]bool{}
	for i := range 20_000 {
		var h uint64
		switch i % 5 {
		case 0:
			h = r.Uint64() &^ 1 // the low bit is the set's own: h and h|1 are one
		case 1:
			h = uint64(r.IntN(50)) // small values, many repeats, 0 among them
		case 2:
			h = ^uint64(0)
		default:
			h = r.Uint64()
		}
		if got, want := s.add(h), !m[h|1]; got != want {
			t.Fatalf("add(%#x) #%d = %v, want %v", h, i, got, want)
		}
		m[h|1] = true
		if s.len() != len(m) {
			t.Fatalf("len = %d after %d adds, want %d", s.len(), i+1, len(m))
		}
	}
	for h := range m {
		if s.add(h) {
			t.Fatalf("%#x was lost by the set's growth", h)
		}
	}
	if s.full() {
		t.Fatalf("%d hashes in %d slots: more than three quarters full", s.len(), len(s.slots))
	}
}

// A set made for n hashes holds n distinct ones without growing (a pre-warm's
// set is made for its top_n up front: growing rehashes every key), and is not
// much longer than they need.
func TestHashSetSizedForN(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, 2, 3, 11, 12, 13, 100, 1_000, 65_536, 100_000, 131_072} {
		s := newHashSet(n)
		size := len(s.slots)
		for s.len() < n {
			s.add(r.Uint64())
		}
		if len(s.slots) != size {
			t.Fatalf("newHashSet(%d): grew from %d to %d slots", n, size, len(s.slots))
		}
		if n >= 16 && size > n+n/3+1 {
			t.Fatalf("newHashSet(%d): %d slots, more than a quarter to spare", n, size)
		}
	}
}

// addAll answers as add one hash at a time does, in chunks of any length,
// for hashes repeated within a chunk and across chunks, across growth.
func TestHashSetAddAllAgreesWithAdd(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	all, one := newHashSet(4), newHashSet(4)
	fresh := make([]bool, 64)
	for range 2_000 {
		chunk := make([]uint64, r.IntN(64))
		for i := range chunk {
			switch r.IntN(4) {
			case 0:
				chunk[i] = uint64(r.IntN(300)) // repeats across chunks
			case 1:
				if i > 0 {
					chunk[i] = chunk[r.IntN(i)] // a repeat within the chunk
					break
				}
				fallthrough
			default:
				chunk[i] = r.Uint64()
			}
		}
		all.addAll(chunk, fresh)
		for i, h := range chunk {
			if want := one.add(h); fresh[i] != want {
				t.Fatalf("addAll said %v for %#x at %d of its chunk, add says %v", fresh[i], h, i, want)
			}
		}
		if all.len() != one.len() {
			t.Fatalf("addAll's set holds %d hashes, add's %d", all.len(), one.len())
		}
	}
}

// BenchmarkHashSetCold adds 100,000 key hashes, as a pre-warm of 100,000 keys
// does, in runs of 1,000 with the CPU caches flushed between runs (in a
// pre-warm, PostgreSQL and Redis stream the values through them meanwhile):
// the set against a map[uint64]struct{} of the same hashes.
func BenchmarkHashSetCold(b *testing.B) {
	seed := maphash.MakeSeed()
	hs := make([]uint64, 100_000)
	for i := range hs {
		hs[i] = maphash.String(seed, "item:"+strconv.Itoa(i))
	}
	junk := make([]byte, 64<<20)
	flush := func() {
		for i := 0; i < len(junk); i += 64 {
			junk[i]++
		}
	}
	// Only the adds are timed (ns/key); ns/op includes the flushes.
	run := func(b *testing.B, add func(uint64) bool) time.Duration {
		var took time.Duration
		for i := 0; i < len(hs); i += 1000 {
			flush()
			t0 := time.Now()
			for _, h := range hs[i : i+1000] {
				if !add(h) {
					b.Fatal("a new hash was taken for a repeat")
				}
			}
			took += time.Since(t0)
		}
		return took
	}
	b.Run("hashSet", func(b *testing.B) {
		var took time.Duration
		for b.Loop() {
			s := newHashSet(len(hs))
			took += run(b, s.add)
		}
		b.ReportMetric(float64(took.Nanoseconds())/float64(b.N*len(hs)), "ns/key")
	})
	b.Run("hashSet.addAll", func(b *testing.B) {
		var took time.Duration
		fresh := make([]bool, 1000)
		for b.Loop() {
			s := newHashSet(len(hs))
			for i := 0; i < len(hs); i += 1000 {
				flush()
				t0 := time.Now()
				s.addAll(hs[i:i+1000], fresh)
				took += time.Since(t0)
				for _, ok := range fresh {
					if !ok {
						b.Fatal("a new hash was taken for a repeat")
					}
				}
			}
		}
		b.ReportMetric(float64(took.Nanoseconds())/float64(b.N*len(hs)), "ns/key")
	})
	b.Run("map", func(b *testing.B) {
		var took time.Duration
		for b.Loop() {
			m := make(map[uint64]struct{}, len(hs))
			took += run(b, func(h uint64) bool {
				n := len(m)
				m[h] = struct{}{}
				return len(m) > n
			})
		}
		b.ReportMetric(float64(took.Nanoseconds())/float64(b.N*len(hs)), "ns/key")
	})
}
