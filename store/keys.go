package store

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/readside"
)

// Every key of Hearth's own lives under the namespace (redis.namespace), as
// <ns>:…, so that no declaration can name one (keytmpl.InNamespace) and an
// ACL can grant them together.

// LeaseKey is the leader lease: <ns>:{lease}, holding <epoch>:<id>/<attempt>.
// It shares its hash tag with EpochKey, so a Cluster keeps both in one slot
// and Acquire can set them together.
func LeaseKey(ns string) string { return ns + ":{lease}" }

// EpochKey is the epoch counter, <ns>:{lease}:epoch: the last epoch issued.
// The lease, the fenced store and the pre-warm read it.
func EpochKey(ns string) string { return LeaseKey(ns) + ":epoch" }

// ReleaseChannel is the pub/sub channel a leader announces a release on,
// <ns>:lease:released, so that a standby takes over at once.
func ReleaseChannel(ns string) string { return ns + ":lease:released" }

// FenceKey is the single fence of a single node (or Sentinel) Redis: <ns>:fence.
func FenceKey(ns string) string { return ns + ":fence" }

// SlotFenceKey is the fence of hash slot n when fences are per slot (Redis
// Cluster: a script touches keys of one slot only): <ns>:fence:{tag}, with a
// tag in slot n.
func SlotFenceKey(ns string, n int) string { return FenceKey(ns) + ":{" + slot.Tag(n) + "}" }

// VersionKey is the version record of the value key key: <ns>:ver:{tag}:key,
// with tag in key's hash slot (so record and value live on one master and one
// script touches both). It holds <epoch>:<seq>:<version>:<sha1> (see
// ParseVersionRecord).
func VersionKey(ns, key string) string {
	return ns + ":ver:{" + slot.Tag(slot.Of(key)) + "}:" + key
}

// MarkerKey is the re-warm marker, <ns>:warm, whose absence tells the
// re-warm watch that Redis lost its data. It holds the Redis TIME (unix
// seconds) it was written at and has no TTL.
func MarkerKey(ns string) string { return ns + ":warm" }

// ClusterMarkerKey is the marker of the Cluster master whose lowest slot is
// n: MarkerKey with a hash tag in that slot, so that each master holds its
// own and a flush or restart of one master is seen, and re-warmed, alone.
func ClusterMarkerKey(ns string, n int) string { return MarkerKey(ns) + ":{" + slot.Tag(n) + "}" }

// AccessBucketKey is the access-log bucket that starts at start, the sorted
// set applications ZINCRBY per read: <ns>:access:<unix seconds>. The read
// side names it (readside.AccessKey); this is that name, spelled once.
func AccessBucketKey(ns string, start time.Time) string {
	return readside.AccessKey(ns, start, time.Second)
}

// RollupKey is the private name a bucket is renamed to while it is rolled
// up: <ns>:rollup:{<bucket key>}. Its hash tag is the whole bucket key (which
// holds no brace), so in a Cluster it lives in the bucket's slot, as RENAME
// and RollupClaim need; it keeps the namespace prefix, for ACLs and operators.
func RollupKey(ns, bucketKey string) string { return ns + ":rollup:{" + bucketKey + "}" }

// RollupTokenKey is the owner token of the roll-up of RollupKey(ns, bucketKey).
func RollupTokenKey(ns, bucketKey string) string { return RollupKey(ns, bucketKey) + ":token" }

// PerSlot reports whether fences are kept per hash slot: override when set,
// else true for a *redis.ClusterClient. The leader's fenced store and the
// pre-warm decide alike, or a pre-warm would read fences no leader writes.
func PerSlot(client redis.UniversalClient, override *bool) bool {
	if override != nil {
		return *override
	}
	_, ok := client.(*redis.ClusterClient)
	return ok
}

// Fences names the fence keys of one namespace, built once: For runs for
// every key written.
type Fences struct {
	one   string
	slots []string // per slot, nil on a single fence
}

// NewFences names the fences of namespace ns: one per hash slot when perSlot.
func NewFences(ns string, perSlot bool) *Fences {
	f := &Fences{one: FenceKey(ns)}
	if perSlot {
		f.slots = make([]string, slot.Count)
		for i := range f.slots {
			f.slots[i] = SlotFenceKey(ns, i)
		}
	}
	return f
}

// PerSlot reports whether there is one fence per hash slot.
func (f *Fences) PerSlot() bool { return f.slots != nil }

// For returns the fence guarding key: the single fence, or the one in key's
// hash slot.
func (f *Fences) For(key string) string {
	if f.slots == nil {
		return f.one
	}
	return f.slots[slot.Of(key)]
}

// Count is how many fence keys there are: 1, or one per hash slot.
func (f *Fences) Count() int {
	if f.slots == nil {
		return 1
	}
	return len(f.slots)
}

// At returns fence i of Count: the single fence, or slot i's.
func (f *Fences) At(i int) string {
	if f.slots == nil {
		return f.one
	}
	return f.slots[i]
}

// AppendVersionKey appends VersionKey(ns, key) to dst: a batch builds its
// records' names in one buffer rather than one string each.
func AppendVersionKey(dst []byte, ns, key string) []byte {
	dst = append(dst, ns...)
	dst = append(dst, ":ver:{"...)
	dst = append(dst, slot.Tag(slot.Of(key))...)
	dst = append(dst, "}:"...)
	return append(dst, key...)
}
