package warmer

import "github.com/hearth-dev/hearth/internal/slot"

// SlotCount is the number of hash slots of a Redis Cluster.
const SlotCount = slot.Count

// HashSlot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of the
// key, or of its hash tag (the part between the first '{' and the next '}',
// when not empty), modulo 16384. go-redis computes the same internally but does
// not export it.
func HashSlot(key string) int { return slot.Of(key) }

// SlotTag returns a short string that, used as a hash tag ("{tag}"), puts a key
// in the given slot; Hearth names one fence key per slot with it.
func SlotTag(n int) string { return slot.Tag(n) }
