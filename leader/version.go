package leader

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/hstate"
	"github.com/hearth-dev/hearth/warmer"
)

// Version-aware writes. Every write the warmer makes is stamped (Entry.Seq,
// and Entry.Version when the declaration names a version column) and goes
// through versionedSetScript, which, in the same script as the fence check,
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

// VersionKey returns the key of the version record of the value key key:
// {ns}:ver:{tag}:key, in key's hash slot.
func VersionKey(ns, key string) string {
	return ns + ":ver:{" + warmer.SlotTag(warmer.HashSlot(key)) + "}:" + key
}

// EncodeVersion maps an int64 origin version to the 20-digit decimal string
// the script compares: order-preserving over the whole int64 range, negative
// versions included (the sign bit is flipped).
func EncodeVersion(v int64) string {
	return fmt.Sprintf("%020d", uint64(v)^(1<<63))
}

// valueHash is what the version record remembers of a value: its SHA-1 in
// lowercase hex, as the script's redis.sha1hex computes it, so that the script
// can tell whether the value in Redis is the one a record was written with.
func valueHash(v []byte) string {
	h := sha1.Sum(v) // a content check, not a security boundary
	return hex.EncodeToString(h[:])
}

// Write outcomes of versionedSetScript.
const (
	codeFenced   = 0
	codeWritten  = 1
	codeExtended = 2
	codeOlder    = 3
	// codeUnbacked: refused as older by a record whose value is absent or
	// not the bytes it was written with; the caller re-reads the origin.
	codeUnbacked = 4
)

// versionLua holds the version check of one key, shared by the one-key and
// the many-key script. hearth_versioned_set(e, es, vk, rk, value, ttl, seq,
// ver, hash, vttl, suspect), run after the fence check passed for epoch e (es
// its decimal string), writes value key vk and its record rk, or refuses the
// write as older, or only extends vk's TTL (vk holds these very bytes). It
// returns the code (1 written, 2 extended, 3 older, 4 older but the record is
// not backed by its value), a description of a foreign record it repaired
// ("" when none), the reason of what it found wrong ("" when nothing:
// record_malformed, record_unconfirmed, value_mismatch, value_absent) and,
// with code 4, the record, else a description of the foreign value. suspect,
// when not nil or "", is a record the caller's re-read of the origin did not
// confirm: if rk still holds exactly it, it would refuse the write and its
// value still does not back it, it is treated as absent. A value's bytes
// never leave the script: a foreign value is described by its length and a
// prefix of its SHA-1.
const versionLua = `
local hearth_vmax = '18446744073709551615'
local function hearth_vcmp(a, b)
  local a1, b1 = tonumber(string.sub(a, 1, 10)), tonumber(string.sub(b, 1, 10))
  if a1 ~= b1 then if a1 < b1 then return -1 end return 1 end
  local a2, b2 = tonumber(string.sub(a, 11)), tonumber(string.sub(b, 11))
  if a2 ~= b2 then if a2 < b2 then return -1 end return 1 end
  return 0
end
local function hearth_vdesc(vk, v)
  if type(v) == 'table' then return hearth_type(vk) end
  return string.len(v) .. ' bytes, sha1 ' .. string.sub(redis.sha1hex(v), 1, 12)
end
local function hearth_versioned_set(e, es, vk, rk, value, ttl, seqs, ver, hash, vttls, suspect)
  local seq, vttl = tonumber(seqs), tonumber(vttls)
  local vbad, why = '', ''
  local ce, cs, cv, ch, ca
  local cur = redis.pcall('GET', rk)
  if type(cur) == 'table' and cur.err then
    vbad = hearth_type(rk)
  elseif cur then
    local a, b, c, d = string.match(cur, '^(%d+):(%d+):(%d*):(%x+)$')
    if not a or string.len(a) > 16 or string.len(b) > 16 or
      (c ~= '' and (string.len(c) ~= 20 or c > hearth_vmax)) or
      (string.len(d) ~= 40 and string.len(d) ~= 32) then
      vbad = string.sub(cur, 1, 64)
    else
      ce, cs, cv, ch, ca = tonumber(a), tonumber(b), c, d, a
    end
  end
  local older = false
  if ce then
    if ver ~= '' and cv ~= '' then
      older = hearth_vcmp(ver, cv) < 0
    else
      older = ce > e or (ce == e and cs > seq)
    end
    -- A record that would refuse or spare this write must be Hearth's: its TTL
    -- within what the declaration sets, its epoch not beyond TIME. One this
    -- write overwrites anyway is not looked at further.
    if older or (ch == hash and cv == ver) then
      local pt = redis.call('PTTL', rk)
      if pt < 0 or pt > vttl then
        vbad = 'ttl ' .. pt .. ': ' .. string.sub(cur, 1, 48)
      elseif ce > e and not hearth_epoch_ok(ca, hearth_now_ms()) then
        vbad = 'epoch ahead: ' .. string.sub(cur, 1, 48)
      end
      if vbad ~= '' then ce, older = nil, false end
    end
  end
  if vbad ~= '' then why = 'record_malformed' end
  if older then
    -- A record only protects the value it was written with: absent or other
    -- bytes, and the caller re-reads the origin rather than leave them.
    local v, lack = redis.pcall('GET', vk), ''
    if not v then
      lack = 'value_absent'
    elseif type(v) ~= 'string' or string.len(ch) ~= 40 or redis.sha1hex(v) ~= ch then
      lack = 'value_mismatch'
    end
    if lack == '' then return 3, vbad, '', '' end
    if not (suspect and suspect ~= '' and cur == suspect) then return 4, vbad, lack, cur end
    -- The origin, re-read after this record refused a write it did not back,
    -- is still older: a version the origin never confirmed.
    vbad, why = 'unconfirmed: ' .. string.sub(cur, 1, 52), 'record_unconfirmed'
    ce = nil
  end
  local rec = es .. ':' .. seqs .. ':' .. ver .. ':' .. hash
  local info = ''
  if ce and ch == hash and cv == ver then
    -- The record says Redis holds these bytes: extend only if it does, byte
    -- for byte (same version and length prove nothing).
    local v = redis.pcall('GET', vk)
    if v == value then
      redis.call('PEXPIRE', vk, ttl)
      redis.call('SET', rk, rec, 'PX', vttl)
      return 2, vbad, why, ''
    end
    if v then
      why, info = 'value_mismatch', hearth_vdesc(vk, v) .. ' where hearth wrote ' .. string.len(value) .. ' bytes'
    end
  end
  redis.call('SET', vk, value, 'PX', ttl)
  redis.call('SET', rk, rec, 'PX', vttl)
  return 1, vbad, why, info
end
`

