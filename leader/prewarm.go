package leader

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/hstate"
	"github.com/hearth-dev/hearth/warmer"
)

// Pre-warm outcomes of prewarmVersionedScript beside the version check's:
// the key held a value and the pre-warm fills absent keys only.
const codePresent = 5

// prewarmVersionedScript is a one-shot pre-warm's write of a stamped entry
// into a Redis where a leader runs: KEYS value, fence, version record; ARGV
// epoch, value, ttl ms, seq, version (20 digits or empty), hash, record ttl
// ms, overwrite ("1" or "0"). The pre-warm is not a leader: it reads the fence
// and never raises it (a foreign fence counts as absent and is left to the
// leader), and it is refused when a newer epoch holds it. Past the fence, the version record
// decides as for the leader's own writes (hearth_versioned_set), so the
// pre-warm never replaces a newer version, and leaves a record the leader's
// next write compares with. Without overwrite a present key is left alone.
// Replies {code, fence found, record found}: 0 fenced, 1 written, 2 extended
// (the same bytes were there), 3 refused as older, 4 refused as older by a
// record its value does not back (left to the leader, which re-reads the
// origin), 5 present.
var prewarmVersionedScript = hstate.NewScript(versionLua + `
local e = tonumber(ARGV[1])
local f, bad = hearth_epoch(KEYS[2], e)
bad = bad or ''
if f > e then return {0, bad, ''} end
if ARGV[8] ~= '1' and redis.call('EXISTS', KEYS[1]) == 1 then return {5, bad, ''} end
local code, vbad = hearth_versioned_set(e, ARGV[1], KEYS[1], KEYS[3], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
return {code, bad, vbad}
`)

// PrewarmVersioned is the version-checked write of `hearth prewarm` for the
// declarations whose writes the leader version-checks (warmer.Stamped): the
// pre-warm store hands it their entries when it writes fenced.
type PrewarmVersioned struct {
	client  redis.UniversalClient
	ns      string
	log     zerolog.Logger
	foreign atomic.Int64
}

var _ warmer.PrewarmVersionedWriter = (*PrewarmVersioned)(nil)

// NewPrewarmVersioned builds the writer for Redis client and namespace ns.
func NewPrewarmVersioned(client redis.UniversalClient, ns string, log zerolog.Logger) *PrewarmVersioned {
	return &PrewarmVersioned{client: client, ns: ns, log: log.With().Str("component", "prewarm-store").Logger()}
}

// SetVersioned writes entries with epoch, one script per key, pipelined. The
// pre-warm's stamp is (epoch, 0): it orders before every load of the leader's
// term, so a value the leader wrote is replaced only by a newer origin
// version, never by the pre-warm's stamp. Outcomes: written (or extended: the
// same version and bytes were there), present (the key held a value and
// overwrite is off, or its record a newer version), fenced.
func (p *PrewarmVersioned) SetVersioned(ctx context.Context, epoch int64, overwrite bool, fenceKey func(string) string, entries []warmer.Entry) ([]warmer.SetOutcome, error) {
	es, ow := strconv.FormatInt(epoch, 10), "0"
	if overwrite {
		ow = "1"
	}
	cmds, err := hstate.RunScript(ctx, p.client, prewarmVersionedScript, len(entries), func(i int) ([]string, []any) {
		e := entries[i]
		e.Seq = 0
		return []string{e.Key, fenceKey(e.Key), VersionKey(p.ns, e.Key)}, append(append([]any{es}, versionArgs(e)...), ow)
	})
	if err != nil {
		return nil, fmt.Errorf("write %d keys: %w", len(entries), err)
	}
	out := make([]warmer.SetOutcome, len(entries))
	for i, c := range cmds {
		code, fbad, vbad, err := versionedReplyUpTo(c, codePresent)
		if err != nil {
			return nil, fmt.Errorf("write %d keys: %w", len(entries), err)
		}
		for _, f := range [][2]string{{fenceKey(entries[i].Key), fbad}, {VersionKey(p.ns, entries[i].Key), vbad}} {
			if f[1] != "" && p.foreign.Add(1) == 1 {
				p.log.Warn().Str("key", f[0]).Str("found", f[1]).
					Msg("pre-warm: foreign value in hearth's own key (a fence is treated as absent and left to the leader; a version record is rewritten)")
			}
		}
		switch code {
		case codeFenced:
			out[i] = warmer.SetFenced
		case codeWritten:
			out[i] = warmer.SetWritten
		default: // extended, older, present: Redis holds this value or a newer one (or, unbacked, a record the leader re-reads for)
			out[i] = warmer.SetPresent
		}
	}
	return out, nil
}

// recordFormat is a version record as versionLua writes it (a 40-digit SHA-1:
// the 32-digit records of earlier releases prove no value).
var recordFormat = regexp.MustCompile(`^([0-9]{1,16}):([0-9]{1,16}):([0-9]{20})?:([0-9a-f]{40})$`)

// ParseCopiedRecord decodes a version record read from a Redis (a blue-green
// copy's source, untrusted): the origin version it holds (versioned false when
// it holds none) and the SHA-1 of the value it was written with; ok is false
// for anything Hearth does not write, a version above the encoding's range
// included.
func ParseCopiedRecord(rec string) (version int64, versioned bool, hash string, ok bool) {
	m := recordFormat.FindStringSubmatch(rec)
	if m == nil {
		return 0, false, "", false
	}
	if m[3] == "" {
		return 0, false, m[4], true
	}
	u, err := strconv.ParseUint(m[3], 10, 64)
	if err != nil {
		return 0, false, "", false
	}
	return int64(u ^ (1 << 63)), true, m[4], true
}
