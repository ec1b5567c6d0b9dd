package readside

import (
	"strconv"
	"strings"
	"sync"
)

// The one implementation of Redis Cluster slots and slot tags: this module
// imports nothing of the daemon's, and the daemon's internal/slot calls these,
// so the fences and the read side's lock and δ keys cannot disagree.

// SlotCount is the number of hash slots of a Redis Cluster.
const SlotCount = 16384

// HashSlot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of the
// key, or of its hash tag (the part between the first '{' and the next '}',
// when not empty), modulo 16384, as CLUSTER KEYSLOT computes it.
func HashSlot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	return int(crc16(key) % SlotCount)
}

// SlotTag returns the hash tag that puts a key in the given slot (0 ≤ n <
// SlotCount): the first base-36 number (0, 1, …, z, 10, …) whose CRC16 lands
// in it, as the daemon names its per-slot fences.
func SlotTag(n int) string { return slotTags()[n] }

// slotTags finds, once, a tag for every slot (about 170k CRC16s, a few
// milliseconds).
var slotTags = sync.OnceValue(func() []string {
	t := make([]string, SlotCount)
	left := SlotCount
	for i := 0; left > 0; i++ {
		tag := strconv.FormatInt(int64(i), 36)
		if s := crc16(tag) % SlotCount; t[s] == "" {
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

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), as Redis
// Cluster uses.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^s[i]]
	}
	return crc
}