// versionedSetScript: KEYS value, fence, version record; ARGV epoch, value,
// ttl ms, seq, version (20 digits or empty), hash, record ttl ms, suspect
// record (or empty). Replies {code, fence found, record found, reason, info}
// (see versionLua): code 0 fenced, 1 written, 2 extended (the same bytes were
// there), 3 refused as older, 4 refused as older by a record its value does
// not back; a found string is non-empty when that key held a foreign value
// that was repaired. Idempotent: run twice, the second run extends (same
// stamp and bytes) or refuses.
var versionedSetScript = newFencedScript(versionLua + `
local ok, bad = hearth_fence(KEYS[2], ARGV[1])
bad = bad or ''
if not ok then return {0, bad, '', '', ''} end
local code, vbad, why, info = hearth_versioned_set(tonumber(ARGV[1]), ARGV[1], KEYS[1], KEYS[3], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
return {code, bad, vbad, why, info}
`)

// versionedSetManyScript is versionedSetScript for many keys under one fence
// key (a single node): KEYS fence, then value and record for each key; ARGV
// epoch, then value, ttl ms, seq, version, hash, record ttl ms and suspect
// record for each key. Replies {0, fence found} when fenced (no key written),
// else {1, fence found, then code, record found, reason, info for each key}.
var versionedSetManyScript = newFencedScript(versionLua + `
local ok, bad = hearth_fence(KEYS[1], ARGV[1])
bad = bad or ''
if not ok then return {0, bad} end
local e = tonumber(ARGV[1])
local out = {1, bad}
for i = 1, (#KEYS - 1) / 2 do
  local b = 1 + 7 * (i - 1)
  local code, vbad, why, info = hearth_versioned_set(e, ARGV[1], KEYS[2*i], KEYS[2*i+1], ARGV[b+1], ARGV[b+2], ARGV[b+3], ARGV[b+4], ARGV[b+5], ARGV[b+6], ARGV[b+7])
  out[#out+1] = code
  out[#out+1] = vbad
  out[#out+1] = why
  out[#out+1] = info
end
return out
`)

// versionedSetManyChunk bounds the keys of one versionedSetManyScript call.
const versionedSetManyChunk = 128

// versionMetrics counts what the version check did, per declaration.
type versionMetrics struct {
	refused  *prometheus.CounterVec
	extended *prometheus.CounterVec
}

