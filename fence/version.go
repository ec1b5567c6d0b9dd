package fence

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/store"
)

// Version-aware writes. Every stamped write goes through store.VersionedSet,
// which checks, in the fence's script, a version record beside the value
// (store.VersionKey): a write older than the record (by origin version, else
// by its (epoch, seq) stamp) is refused, one whose bytes Redis already holds
// only extends the TTL, and a record that is malformed or not backed by its
// value is repaired or reported for a re-read (store.VersionCheck.Recheck).
// The rules, and why, are in docs/freshness.md#version-aware-writes.

// versionedSetManyChunk bounds the keys of one store.VersionedSetMany call.
const versionedSetManyChunk = 128

// versionMetrics counts what the version check did, per declaration.
type versionMetrics struct {
	refused  *prometheus.CounterVec
	extended *prometheus.CounterVec
}

func newVersionMetrics(reg prometheus.Registerer) *versionMetrics {
	f := promauto.With(reg)
	m := &versionMetrics{
		refused: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_version_refused_writes_total",
			Help: "Writes Redis refused because the key's version record holds a newer version, or a load started later already wrote it.",
		}, []string{"family"}),
		extended: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_conditional_extends_total",
			Help: "Writes whose value was byte-identical to the value in Redis (compared in the script): the TTL was extended, the value not rewritten.",
		}, []string{"family"}),
	}
	return m
}

// WriteResults counts the outcome of one versioned write.
type WriteResults struct {
	Written, Extended, Older int
}

// setChecked is set, reporting for each entry what the version check found
// wrong at its key (warmer.CheckedStore): a foreign record repaired, a value
// that was not the bytes its record says Hearth wrote, a refusal by a record
// its value does not back (Recheck). Entries that are not stamped get the
// zero VersionCheck (and when none is, checks is nil).
func (s *FencedStore) setChecked(ctx context.Context, t *leader.Term, entries []store.Entry) ([]store.VersionCheck, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	if _, some := stamped(entries); !some {
		return nil, s.set(ctx, t, entries) // nothing to check, nothing found
	}
	return s.setStampedChecked(ctx, t, entries)
}

// setVersioned writes stamped entries through the version check, pipelined:
// under a single fence key versionedSetManyChunk keys per script call, per
// slot (Cluster) one script per key. Entries refused as older are not an
// error: a newer value is in Redis, or checks[i].Recheck asks for a re-read.
func (s *FencedStore) setVersioned(ctx context.Context, t *leader.Term, entries []store.Entry) (WriteResults, []store.VersionCheck, error) {
	var res WriteResults
	checks := make([]store.VersionCheck, len(entries))
	epoch := strconv.FormatInt(t.Epoch, 10)
	var refused int
	var err error
	if s.perSlot {
		refused, err = s.setVersionedEach(ctx, epoch, entries, &res, checks)
	} else {
		refused, err = s.setVersionedMany(ctx, epoch, entries, &res, checks)
	}
	if err != nil {
		return res, checks, fmt.Errorf("write %d keys: %w", len(entries), err)
	}
	if refused > 0 {
		s.fenced.WithLabelValues("set").Add(float64(refused))
		t.Fenced()
		return res, checks, fmt.Errorf("write %d keys with epoch %d: %d refused: %w", len(entries), t.Epoch, refused, leader.ErrFenced)
	}
	return res, checks, nil
}

// versionArgs are an entry's script arguments after the epoch: value, ttl
// ms, seq, version (20 digits or empty), value hash, record ttl ms.
func versionArgs(e store.Entry) []any {
	ver := ""
	if e.Versioned {
		ver = store.EncodeVersion(e.Version)
	}
	return []any{e.Value, max(1, e.TTL.Milliseconds()), e.Seq, ver, store.ValueHash(e.Value), recordTTLMillis(e)}
}

// recordTTLMillis is how long e's version record lives, in ms: e.VersionTTL,
// else twice the value's TTL (store.Entry.VersionTTL), at least 1.
func recordTTLMillis(e store.Entry) int64 {
	vttl := e.VersionTTL
	if vttl <= 0 {
		vttl = 2 * e.TTL
	}
	return max(1, vttl.Milliseconds())
}

// setVersionedEach runs store.VersionedSet once per entry; it returns how many
// the fence refused.
func (s *FencedStore) setVersionedEach(ctx context.Context, epoch string, entries []store.Entry, res *WriteResults, checks []store.VersionCheck) (int, error) {
	cmds, err := s.run(ctx, store.VersionedSet, len(entries), func(i int) ([]string, []any) {
		e := entries[i]
		return []string{e.Key, s.FenceKey(e.Key), store.VersionKey(s.ns, e.Key)}, append(append([]any{epoch}, versionArgs(e)...), e.Unconfirmed)
	})
	if err != nil {
		return 0, err
	}
	refused := 0
	var counts versionCounts
	defer counts.flush(s.ver)
	for i, c := range cmds {
		r, fbad, err := store.VersionedReply(c)
		if err != nil {
			return 0, err
		}
		if fbad != "" {
			s.repairs.Repaired(store.KindFence, s.FenceKey(entries[i].Key), fbad)
		}
		if r.Code == store.CodeFenced {
			refused++
			continue
		}
		checks[i] = s.countVersioned(res, entries[i], r, &counts)
	}
	return refused, nil
}

