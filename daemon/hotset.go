package daemon

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/warmer"
)

// hotTick is how often the hot-set loop looks for a ranking due; rankings are
// at least a second apart (members_from.access_log.rank_interval).
const hotTick = 250 * time.Millisecond

// hotSets re-ranks the families whose members follow traffic
// (members_from.access_log), each every rank_interval, while this instance
// leads; a new term ranks every one at once. Declarations are read from the
// warmer at every tick, so a reload that adds, changes or removes a hot set
// takes effect at the next one.
type hotSets struct {
	w       *warmer.Warmer
	ranker  warmer.HotRanker // nil without an access log
	leading func() bool
	log     zerolog.Logger

	cancel context.CancelFunc
	done   chan struct{}
}

func newHotSets(cfg *config.Config, w *warmer.Warmer, sources *Sources, leading func() bool, log zerolog.Logger) (*hotSets, error) {
	al, err := AccessLog(cfg, sources)
	if err != nil {
		return nil, err
	}
	h := &hotSets{w: w, leading: leading, log: log.With().Str("component", "hotset").Logger()}
	if al != nil { // a nil *Log in the interface would not be nil
		h.ranker = al
	}
	return h, nil
}

// open starts the loop; close stops it and waits for a ranking in progress.
func (h *hotSets) open(ctx context.Context) {
	ctx, h.cancel = context.WithCancel(ctx)
	h.done = make(chan struct{})
	go h.run(ctx)
}

func (h *hotSets) close(context.Context) error {
	if h.cancel != nil {
		h.cancel()
		<-h.done
	}
	return nil
}

func (h *hotSets) run(ctx context.Context) {
	defer close(h.done)
	t := time.NewTicker(hotTick)
	defer t.Stop()
	last := map[string]time.Time{}
	warned := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !h.leading() {
			clear(last) // a new term ranks at once
			continue
		}
		for _, s := range h.w.Specs() {
			if s.HotSet == nil || ctx.Err() != nil {
				continue
			}
			if h.ranker == nil {
				if !warned[s.Name] {
					warned[s.Name] = true
					h.log.Error().Str("family", s.Name).Msg("members_from.access_log needs access_log.source at start-up: restart to rank this hot set")
				}
				continue
			}
			if t0, ok := last[s.Name]; ok && time.Since(t0) < s.HotSet.RankInterval {
				continue
			}
			last[s.Name] = time.Now()
			ch, err := h.w.RankHotSet(ctx, s.Name, h.ranker)
			if err != nil && ctx.Err() == nil {
				h.log.Warn().Str("family", s.Name).Err(err).Int("promoted", len(ch.Promoted)).
					Msg("hot-set ranking incomplete; retried at the next rank interval")
			}
		}
	}
}
