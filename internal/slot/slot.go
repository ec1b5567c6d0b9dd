// Package slot names the daemon's view of Redis Cluster hash slots and the
// short hash tag per slot. The daemon (per-slot fences) and the read side
// (lock and δ keys in their value's slot) must agree on both, so there is one
// implementation: the read side's (readside.HashSlot, readside.SlotTag), a
// module of its own that cannot import the daemon. go-redis computes slots
// internally but does not export them.
package slot

import "github.com/hearth-dev/hearth/readside"

// Count is the number of hash slots of a Redis Cluster.
const Count = readside.SlotCount

// Of returns the hash slot of key: CRC16 (XMODEM) of the key, or of its hash
// tag (the part between the first '{' and the next '}', when not empty),
// modulo 16384.
func Of(key string) int { return readside.HashSlot(key) }

// Tag returns a short string that, used as a hash tag ("{tag}"), puts a key in
// the given slot: the first base-36 number (0, 1, …, z, 10, …) whose CRC16
// lands in it.
func Tag(slot int) string { return readside.SlotTag(slot) }