func newVersionMetrics(reg prometheus.Registerer) *versionMetrics {
	m := &versionMetrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_version_refused_writes_total",
			Help: "Writes Redis refused because the key's version record holds a newer version, or a load started later already wrote it.",
		}, []string{"family"}),
		extended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_conditional_extends_total",
			Help: "Writes whose value was byte-identical to the value in Redis (compared in the script): the TTL was extended, the value not rewritten.",
		}, []string{"family"}),
	}
	reg.MustRegister(m.refused, m.extended)
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
func (s *FencedStore) setChecked(ctx context.Context, t *Term, entries []warmer.Entry) ([]warmer.VersionCheck, error) {
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
func (s *FencedStore) setVersioned(ctx context.Context, t *Term, entries []warmer.Entry) (WriteResults, []warmer.VersionCheck, error) {
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
		return res, checks, fmt.Errorf("write %d keys with epoch %d: %d refused: %w", len(entries), t.Epoch, refused, ErrFenced)
	}
	return res, checks, nil
}

// versionArgs are an entry's script arguments after the epoch: value, ttl
// ms, seq, version (20 digits or empty), value hash, record ttl ms.
func versionArgs(e warmer.Entry) []any {
	ver := ""
	if e.Versioned {
		ver = EncodeVersion(e.Version)
	}
	vttl := e.VersionTTL
	if vttl <= 0 {
		vttl = 2 * e.TTL
	}
	return []any{e.Value, max(1, e.TTL.Milliseconds()), e.Seq, ver, valueHash(e.Value), max(1, vttl.Milliseconds())}
}

// keyReply is what the version check replied for one key.
type keyReply struct {
	code                int64
	record, why, detail string
}

// setVersionedEach runs versionedSetScript once per entry; it returns how many
// the fence refused.
func (s *FencedStore) setVersionedEach(ctx context.Context, epoch string, entries []warmer.Entry, res *WriteResults, checks []warmer.VersionCheck) (int, error) {
	cmds, err := s.run(ctx, versionedSetScript, len(entries), func(i int) ([]string, []any) {
		e := entries[i]
		return []string{e.Key, s.FenceKey(e.Key), VersionKey(s.ns, e.Key)}, append(append([]any{epoch}, versionArgs(e)...), e.Unconfirmed)
	})
	if err != nil {
		return 0, err
	}
	refused := 0
	for i, c := range cmds {
		r, fbad, err := versionedReply(c)
		if err != nil {
			return 0, err
		}
		if fbad != "" {
			s.repairs.Repaired(hstate.KindFence, s.FenceKey(entries[i].Key), fbad)
		}
		if r.code == codeFenced {
			refused++
			continue
		}
		checks[i] = s.countVersioned(res, entries[i], r)
	}
	return refused, nil
}