// setVersionedMany runs store.VersionedSetMany over chunks of entries under
// the single fence key; it returns how many the fence refused. A chunk is at
// most versionedSetManyChunk entries of one stamp and record TTL (one load's
// entries share both), which the call passes once.
func (s *FencedStore) setVersionedMany(ctx context.Context, epoch string, entries []store.Entry, res *WriteResults, checks []store.VersionCheck) (int, error) {
	a := getPackedArgs(s.ns, entries)
	defer putPackedArgs(a)
	var bounds []int // chunk i is entries[bounds[i]:bounds[i+1]]
	for i := range entries {
		if i == 0 || i-bounds[len(bounds)-1] == versionedSetManyChunk ||
			entries[i].Seq != entries[i-1].Seq || a.vttls[i] != a.vttls[i-1] {
			bounds = append(bounds, i)
		}
	}
	bounds = append(bounds, len(entries))
	chunks := len(bounds) - 1
	cmd := getArgs(chunks*(store.ScriptHead+4) + 6*len(entries))
	defer func() { putArgs(cmd) }()
	cmds, err := store.RunPacked(ctx, s.client, store.VersionedSetMany, chunks, func(i int) ([]any, int) {
		lo, hi := bounds[i], bounds[i+1]
		c0 := len(cmd)
		cmd = append(cmd, nil, nil, nil, &s.fence)
		for j := lo; j < hi; j++ {
			cmd = append(cmd, &entries[j].Key, &a.records[j])
		}
		cmd = append(cmd, epoch, &entries[lo].Seq, &a.vttls[lo])
		for j := lo; j < hi; j++ {
			e := &entries[j]
			cmd = append(cmd, (*store.Bytes)(&e.Value), &a.ttls[j], &a.versions[j], &a.hashes[j])
		}
		for j := lo; j < hi; j++ {
			if entries[j].Unconfirmed != "" {
				cmd = append(cmd, j-lo+1, &entries[j].Unconfirmed)
			}
		}
		return cmd[c0:len(cmd):len(cmd)], 1 + 2*(hi-lo)
	})
	if err != nil {
		return 0, err
	}
	refused := 0
	var c versionCounts
	for i, cm := range cmds {
		lo, hi := bounds[i], bounds[i+1]
		replies, fbad, err := store.VersionedManyReply(cm, hi-lo)
		if err != nil {
			return 0, err
		}
		if fbad != "" {
			s.repairs.Repaired(store.KindFence, s.fence, fbad)
		}
		if replies == nil {
			refused += hi - lo
			continue
		}
		for j, e := range entries[lo:hi] {
			checks[lo+j] = s.countVersioned(res, e, replies[j], &c)
		}
	}
	c.flush(s.ver)
	return refused, nil
}

// packedArgs holds a batch's per-key script arguments that are not fields
// of its entries, each kind in one array and every byte string cut from one
// buffer, passed to Redis as they are (store.Bytes): a version-checked write
// of n keys allocates nothing per key, and the arrays are reused from batch
// to batch (packedPool) rather than collected.
type packedArgs struct {
	buf                       []byte
	records, versions, hashes []store.Bytes
	ttls, vttls               []int64
}

var packedPool sync.Pool

// getPackedArgs fills a packedArgs from packedPool for entries: record name,
// version and value hash per entry, and the TTLs in ms. Give it back with
// putPackedArgs once the commands that point into it are read.
func getPackedArgs(ns string, entries []store.Entry) *packedArgs {
	a, _ := packedPool.Get().(*packedArgs)
	if a == nil {
		a = &packedArgs{}
	}
	n := len(entries)
	size := 0
	for _, e := range entries {
		size += len(ns) + len(e.Key) + 16 + 20 + 40
	}
	a.buf = slices.Grow(a.buf[:0], size)
	a.records = slices.Grow(a.records[:0], n)[:n]
	a.versions = slices.Grow(a.versions[:0], n)[:n]
	a.hashes = slices.Grow(a.hashes[:0], n)[:n]
	a.ttls = slices.Grow(a.ttls[:0], n)[:n]
	a.vttls = slices.Grow(a.vttls[:0], n)[:n]
	// Each string is cut from the buffer as it fills. The size above leaves
	// room for the longest slot tag (4 characters); were an append to move
	// the buffer, the strings cut before it keep the old array, still whole.
	cut := func(at int) store.Bytes { return a.buf[at:len(a.buf):len(a.buf)] }
	for i, e := range entries {
		at := len(a.buf)
		a.buf = store.AppendVersionKey(a.buf, ns, e.Key)
		a.records[i] = cut(at)
		at = len(a.buf)
		if e.Versioned {
			a.buf = store.AppendVersion(a.buf, e.Version)
		}
		a.versions[i] = cut(at)
		at = len(a.buf)
		a.buf = store.AppendValueHash(a.buf, e.Value)
		a.hashes[i] = cut(at)
		a.ttls[i], a.vttls[i] = max(1, e.TTL.Milliseconds()), recordTTLMillis(e)
	}
	return a
}

