package soak

import (
	"strconv"
	"strings"
	"sync"
)

// The Cluster variant's key names, spelled here from Redis's cluster
// specification and Hearth's documented protocol (docs/cluster.md,
// docs/readside.md), not imported: the checker must not share Hearth's code.

// Slots is the number of Redis Cluster hash slots.
const Slots = 16384

// Slot is key's Redis Cluster hash slot: CRC16/XMODEM of the key, or of its
// hash tag (between the first '{' and the next '}', when not empty), mod 16384.
func Slot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	return int(crc16(key) % Slots)
}

// SlotTag is the hash tag Hearth names a slot's keys with: the first base-36
// number (0…9, a…z, 10, …) whose CRC16 mod 16384 is the slot. Hearth's fence
// of key k is <ns>:fence:{SlotTag(Slot(k))}, its version record
// <ns>:ver:{SlotTag(Slot(k))}:k.
func SlotTag(slot int) string { return slotTags()[slot] }

var slotTags = sync.OnceValue(func() []string {
	t := make([]string, Slots)
	for i, left := 0, Slots; left > 0; i++ {
		tag := strconv.FormatInt(int64(i), 36)
		if s := crc16(tag) % Slots; t[s] == "" {
			t[s], left = tag, left-1
		}
	}
	return t
})

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// inSlots reports whether slot is in one of the [start, end] ranges.
func inSlots(ranges [][2]int, slot int) bool {
	for _, r := range ranges {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}
