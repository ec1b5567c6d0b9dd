package fence

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/store"
)

// store.PrewarmVersioned is a one-shot pre-warm's write of a stamped entry
// into a Redis where a leader runs. The pre-warm is not a leader: it reads
// the fence and never raises it (a foreign fence counts as absent and is left
// to the leader), and it is refused when a newer epoch holds it. Past the
// fence, the version record decides as for the leader's own writes, so the
// pre-warm never replaces a newer version, and leaves a record the leader's
// next write compares with. Without overwrite a present key is left alone.

// PrewarmVersioned is the version-checked write of `hearth prewarm` for the
// declarations whose writes the leader version-checks (warmer.Stamped): the
// pre-warm store hands it their entries when it writes fenced (it is a
// prewarm.VersionedWriter).
type PrewarmVersioned struct {
	client  redis.UniversalClient
	ns      string
	log     zerolog.Logger
	foreign atomic.Int64
}

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
func (p *PrewarmVersioned) SetVersioned(ctx context.Context, epoch int64, overwrite bool, fenceKey func(string) string, entries []store.Entry) ([]store.SetOutcome, error) {
	es, ow := strconv.FormatInt(epoch, 10), "0"
	if overwrite {
		ow = "1"
	}
	cmds, err := store.RunScript(ctx, p.client, store.PrewarmVersioned, len(entries), func(i int) ([]string, []any) {
		e := entries[i]
		e.Seq = 0
		return []string{e.Key, fenceKey(e.Key), store.VersionKey(p.ns, e.Key)}, append(append([]any{es}, versionArgs(e)...), ow)
	})
	if err != nil {
		return nil, fmt.Errorf("write %d keys: %w", len(entries), err)
	}
	out := make([]store.SetOutcome, len(entries))
	for i, c := range cmds {
		code, fbad, vbad, err := store.PrewarmVersionedReply(c)
		if err != nil {
			return nil, fmt.Errorf("write %d keys: %w", len(entries), err)
		}
		for _, f := range [][2]string{{fenceKey(entries[i].Key), fbad}, {store.VersionKey(p.ns, entries[i].Key), vbad}} {
			if f[1] != "" && p.foreign.Add(1) == 1 {
				p.log.Warn().Str("key", f[0]).Str("found", f[1]).
					Msg("pre-warm: foreign value in hearth's own key (a fence is treated as absent and left to the leader; a version record is rewritten)")
			}
		}
		switch code {
		case store.CodeFenced:
			out[i] = store.SetFenced
		case store.CodeWritten:
			out[i] = store.SetWritten
		default: // extended, older, present: Redis holds this value or a newer one (or, unbacked, a record the leader re-reads for)
			out[i] = store.SetPresent
		}
	}
	return out, nil
}
