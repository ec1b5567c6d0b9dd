package warmer

import (
	"context"
	"time"
)

// recoverer is a source that tells when its origin is back after an outage
// (a protect.Guarded source with probes, see protect.GuardConfig.ProbeInterval).
type recoverer interface {
	OnRecover(fn func(ctx context.Context))
}

// recoverTimeout bounds the refresh that follows a recovery.
const recoverTimeout = 5 * time.Minute

// watchRecoveries refreshes, when a source's origin comes back, the
// declarations of that source whose last run failed, at once rather than at
// their next scheduled run (docs/faults.md). The refresh runs on the source's
// goroutine, as the warmer's own work: Close ends it and waits for it.
func (w *Warmer) watchRecoveries(sources map[string]Source) {
	for name, src := range sources {
		if r, ok := src.(recoverer); ok {
			r.OnRecover(func(ctx context.Context) {
				w.owned(ctx, func(ctx context.Context) {
					ctx, cancel := context.WithTimeout(ctx, recoverTimeout)
					defer cancel()
					w.RefreshFailing(ctx, name)
				})
			})
		}
	}
}

// RefreshFailing refreshes, concurrently within the load bound, every
// declaration of source whose last run failed, and returns how many it ran.
// Without the leader's admission (a standby) it refreshes nothing.
func (w *Warmer) RefreshFailing(ctx context.Context, source string) int {
	if w.gate != nil {
		if _, err := w.gate.Admit(ctx); err != nil {
			return 0
		}
	}
	var names []string
	for _, s := range w.Specs() {
		if s.Source != source {
			continue
		}
		if _, st, ok := w.lookup(s.Name); ok {
			st.mu.Lock()
			failing := st.failing
			st.mu.Unlock()
			if failing {
				names = append(names, s.Name)
			}
		}
	}
	if len(names) == 0 {
		return 0
	}
	w.log.Info().Str("source", source).Strs("families", names).Msg("origin back: refreshing the declarations that went stale")
	_ = each(names, func(n string) error {
		_, _ = w.Refresh(ctx, n, RunOptions{})
		return nil
	})
	return len(names)
}