// setVersionedMany runs versionedSetManyScript over chunks of entries under
// the single fence key; it returns how many the fence refused.
func (s *FencedStore) setVersionedMany(ctx context.Context, epoch string, entries []warmer.Entry, res *WriteResults, checks []warmer.VersionCheck) (int, error) {
	chunks := (len(entries) + versionedSetManyChunk - 1) / versionedSetManyChunk
	part := func(i int) []warmer.Entry {
		return entries[i*versionedSetManyChunk : min(len(entries), (i+1)*versionedSetManyChunk)]
	}
	cmds, err := s.run(ctx, versionedSetManyScript, chunks, func(i int) ([]string, []any) {
		es := part(i)
		keys, argv := make([]string, 0, 1+2*len(es)), make([]any, 0, 1+7*len(es))
		keys, argv = append(keys, s.fence), append(argv, epoch)
		for _, e := range es {
			keys = append(keys, e.Key, VersionKey(s.ns, e.Key))
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
		replies, fbad, err := versionedManyReply(c, len(es))
		if err != nil {
			return 0, err
		}
		if fbad != "" {
			s.repairs.Repaired(hstate.KindFence, s.fence, fbad)
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
func (s *FencedStore) countVersioned(res *WriteResults, e warmer.Entry, r keyReply) warmer.VersionCheck {
	vk := VersionKey(s.ns, e.Key)
	if r.record != "" {
		s.repairs.Repaired(hstate.KindVersion, vk, r.record)
	}
	switch r.code {
	case codeWritten:
		res.Written++
	case codeExtended:
		res.Extended++
		s.ver.extended.WithLabelValues(e.Family).Inc()
	case codeOlder, codeUnbacked:
		res.Older++
		s.ver.refused.WithLabelValues(e.Family).Inc()
	}
	c := warmer.VersionCheck{Reason: r.why, Found: r.detail}
	switch {
	case r.code == codeUnbacked:
		c.Recheck, c.Record = true, r.detail
		c.Found = "record " + r.detail + " refused the write, but its value is not the bytes it was written with"
		if r.why == warmer.RepairValueAbsent {
			c.Found = "record " + r.detail + " refused the write, but its value is absent"
		}
	case r.record != "":
		c.Found = vk + " held " + r.record
	}
	return c
}

// versionedManyReply splits {0, fence found} (fenced: replies nil) or {1,
// fence found, code, record found, reason, info, …} for n keys.
func versionedManyReply(c *redis.Cmd, n int) (replies []keyReply, fence string, err error) {
	v, err := c.Result()
	if err != nil {
		return nil, "", err
	}
	a, ok := v.([]any)
	if !ok || len(a) < 2 {
		return nil, "", fmt.Errorf("unexpected script reply %v", v)
	}
	head, ok1 := a[0].(int64)
	fence, ok2 := a[1].(string)
	switch {
	case !ok1 || !ok2:
		return nil, "", fmt.Errorf("unexpected script reply %v", v)
	case head == 0 && len(a) == 2:
		return nil, fence, nil
	case head != 1 || len(a) != 2+4*n:
		return nil, "", fmt.Errorf("unexpected script reply for %d keys: %d elements", n, len(a))
	}
	replies = make([]keyReply, n)
	for i := range n {
		r, ok := keyReplyOf(a[2+4*i : 6+4*i])
		if !ok || r.code < codeWritten {
			return nil, "", fmt.Errorf("unexpected script reply for key %d: %v", i, a[2+4*i:6+4*i])
		}
		replies[i] = r
	}
	return replies, fence, nil
}

// keyReplyOf reads {code, record found, reason, info}.
func keyReplyOf(a []any) (keyReply, bool) {
	code, ok1 := a[0].(int64)
	rec, ok2 := a[1].(string)
	why, ok3 := a[2].(string)
	info, ok4 := a[3].(string)
	if !ok1 || !ok2 || !ok3 || !ok4 || code < codeFenced || code > codeUnbacked {
		return keyReply{}, false
	}
	return keyReply{code: code, record: rec, why: why, detail: info}, true
}

// versionedReply splits {code, fence found, record found, reason, info}.
func versionedReply(c *redis.Cmd) (r keyReply, fence string, err error) {
	v, err := c.Result()
	if err != nil {
		return keyReply{}, "", err
	}
	if a, ok := v.([]any); ok && len(a) == 5 {
		f, ok1 := a[1].(string)
		r, ok2 := keyReplyOf(append([]any{a[0]}, a[2:]...))
		if ok1 && ok2 {
			return r, f, nil
		}
	}
	return keyReply{}, "", fmt.Errorf("unexpected script reply %v", v)
}

// versionedReplyUpTo splits the {code, fence found, record found} of a
// script whose codes go up to top (the pre-warm's).
func versionedReplyUpTo(c *redis.Cmd, top int64) (code int64, fence, record string, err error) {
	v, err := c.Result()
	if err != nil {
		return 0, "", "", err
	}
	if a, ok := v.([]any); ok && len(a) == 3 {
		n, ok1 := a[0].(int64)
		f, ok2 := a[1].(string)
		r, ok3 := a[2].(string)
		if ok1 && ok2 && ok3 && n >= codeFenced && n <= top {
			return n, f, r, nil
		}
	}
	return 0, "", "", fmt.Errorf("unexpected script reply %v", v)
}

// setStamped writes the stamped entries through the version check and the
// others (written by a caller that does not stamp) through the plain fence
// script.
func (s *FencedStore) setStamped(ctx context.Context, t *Term, entries []warmer.Entry) error {
	_, err := s.setStampedChecked(ctx, t, entries)
	return err
}

// setStampedChecked is setStamped; checks[i] is what the version check found
// at entries[i]'s key.
func (s *FencedStore) setStampedChecked(ctx context.Context, t *Term, entries []warmer.Entry) ([]warmer.VersionCheck, error) {
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

// ParseVersionRecord parses a version record as the script writes it, for
// tests and tools that watch versions from outside: the origin version it
// holds (ok false when it has none or the record is not one).
func ParseVersionRecord(s string) (version int64, ok bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 4 || len(parts[2]) != 20 {
		return 0, false
	}
	u, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil {
		return 0, false
	}
	return int64(u ^ (1 << 63)), true
}
