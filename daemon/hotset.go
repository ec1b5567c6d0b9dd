package daemon

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/hotset"
	"github.com/hearth-dev/hearth/warmer"
)

// hotTick is how often the hot-set loop looks for a ranking due; rankings are
// at least a second apart (members_from.access_log.rank_interval).
const hotTick = 250 * time.Millisecond

// hotSets re-ranks the families whose members follow traffic
// (members_from.access_log), each every rank_interval, for the length of a
// leader term (Run); a new term ranks every one at once. Declarations are read
// from the warmer at every tick, so a reload that adds, changes or removes a
// hot set takes effect at the next one.
type hotSets struct {
	w      *warmer.Warmer
	sets   *hotset.Sets
	ranker hotset.Ranker // nil without an access log
	log    zerolog.Logger
	// warned holds the families logged as unrankable (no access log), once
	// per process.
	warned map[string]bool
}

func newHotSets(cfg *config.Config, w *warmer.Warmer, sources *Sources, reg prometheus.Registerer, log zerolog.Logger) (*hotSets, error) {
	al, err := AccessLog(cfg, sources)
	if err != nil {
		return nil, err
	}
	log = log.With().Str("component", "hotset").Logger()
	h := &hotSets{w: w, sets: hotset.New(w, reg, log), log: log, warned: map[string]bool{}}
	h.sets.Declare(w.Specs())
	if al != nil { // a nil *Log in the interface would not be nil
		h.ranker = al
	}
	return h, nil
}

// Run ranks until ctx ends (the term), and returns once a ranking in progress stopped.
func (h *hotSets) Run(ctx context.Context) error {
	t := time.NewTicker(hotTick)
	defer t.Stop()
	last := map[string]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for _, s := range h.w.Specs() {
			if s.HotSet == nil || ctx.Err() != nil {
				continue
			}
			if h.ranker == nil {
				if !h.warned[s.Name] {
					h.warned[s.Name] = true
					h.log.Error().Str("family", s.Name).Msg("members_from.access_log needs access_log.source at start-up: restart to rank this hot set")
				}
				continue
			}
			if t0, ok := last[s.Name]; ok && time.Since(t0) < s.HotSet.RankInterval {
				continue
			}
			last[s.Name] = time.Now()
			ch, err := h.sets.Rank(ctx, s.Name, h.ranker)
			if err != nil && ctx.Err() == nil {
				h.log.Warn().Str("family", s.Name).Err(err).Int("promoted", len(ch.Promoted)).
					Msg("hot-set ranking incomplete; retried at the next rank interval")
			}
		}
	}
}
