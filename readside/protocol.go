package readside

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/hearth-dev/hearth/internal/slot"
)

// The protocol: key names every reader of the fleet, in any language, must
// compute alike (docs/readside.md). Each key's own keys carry a hash tag in
// the key's Redis Cluster slot, so the scripts that touch them together never
// cross slots, whatever braces the key holds.

// DefaultNamespace is Hearth's default redis.namespace.
const DefaultNamespace = "hearth"

// DefaultAccessBucket is Hearth's default access_log.bucket.
const DefaultAccessBucket = time.Minute

// DefaultNegativeValue is Hearth's default negative_value: the empty string.
const DefaultNegativeValue = ""

// AccessExpiry is the safety-net TTL of an access bucket (EXPIRE … NX): the
// daemon rolls buckets up and deletes them long before.
const AccessExpiry = 24 * time.Hour

// SlotCount is the number of hash slots of a Redis Cluster.
const SlotCount = slot.Count

// LockKey names the lock of key: "<ns>:rs:lock:{<tag>}:<key>".
func LockKey(namespace, key string) string { return ownKey(namespace, "lock", key) }

// DeltaKey names the key holding key's last load time δ in milliseconds (a
// decimal integer), beside the value so that the value's bytes stay the
// application's: "<ns>:rs:delta:{<tag>}:<key>".
func DeltaKey(namespace, key string) string { return ownKey(namespace, "delta", key) }

// StaleKey names key's stale copy, the same bytes kept StaleFor longer than
// the value: "<ns>:rs:stale:{<tag>}:<key>".
func StaleKey(namespace, key string) string { return ownKey(namespace, "stale", key) }

// AccessKey names the access bucket a read at t counts in, as the daemon's
// access log rolls it up: "<ns>:access:<floor(unix/width)*width>".
func AccessKey(namespace string, t time.Time, width time.Duration) string {
	return namespace + ":access:" + strconv.FormatInt(BucketStart(t, width), 10)
}

// BucketStart is the start, in unix seconds, of the bucket of the given width
// (whole seconds, at least 1) that holds t.
func BucketStart(t time.Time, width time.Duration) int64 {
	w := int64(width / time.Second)
	if w <= 0 {
		w = 1
	}
	s := t.Unix()
	return s - ((s%w)+w)%w
}

// ownKey is "<ns>:rs:<kind>:{<tag>}:<key>" with the tag of key's slot. The
// namespace must hold no '{' (New checks), so the tag is the name's first.
func ownKey(namespace, kind, key string) string {
	tag := SlotTag(HashSlot(key))
	var b strings.Builder
	b.Grow(len(namespace) + len(kind) + len(tag) + len(key) + 9)
	b.WriteString(namespace)
	b.WriteString(":rs:")
	b.WriteString(kind)
	b.WriteString(":{")
	b.WriteString(tag)
	b.WriteString("}:")
	b.WriteString(key)
	return b.String()
}

// newToken is a lock owner token: 16 random bytes, hex (32 characters).
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return hex.EncodeToString(b[:])
}

// HashSlot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of the
// key, or of its hash tag (the part between the first '{' and the next '}',
// when not empty), modulo 16384. It is the daemon's warmer.HashSlot.
func HashSlot(key string) int { return slot.Of(key) }

// SlotTag returns the hash tag that puts a key in the given slot: the first
// base-36 number (0, 1, …, z, 10, …) whose CRC16 lands in it, as the daemon's
// warmer.SlotTag names its per-slot fences.
func SlotTag(n int) string { return slot.Tag(n) }
