package readside

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"strconv"
	"strings"
	"time"
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

// LockKey names the lock of key: "<ns>:rs:lock:{<tag>}:<key>".
func LockKey(namespace, key string) string { return ownKey(namespace, "lock", key) }

// DeltaKey names the key holding key's last load time δ in milliseconds (a
// decimal integer), beside the value so that the value's bytes stay the
// application's: "<ns>:rs:delta:{<tag>}:<key>".
func DeltaKey(namespace, key string) string { return ownKey(namespace, "delta", key) }

// StaleKey names key's stale copy, the value's bytes behind a 16-byte frame
// (see StaleHeaderLen), kept StaleFor longer than the value:
// "<ns>:rs:stale:{<tag>}:<key>".
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

// tokenLen is the length of a lock owner token.
const tokenLen = 32

// newToken is a lock owner token: 16 random bytes, lowercase hex (32
// characters).
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return hex.EncodeToString(b[:])
}

// isToken reports whether s has the form of an owner token, the only thing a
// reader ever writes under a lock key.
func isToken(s string) bool {
	if len(s) != tokenLen {
		return false
	}
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// LockTTLSlack is how far above its own LockTTL a reader accepts a holder's
// remaining lock TTL; a longer one (or none) is no reader's and is repaired.
// It equals the default LockWait's margin over LockTTL, so that every lock a
// reader waits for lapses within the default LockWait.
const LockTTLSlack = time.Second

// Lock repair reasons (hearth_readside_lock_repairs_total{reason}).
const (
	lockNoTTL         = "no_ttl"
	lockTTLTooLong    = "ttl_too_long"
	lockForeignFormat = "foreign_format"
)

// judgeLock names what is wrong with a lock held by someone else, or returns
// "" for one a reader could have taken: an owner token with at most LockTTL
// (+ LockTTLSlack) left. pttl is the holder's PTTL (-1: none); notString is a
// key of another type.
func judgeLock(holder string, notString bool, pttl, lockTTL time.Duration) string {
	switch {
	case notString:
		return lockForeignFormat
	case pttl == -1:
		return lockNoTTL
	case pttl > lockTTL+LockTTLSlack:
		return lockTTLTooLong
	case !isToken(holder):
		return lockForeignFormat
	}
	return ""
}

// The stale copy's frame: StaleHeaderLen bytes before the value's,
//
//	0..2   magic "\xffhs"
//	3      version (1)
//	4..11  write time, unix milliseconds, big-endian
//	12..15 CRC-32C (Castagnoli) of bytes 0..11 and the value, big-endian
//
// so that a copy readside did not write, a damaged one, or one older than it
// could legitimately be is never served. CRC-32C detects the damage and
// foreign bytes the frame is for (it is not a MAC: whoever can write the
// stale key can write the value itself), and costs a fraction of a
// millisecond per megabyte (hardware instructions on amd64 and arm64).
// Only readside's own stale keys are framed: the values under the
// application's keys stay the application's bytes.
const (
	StaleHeaderLen = 16
	staleMagic     = "\xffhs"
	staleVersion   = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// staleHeader is the frame of v written at t.
func staleHeader(v []byte, t time.Time) []byte {
	h := make([]byte, StaleHeaderLen)
	copy(h, staleMagic)
	h[3] = staleVersion
	binary.BigEndian.PutUint64(h[4:12], uint64(t.UnixMilli()))
	crc := crc32.Update(crc32.Checksum(h[:12], castagnoli), castagnoli, v)
	binary.BigEndian.PutUint32(h[12:], crc)
	return h
}

// Stale copy rejection reasons (hearth_readside_stale_rejected_total{reason}).
const (
	staleUnframed       = "unframed"
	staleUnknownVersion = "unknown_version"
	staleBadChecksum    = "bad_checksum"
	staleTooOld         = "too_old"
	staleFuture         = "future"
)

// staleSkew is how far in the future a copy's write time may be (another
// process's clock ahead of this one's) and still be served.
const staleSkew = time.Minute

// openStale returns the value of a framed copy read at now, written at most
// maxAge before, or the reason it must not be served.
func openStale(b []byte, now time.Time, maxAge time.Duration) ([]byte, string) {
	if len(b) < StaleHeaderLen || string(b[:3]) != staleMagic {
		return nil, staleUnframed
	}
	if b[3] != staleVersion {
		return nil, staleUnknownVersion
	}
	crc := crc32.Update(crc32.Checksum(b[:12], castagnoli), castagnoli, b[StaleHeaderLen:])
	if crc != binary.BigEndian.Uint32(b[12:16]) {
		return nil, staleBadChecksum
	}
	ms := int64(binary.BigEndian.Uint64(b[4:12]))
	age := now.Sub(time.UnixMilli(ms))
	switch {
	case age < -staleSkew:
		return nil, staleFuture
	case age > maxAge:
		return nil, staleTooOld
	}
	return b[StaleHeaderLen:], ""
}
