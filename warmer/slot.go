package warmer

import (
	"strconv"
	"strings"
	"sync"
)

// SlotCount is the number of hash slots of a Redis Cluster.
const SlotCount = 16384

// HashSlot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of the
// key, or of its hash tag (the part between the first '{' and the next '}',
// when not empty), modulo 16384. go-redis computes the same internally but does
// not export it.
func HashSlot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	return int(crc16(key) % SlotCount)
}

// SlotTag returns a short string that, used as a hash tag ("{tag}"), puts a key
// in the given slot; Hearth names one fence key per slot with it.
func SlotTag(slot int) string { return slotTags()[slot] }

// slotTags finds, once, a base-36 tag for every slot (about 170k CRC16s, a
// few milliseconds).
var slotTags = sync.OnceValue(func() []string {
	tags := make([]string, SlotCount)
	left := SlotCount
	for i := 0; left > 0; i++ {
		tag := strconv.FormatInt(int64(i), 36)
		if s := crc16(tag) % SlotCount; tags[s] == "" {
			tags[s] = tag
			left--
		}
	}
	return tags
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
