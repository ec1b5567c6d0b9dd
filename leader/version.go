package leader

import (
	"context"
	"crypto/sha256"
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
// (20 digits, empty without a version column) and hash the first 128 bits of
// the value's SHA-256. A write is refused as older when both it and the record
// carry an origin version and its version is lower, or else when its stamp
// (epoch, seq) is lower than the record's: the load that started last is the
// one that lands. A write with the same version and the same bytes as the
// record only extends the value's TTL (a conditional extend).
//
// The record is untrusted: anything but the exact format, or, when it would
// refuse or spare the write, a TTL missing or longer than the declaration ever
// sets or an epoch beyond Redis TIME + MaxEpochAhead, is treated as absent,
// overwritten, logged and counted
// (hearth_state_repairs_total{key="version"}). So a planted far-future version
// holds a key's writes off for at most the record's TTL, twice the longest
// value TTL, and never switches the check off.

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

// valueHash is what the version record remembers of a value.
func valueHash(v []byte) string {
	h := sha256.Sum256(v)
	return hex.EncodeToString(h[:16])
}

// Write outcomes of versionedSetScript.
const (
	codeFenced   = 0
	codeWritten  = 1
	codeExtended = 2
	codeOlder    = 3
)

// versionLua holds the version check of one key, shared by the one-key and
// the many-key script. hearth_versioned_set(e, es, vk, rk, value, ttl, seq,
// ver, hash, vttl), run after the fence check passed for epoch e (es its
// decimal string), writes value key vk and its record rk, or refuses the
// write as older, or only extends vk's TTL (same version and bytes); it
// returns the code (1 written, 2 extended, 3 older) and, when rk held a
// foreign value it repaired, a description of it (” when none).
const versionLua = `
local function hearth_vcmp(a, b)
  local a1, b1 = tonumber(string.sub(a, 1, 10)), tonumber(string.sub(b, 1, 10))
  if a1 ~= b1 then if a1 < b1 then return -1 end return 1 end
  local a2, b2 = tonumber(string.sub(a, 11)), tonumber(string.sub(b, 11))
  if a2 ~= b2 then if a2 < b2 then return -1 end return 1 end
  return 0
end
local function hearth_versioned_set(e, es, vk, rk, value, ttl, seqs, ver, hash, vttls)
  local seq, vttl = tonumber(seqs), tonumber(vttls)
  local vbad = ''
  local ce, cs, cv, ch, ca
  local cur = redis.pcall('GET', rk)
  if type(cur) == 'table' and cur.err then
    vbad = hearth_type(rk)
  elseif cur then
    local a, b, c, d = string.match(cur, '^(%d+):(%d+):(%d*):(%x+)$')
    if not a or string.len(a) > 16 or string.len(b) > 16 or (c ~= '' and string.len(c) ~= 20) or string.len(d) ~= 32 then
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
  if older then return 3, vbad end
  local rec = es .. ':' .. seqs .. ':' .. ver .. ':' .. hash
  if ce and ch == hash and cv == ver then
    local n = redis.pcall('STRLEN', vk)
    if type(n) == 'number' and n == string.len(value) and redis.call('PEXPIRE', vk, ttl) == 1 then
      redis.call('SET', rk, rec, 'PX', vttl)
      return 2, vbad
    end
  end
  redis.call('SET', vk, value, 'PX', ttl)
  redis.call('SET', rk, rec, 'PX', vttl)
  return 1, vbad
end
`

// versionedSetScript: KEYS value, fence, version record; ARGV epoch, value,
// ttl ms, seq, version (20 digits or empty), hash, record ttl ms. Replies
// {code, fence found, record found}: code 0 fenced, 1 written, 2 extended
// (same version and bytes), 3 refused as older; a found string is non-empty
// when that key held a foreign value that was repaired. Idempotent: run twice,
// the second run extends (same stamp and hash) or refuses.
var versionedSetScript = newFencedScript(versionLua + `
local ok, bad = hearth_fence(KEYS[2], ARGV[1])
bad = bad or ''
if not ok then return {0, bad, ''} end
local code, vbad = hearth_versioned_set(tonumber(ARGV[1]), ARGV[1], KEYS[1], KEYS[3], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
return {code, bad, vbad}
`)

// versionedSetManyScript is versionedSetScript for many keys under one fence
// key (a single node): KEYS fence, then value and record for each key; ARGV
// epoch, then value, ttl ms, seq, version, hash and record ttl ms for each key.
// Replies {0, fence found} when fenced (no key written), else {1, fence
// found, code 1, record found 1, code 2, record found 2, …}.
var versionedSetManyScript = newFencedScript(versionLua + `
local ok, bad = hearth_fence(KEYS[1], ARGV[1])
bad = bad or ''
if not ok then return {0, bad} end
local e = tonumber(ARGV[1])
local out = {1, bad}
for i = 1, (#KEYS - 1) / 2 do
  local b = 1 + 6 * (i - 1)
  local code, vbad = hearth_versioned_set(e, ARGV[1], KEYS[2*i], KEYS[2*i+1], ARGV[b+1], ARGV[b+2], ARGV[b+3], ARGV[b+4], ARGV[b+5], ARGV[b+6])
  out[#out+1] = code
  out[#out+1] = vbad
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
			Help: "Writes whose value was byte-identical to the one Hearth last wrote (same version): the TTL was extended, the value not rewritten.",
		}, []string{"family"}),
	}
	reg.MustRegister(m.refused, m.extended)
	return m
}

// WriteResults counts the outcome of one versioned write.
type WriteResults struct {
	Written, Extended, Older int
}

// setVersioned writes stamped entries through the version check, pipelined:
// under a single fence key versionedSetManyChunk keys per script call, per
// slot (Cluster) one script per key. Entries refused as older are not an
// error: a newer value is in Redis.
func (s *FencedStore) setVersioned(ctx context.Context, t *Term, entries []warmer.Entry) (WriteResults, error) {
	var res WriteResults
	epoch := strconv.FormatInt(t.Epoch, 10)
	var refused int
	var err error
	if s.perSlot {
		refused, err = s.setVersionedEach(ctx, epoch, entries, &res)
	} else {
		refused, err = s.setVersionedMany(ctx, epoch, entries, &res)
	}
	if err != nil {
		return res, fmt.Errorf("write %d keys: %w", len(entries), err)
	}
	if refused > 0 {
		s.fenced.WithLabelValues("set").Add(float64(refused))
		t.Fenced()
		return res, fmt.Errorf("write %d keys with epoch %d: %d refused: %w", len(entries), t.Epoch, refused, ErrFenced)
	}
	return res, nil
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

// setVersionedEach runs versionedSetScript once per entry; it returns how many
// the fence refused.
func (s *FencedStore) setVersionedEach(ctx context.Context, epoch string, entries []warmer.Entry, res *WriteResults) (int, error) {
	cmds, err := s.run(ctx, versionedSetScript, len(entries), func(i int) ([]string, []any) {
		e := entries[i]
		return []string{e.Key, s.FenceKey(e.Key), VersionKey(s.ns, e.Key)}, append([]any{epoch}, versionArgs(e)...)
	})
	if err != nil {
		return 0, err
	}
	refused := 0
	for i, c := range cmds {
		code, fbad, vbad, err := versionedReply(c)
		if err != nil {
			return 0, err
		}
		if fbad != "" {
			s.repairs.Repaired(hstate.KindFence, s.FenceKey(entries[i].Key), fbad)
		}
		if code == codeFenced {
			refused++
			continue
		}
		s.countVersioned(res, entries[i], code, vbad)
	}
	return refused, nil
}

// setVersionedMany runs versionedSetManyScript over chunks of entries under
// the single fence key; it returns how many the fence refused.
func (s *FencedStore) setVersionedMany(ctx context.Context, epoch string, entries []warmer.Entry, res *WriteResults) (int, error) {
	chunks := (len(entries) + versionedSetManyChunk - 1) / versionedSetManyChunk
	part := func(i int) []warmer.Entry {
		return entries[i*versionedSetManyChunk : min(len(entries), (i+1)*versionedSetManyChunk)]
	}
	cmds, err := s.run(ctx, versionedSetManyScript, chunks, func(i int) ([]string, []any) {
		es := part(i)
		keys, argv := make([]string, 0, 1+2*len(es)), make([]any, 0, 1+6*len(es))
		keys, argv = append(keys, s.fence), append(argv, epoch)
		for _, e := range es {
			keys = append(keys, e.Key, VersionKey(s.ns, e.Key))
			argv = append(argv, versionArgs(e)...)
		}
		return keys, argv
	})
	if err != nil {
		return 0, err
	}
	refused := 0
	for i, c := range cmds {
		es := part(i)
		codes, vbads, fbad, err := versionedManyReply(c, len(es))
		if err != nil {
			return 0, err
		}
		if fbad != "" {
			s.repairs.Repaired(hstate.KindFence, s.fence, fbad)
		}
		if codes == nil {
			refused += len(es)
			continue
		}
		for j, e := range es {
			s.countVersioned(res, e, codes[j], vbads[j])
		}
	}
	return refused, nil
}

// countVersioned counts one key's outcome other than fenced, and a repair of
// its version record.
func (s *FencedStore) countVersioned(res *WriteResults, e warmer.Entry, code int64, vbad string) {
	if vbad != "" {
		s.repairs.Repaired(hstate.KindVersion, VersionKey(s.ns, e.Key), vbad)
	}
	switch code {
	case codeWritten:
		res.Written++
	case codeExtended:
		res.Extended++
		s.ver.extended.WithLabelValues(e.Family).Inc()
	case codeOlder:
		res.Older++
		s.ver.refused.WithLabelValues(e.Family).Inc()
	}
}

// versionedManyReply splits {0, fence found} (fenced: codes nil) or {1, fence
// found, code, record found, …} for n keys.
func versionedManyReply(c *redis.Cmd, n int) (codes []int64, records []string, fence string, err error) {
	v, err := c.Result()
	if err != nil {
		return nil, nil, "", err
	}
	a, ok := v.([]any)
	if !ok || len(a) < 2 {
		return nil, nil, "", fmt.Errorf("unexpected script reply %v", v)
	}
	head, ok1 := a[0].(int64)
	fence, ok2 := a[1].(string)
	switch {
	case !ok1 || !ok2:
		return nil, nil, "", fmt.Errorf("unexpected script reply %v", v)
	case head == 0 && len(a) == 2:
		return nil, nil, fence, nil
	case head != 1 || len(a) != 2+2*n:
		return nil, nil, "", fmt.Errorf("unexpected script reply for %d keys: %d elements", n, len(a))
	}
	codes, records = make([]int64, n), make([]string, n)
	for i := range n {
		code, ok1 := a[2+2*i].(int64)
		rec, ok2 := a[3+2*i].(string)
		if !ok1 || !ok2 || code < codeWritten || code > codeOlder {
			return nil, nil, "", fmt.Errorf("unexpected script reply for key %d: %v, %v", i, a[2+2*i], a[3+2*i])
		}
		codes[i], records[i] = code, rec
	}
	return codes, records, fence, nil
}

// versionedReply splits {code, fence found, record found}.
func versionedReply(c *redis.Cmd) (code int64, fence, record string, err error) {
	return versionedReplyUpTo(c, codeOlder)
}

// versionedReplyUpTo is versionedReply for a script whose codes go up to top.
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
	var plain, vers []warmer.Entry
	for _, e := range entries {
		if e.Seq > 0 {
			vers = append(vers, e)
		} else {
			plain = append(plain, e)
		}
	}
	if len(plain) > 0 {
		if err := s.Set(ctx, plain); err != nil {
			return err
		}
	}
	_, err := s.setVersioned(ctx, t, vers)
	return err
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
