// Package slot computes Redis Cluster hash slots and a short hash tag per slot.
// The daemon (per-slot fences) and the read side (lock and δ keys in their
// value's slot) must agree on both. The read side is a module of its own and
// cannot import this package, so it keeps a copy (readside.HashSlot and
// readside.SlotTag); TestReadsideCopyAgrees compares the two. go-redis
// computes slots internally but does not export them.
package slot

import (
	"strconv"
	"strings"
	"sync"
)

// Count is the number of hash slots of a Redis Cluster.
const Count = 16384

// Of returns the hash slot of key: CRC16 (XMODEM) of the key, or of its hash
// tag (the part between the first '{' and the next '}', when not empty),
// modulo 16384.
func Of(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	return int(crc16(key) % Count)
}

// Tag returns a short string that, used as a hash tag ("{tag}"), puts a key in
// the given slot: the first base-36 number (0, 1, …, z, 10, …) whose CRC16
// lands in it.
func Tag(slot int) string { return tags()[slot] }

// tags finds, once, a tag for every slot (about 170k CRC16s, a few
// milliseconds).
var tags = sync.OnceValue(func() []string {
	t := make([]string, Count)
	left := Count
	for i := 0; left > 0; i++ {
		tag := strconv.FormatInt(int64(i), 36)
		if s := crc16(tag) % Count; t[s] == "" {
			t[s] = tag
			left--
		}
	}
	return t
})

var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), as Redis Cluster uses.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc
}
