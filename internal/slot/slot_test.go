package slot_test

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"

	"github.com/hearth-dev/hearth/internal/slot"
)

func TestOf(t *testing.T) {
	// Values from Redis's cluster specification and CLUSTER KEYSLOT.
	for key, want := range map[string]int{
		"123456789":            0x31C3, // the spec's CRC16 check value
		"foo":                  12182,
		"{user1000}.following": slot.Of("user1000"),
		"user1000":             3443,
		"foo{{bar}}zap":        slot.Of("{bar"),
		"foo{bar}{zap}":        slot.Of("bar"),
	} {
		if got := slot.Of(key); got != want {
			t.Errorf("Of(%q) = %d, want %d", key, got, want)
		}
	}
	if got, want := slot.Of("{user1000}.following"), slot.Of("{user1000}.followers"); got != want {
		t.Errorf("a shared hash tag gives slots %d and %d", got, want)
	}
}

func TestTagLandsInItsSlot(t *testing.T) {
	seen := make(map[string]bool, slot.Count)
	for n := range slot.Count {
		tag := slot.Tag(n)
		if got := slot.Of("{" + tag + "}:x"); got != n {
			t.Fatalf("Tag(%d) = %q lands in slot %d", n, tag, got)
		}
		if seen[tag] {
			t.Fatalf("Tag(%d) = %q is used twice", n, tag)
		}
		seen[tag] = true
	}
}

// Tags name record and fence keys that live in Redis across upgrades: the
// table must give the very tags it always gave (the first base-36 number
// landing in each slot), however it is stored.
func TestTagsDoNotChange(t *testing.T) {
	var all strings.Builder
	for n := range slot.Count {
		all.WriteString(slot.Tag(n))
		all.WriteByte(',')
	}
	const want = "6dd2f15b88622b0e5e915e3b063d0550fc47f817535fbcbe39e9c132a0bc7522"
	if got := fmt.Sprintf("%x", sha256.Sum256([]byte(all.String()))); got != want {
		t.Errorf("SHA-256 of every slot's tag = %s, want %s: the tags changed", got, want)
	}
	for tag, n := range map[string]int{"0": slot.Of("0"), "1": slot.Of("1"), "z": slot.Of("z")} {
		if got := slot.Tag(n); got != tag {
			t.Errorf("Tag(%d) = %q, want %q (the first base-36 number in that slot)", n, got, tag)
		}
	}
}

func TestEmptyTagHashesWholeKey(t *testing.T) {
	// "foo{}{bar}": the first tag is empty, so the whole key is hashed, not "bar".
	if slot.Of("foo{}{bar}") == slot.Of("bar") {
		t.Error(`Of("foo{}{bar}") used "bar" as the hash tag`)
	}
}