// putPackedArgs returns a to packedPool; a batch far larger than the usual
// is left to the collector, so that the pool does not keep its memory.
func putPackedArgs(a *packedArgs) {
	if cap(a.buf) > 1<<20 {
		return
	}
	packedPool.Put(a)
}

// versionCounts gathers a write's conditional extends and refusals per
// declaration, counted once per write instead of once per key.
type versionCounts struct {
	family            string
	extended, refused int
}

func (c *versionCounts) add(family string, extended, refused int, m *versionMetrics) {
	if family != c.family {
		c.flush(m)
		c.family = family
	}
	c.extended += extended
	c.refused += refused
}

func (c *versionCounts) flush(m *versionMetrics) {
	if c.extended > 0 {
		m.extended.WithLabelValues(c.family).Add(float64(c.extended))
	}
	if c.refused > 0 {
		m.refused.WithLabelValues(c.family).Add(float64(c.refused))
	}
	c.extended, c.refused = 0, 0
}

// countVersioned counts one key's outcome other than fenced (in res, and
// in c for the metrics), and a repair of its version record, and says what
// the check found wrong.
func (s *FencedStore) countVersioned(res *WriteResults, e store.Entry, r store.KeyReply, c *versionCounts) store.VersionCheck {
	switch r.Code {
	case store.CodeWritten:
		res.Written++
	case store.CodeExtended:
		res.Extended++
		c.add(e.Family, 1, 0, s.ver)
	case store.CodeOlder, store.CodeUnbacked:
		res.Older++
		c.add(e.Family, 0, 1, s.ver)
	}
	if r.Record == "" && r.Why == "" && r.Detail == "" {
		return store.VersionCheck{}
	}
	vk := store.VersionKey(s.ns, e.Key)
	if r.Record != "" {
		s.repairs.Repaired(store.KindVersion, vk, r.Record)
	}
	ch := store.VersionCheck{Reason: r.Why, Found: r.Detail}
	switch {
	case r.Code == store.CodeUnbacked:
		ch.Recheck, ch.Record = true, r.Detail
		ch.Found = "record " + r.Detail + " refused the write, but its value is not the bytes it was written with"
		if r.Why == store.RepairValueAbsent {
			ch.Found = "record " + r.Detail + " refused the write, but its value is absent"
		}
	case r.Record != "":
		ch.Found = vk + " held " + r.Record
	}
	return ch
}

// setStamped writes the stamped entries through the version check and the
// others (written by a caller that does not stamp) through the plain fence
// script.
func (s *FencedStore) setStamped(ctx context.Context, t *leader.Term, entries []store.Entry) error {
	_, err := s.setStampedChecked(ctx, t, entries)
	return err
}

// setStampedChecked is setStamped; checks[i] is what the version check found
// at entries[i]'s key.
func (s *FencedStore) setStampedChecked(ctx context.Context, t *leader.Term, entries []store.Entry) ([]store.VersionCheck, error) {
	if all, _ := stamped(entries); all {
		_, vc, err := s.setVersioned(ctx, t, entries)
		return vc, err
	}
	var plain, vers []store.Entry
	var at []int
	for i, e := range entries {
		if e.Seq > 0 {
			vers = append(vers, e)
			at = append(at, i)
		} else {
			plain = append(plain, e)
		}
	}
	if len(plain) > 0 {
		if err := s.set(ctx, t, plain); err != nil {
			return nil, err
		}
	}
	_, vc, err := s.setVersioned(ctx, t, vers)
	if len(plain) == 0 {
		return vc, err
	}
	checks := make([]store.VersionCheck, len(entries))
	for j, i := range at {
		checks[i] = vc[j]
	}
	return checks, err
}

// stamped reports whether every entry carries a load stamp.
func stamped(entries []store.Entry) (all, some bool) {
	n := 0
	for _, e := range entries {
		if e.Seq > 0 {
			n++
		}
	}
	return n == len(entries), n > 0
}
