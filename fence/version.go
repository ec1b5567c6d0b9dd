package fence

import (
	"context"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// Version-aware writes. Every write the warmer makes is stamped (Entry.Seq,
// and Entry.Version when the declaration names a version column) and goes
// through store.VersionedSet, which, in the same script as the fence check,
// keeps a version record beside the value:
//
//	{ns}:ver:{tag}:<value key>  =  <epoch>:<seq>:<version>:<hash>
//
// with {tag} the value key's hash slot (so record and value live on one
// Cluster master and one script touches both), epoch the writing term, seq the
// order in which the writer started the load, version the origin's version
// (20 digits, empty without a version column) and hash the SHA-1 of the value
// (40 hex digits, what the script's redis.sha1hex computes; records of earlier
// releases carry 32 and are never taken as proof of a value). A write is
// refused as older when both it and the record carry an origin version and
// its version is lower, or else when its stamp (epoch, seq) is lower than the
// record's: the load that started last is the one that lands. A write whose
// bytes are those in Redis, byte for byte, only extends the value's TTL (a
// conditional extend); same version and length prove nothing.
//
// The record is untrusted: anything but the exact format (a version above
// the encoding's range included), or, when it would refuse or spare the
// write, a TTL missing or longer than the declaration ever sets or an epoch
// beyond Redis TIME + MaxEpochAhead, is treated as absent, overwritten, logged
// and counted (hearth_state_repairs_total{key="version"}). A record that
// refuses a write must also be backed by its value: when the value is absent
// or its SHA-1 is not the record's, the write is refused but reported for a
// re-read (warmer.VersionCheck.Recheck); the writer re-reads the origin and, if
// the origin's version is still below the record's, writes again naming the
// record (Entry.Unconfirmed), which the script then replaces if it is still
// there, unchanged. So a planted far-future record costs one extra load, and a
// record whose value is present and backs it holds the key's writes off at
// most until that value expires.

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
// zero VersionCheck.
func (s *FencedStore) setChecked(ctx context.Context, t *leader.Term, entries []warmer.Entry) ([]warmer.VersionCheck, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	if _, some := stamped(entries); !some {
		return make([]warmer.VersionCheck, len(entries)), s.set(ctx, t, entries)
	}
	return s.setStampedChecked(ctx, t, entries)
}

// setVersioned writes stamped entries through the version check, pipelined:
// under a single fence key versionedSetManyChunk keys per script call, per
// slot (Cluster) one script per key. Entries refused as older are not an
// error: a newer value is in Redis, or checks[i].Recheck asks for a re-read.
func (s *FencedStore) setVersioned(ctx context.Context, t *leader.Term, entries []warmer.Entry) (WriteResults, []warmer.VersionCheck, error) {
	var res WriteResults
	checks := make([]warmer.VersionCheck, len(entries))
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
func versionArgs(e warmer.Entry) []any {
	ver := ""
	if e.Versioned {
		ver = store.EncodeVersion(e.Version)
	}
	vttl := e.VersionTTL
	if vttl <= 0 {
		vttl = 2 * e.TTL
	}
	return []any{e.Value, max(1, e.TTL.Milliseconds()), e.Seq, ver, store.ValueHash(e.Value), max(1, vttl.Milliseconds())}
}

// setVersionedEach runs store.VersionedSet once per entry; it returns how many
// the fence refused.
func (s *FencedStore) setVersionedEach(ctx context.Context, epoch string, entries []warmer.Entry, res *WriteResults, checks []warmer.VersionCheck) (int, error) {
	cmds, err := s.run(ctx, store.VersionedSet, len(entries), func(i int) ([]string, []any) {
		e := entries[i]
		return []string{e.Key, s.FenceKey(e.Key), store.VersionKey(s.ns, e.Key)}, append(append([]any{epoch}, versionArgs(e)...), e.Unconfirmed)
	})
	if err != nil {
		return 0, err
	}
	refused := 0
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
		checks[i] = s.countVersioned(res, entries[i], r)
	}
	return refused, nil
}

// setVersionedMany runs store.VersionedSetMany over chunks of entries under
// the single fence key; it returns how many the fence refused.
func (s *FencedStore) setVersionedMany(ctx context.Context, epoch string, entries []warmer.Entry, res *WriteResults, checks []warmer.VersionCheck) (int, error) {
	chunks := (len(entries) + versionedSetManyChunk - 1) / versionedSetManyChunk
	part := func(i int) []warmer.Entry {
		return entries[i*versionedSetManyChunk : min(len(entries), (i+1)*versionedSetManyChunk)]
	}
	cmds, err := s.run(ctx, store.VersionedSetMany, chunks, func(i int) ([]string, []any) {
		es := part(i)
		keys, argv := make([]string, 0, 1+2*len(es)), make([]any, 0, 1+7*len(es))
		keys, argv = append(keys, s.fence), append(argv, epoch)
		for _, e := range es {
			keys = append(keys, e.Key, store.VersionKey(s.ns, e.Key))
			argv = append(append(argv, versionArgs(e)...), e.Unconfirmed)
		}
		return keys, argv
	})
	if err != nil {
		return 0, err
	}
	refused := 0
	for i, c := range cmds {
		es := part(i)
		replies, fbad, err := store.VersionedManyReply(c, len(es))
		if err != nil {
			return 0, err
		}
		if fbad != "" {
			s.repairs.Repaired(store.KindFence, s.fence, fbad)
		}
		if replies == nil {
			refused += len(es)
			continue
		}
		for j, e := range es {
			checks[i*versionedSetManyChunk+j] = s.countVersioned(res, e, replies[j])
		}
	}
	return refused, nil
}

// countVersioned counts one key's outcome other than fenced, and a repair of
// its version record, and says what the check found wrong.
func (s *FencedStore) countVersioned(res *WriteResults, e warmer.Entry, r store.KeyReply) warmer.VersionCheck {
	vk := store.VersionKey(s.ns, e.Key)
	if r.Record != "" {
		s.repairs.Repaired(store.KindVersion, vk, r.Record)
	}
	switch r.Code {
	case store.CodeWritten:
		res.Written++
	case store.CodeExtended:
		res.Extended++
		s.ver.extended.WithLabelValues(e.Family).Inc()
	case store.CodeOlder, store.CodeUnbacked:
		res.Older++
		s.ver.refused.WithLabelValues(e.Family).Inc()
	}
	c := warmer.VersionCheck{Reason: r.Why, Found: r.Detail}
	switch {
	case r.Code == store.CodeUnbacked:
		c.Recheck, c.Record = true, r.Detail
		c.Found = "record " + r.Detail + " refused the write, but its value is not the bytes it was written with"
		if r.Why == warmer.RepairValueAbsent {
			c.Found = "record " + r.Detail + " refused the write, but its value is absent"
		}
	case r.Record != "":
		c.Found = vk + " held " + r.Record
	}
	return c
}

// setStamped writes the stamped entries through the version check and the
// others (written by a caller that does not stamp) through the plain fence
// script.
func (s *FencedStore) setStamped(ctx context.Context, t *leader.Term, entries []warmer.Entry) error {
	_, err := s.setStampedChecked(ctx, t, entries)
	return err
}

// setStampedChecked is setStamped; checks[i] is what the version check found
// at entries[i]'s key.
func (s *FencedStore) setStampedChecked(ctx context.Context, t *leader.Term, entries []warmer.Entry) ([]warmer.VersionCheck, error) {
	var plain, vers []warmer.Entry
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
	checks := make([]warmer.VersionCheck, len(entries))
	for j, i := range at {
		checks[i] = vc[j]
	}
	return checks, err
}

// stamped reports whether every entry carries a load stamp.
func stamped(entries []warmer.Entry) (all, some bool) {
	n := 0
	for _, e := range entries {
		if e.Seq > 0 {
			n++
		}
	}
	return n == len(entries), n > 0
}
