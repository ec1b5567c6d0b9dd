package slot_test

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/readside"
)

// The read side is its own module and keeps its own copy of the slot
// function and the tag table (it cannot import this internal package). The
// daemon fences per slot with slot.Tag and readers put their lock and δ keys
// in their value's slot with readside.SlotTag: the two must agree exactly.
func TestReadsideCopyAgrees(t *testing.T) {
	if readside.SlotCount != slot.Count {
		t.Fatalf("readside.SlotCount = %d, slot.Count = %d", readside.SlotCount, slot.Count)
	}
	for n := range slot.Count {
		if got, want := readside.SlotTag(n), slot.Tag(n); got != want {
			t.Fatalf("slot %d: readside.SlotTag = %q, slot.Tag = %q", n, got, want)
		}
	}
	keys := []string{"", "{", "}", "{}", "{}x", "x{}", "{{}}", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}",
		"{user1000}.following", "123456789", "\xff\x00", "ключ", "a{b", "a}b{c}"}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("ab{}:\x00\xff0")
	for i := range 200_000 {
		b := make([]byte, rng.IntN(24))
		for j := range b {
			if i%2 == 0 {
				b[j] = alphabet[rng.IntN(len(alphabet))] // dense in braces
			} else {
				b[j] = byte(rng.IntN(256))
			}
		}
		keys = append(keys, string(b), "product:"+strconv.Itoa(i))
	}
	for _, k := range keys {
		if got, want := readside.HashSlot(k), slot.Of(k); got != want {
			t.Fatalf("key %q: readside.HashSlot = %d, slot.Of = %d", k, got, want)
		}
	}
}
