package leader

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/warmer"
)

// releaseTimeout bounds giving the lease up at shutdown.
const releaseTimeout = 2 * time.Second

// Status is where the campaign reports this instance's role (leader or
// standby, and the leader's epoch) and its readiness: the daemon's HTTP
// server, which answers /healthz and /readyz from them.
type Status interface {
	SetRole(role string, epoch int64)
	SetReady(ready bool)
}

// Leadership is the leader side of `hearth run`: the lease, the fenced store,
// and the campaign loop that decides when this instance writes.
type Leadership struct {
	lease   *Lease // nil when leader.enabled is false
	store   warmer.Store
	gate    warmer.Gate    // nil without a lease
	elector gocron.Elector // nil without a lease
	spread  float64
	log     zerolog.Logger

	mu   sync.Mutex
	term *Term // the latest term, released at shutdown
	done chan struct{}
}

// New builds the leadership cfg declares: a lease and a fenced store, or, with
// leader.enabled false, an unfenced store and no lease.
func New(cfg *config.Config, rdb redis.UniversalClient, reg prometheus.Registerer, log zerolog.Logger) (*Leadership, error) {
	l := &Leadership{spread: cfg.Refresh.Spread, log: log, done: make(chan struct{})}
	if !cfg.Leader.Enabled {
		l.store = &warmer.RedisStore{Client: rdb}
		log.Warn().Msg("leader election disabled: this instance writes unfenced; run only one")
		return l, nil
	}
	t := cfg.LeaseTiming()
	if !t.Fits() {
		log.Warn().Dur("lease_ms", t.Lease).Dur("retry_period_ms", t.RetryPeriod).Dur("margin_ms", t.Margin).Str("declaration", t.MarginPath).
			Msg("leader lease + campaign backoff exceed the takeover margin: after a leader crash that key may expire before a standby takes over")
	}
	store := NewFencedStore(FencedStoreOptions{Client: rdb, Namespace: cfg.Redis.Namespace, Registerer: reg, Logger: log})
	lease, err := NewLease(LeaseOptions{
		Client: rdb, Namespace: cfg.Redis.Namespace,
		Duration: t.Lease, RenewInterval: t.RenewInterval, RetryPeriod: t.RetryPeriod,
		Fence: store, Registerer: reg, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("leader lease: %w", err)
	}
	log.Info().Str("instance", lease.ID()).Dur("lease_ms", t.Lease).Dur("renew_interval_ms", t.RenewInterval).
		Dur("retry_period_ms", t.RetryPeriod).Msg("leader election enabled")
	l.lease, l.store, l.gate, l.elector = lease, store, lease, lease
	return l, nil
}

// Start runs the campaign in a goroutine of its own until ctx ends; Wait
// waits for it. prewarm (if not nil) runs after the start-up load of the first
// term and the schedule's opening, before ready.
func (l *Leadership) Start(ctx context.Context, w *warmer.Warmer, sched *jobs.Scheduler, srv Status, prewarm func(context.Context)) {
	go l.run(ctx, w, sched, srv, prewarm)
}

// run campaigns until ctx ends. On winning: becomeLeader, then the jobs run
// (gated by the lease, in memory) and /readyz turns 200. On losing: /readyz
// turns 503 at once (the gate already refuses writes) and it campaigns again.
func (l *Leadership) run(ctx context.Context, w *warmer.Warmer, sched *jobs.Scheduler, srv Status, prewarm func(context.Context)) {
	defer close(l.done)
	// The catch-up asks this instance's schedule when it will really write
	// each key next (jobs.Scheduler.NextRun computes it from the schedule).
	catchUp := warmer.CatchUpOptions{Schedule: sched, Spread: l.spread}
	if l.lease == nil {
		srv.SetRole("leader", 0)
		becomeLeader(ctx, w, true, catchUp, func() bool { return l.openJobs(ctx, sched) }, prewarm, l.log)
		srv.SetReady(ctx.Err() == nil)
		l.log.Info().Msg("ready")
		return
	}
	loaded, opened := false, false
	for {
		srv.SetRole("standby", 0)
		term, err := l.lease.Campaign(ctx)
		if err != nil {
			return
		}
		l.mu.Lock()
		l.term = term
		l.mu.Unlock()
		srv.SetRole("leader", term.Epoch)
		if loaded && !opened {
			// A takeover: open the schedule first, so that the catch-up knows
			// when it writes next (the jobs are gated by this term).
			opened = l.openJobs(ctx, sched)
		}
		tctx, cancel := termContext(ctx, term)
		open := func() bool {
			if !opened {
				opened = l.openJobs(ctx, sched)
			}
			return opened
		}
		becomeLeader(tctx, w, !loaded, catchUp, open, prewarm, l.log)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if term.Err() == nil {
			loaded = true
			if !opened {
				opened = l.openJobs(ctx, sched)
			}
			srv.SetReady(true)
			l.log.Info().Int64("epoch", term.Epoch).Msg("ready")
		}
		select {
		case <-term.Done():
			srv.SetReady(false)
			l.log.Warn().Int64("epoch", term.Epoch).AnErr("reason", term.Err()).Msg("not leading: writes stopped; standing by")
		case <-ctx.Done():
			return
		}
	}
}

func (l *Leadership) openJobs(ctx context.Context, sched *jobs.Scheduler) bool {
	if err := sched.Open(ctx); err != nil {
		if ctx.Err() == nil { // else shutting down: Open scheduled nothing
			l.log.Error().Err(err).Msg("scheduling failed")
		}
		return false
	}
	return true
}

// becomeLeader is what a new leader does before it reports ready: in its
// first term the start-up load, then the schedule opens (open) and a catch-up
// rewrites every key that would expire before its first scheduled write, then
// the pre-warm from the access log (prewarm, if not nil); in later terms (the
// schedule already open) the takeover catch-up. ctx ends with the term.
//
// The schedule opens before the pre-warm, whose length nothing bounds (its
// rate, top_n, a slow access log): opened after it, the declared keys the
// start-up load wrote expired while it ran (prewarm.rate 0.05 with a 3 s TTL:
// absent in 121 of 179 polls). The pre-warm still comes before ready.
//
// The start-up catch-up matters for large declarations: a start-up load that
// takes a while leaves the keys it wrote first waiting for their batch of the
// first scheduled run, which falls at the declaration's phase, up to one
// interval plus its pacing later — longer than the smallest jittered TTL
// allows when the load itself took long. Usually it finds nothing due.
func becomeLeader(ctx context.Context, w *warmer.Warmer, first bool, catchUp warmer.CatchUpOptions,
	open func() bool, prewarm func(context.Context), log zerolog.Logger) {
	t0 := time.Now()
	what := "takeover catch-up finished"
	if first {
		if err := w.RefreshAll(ctx); err != nil {
			log.Error().Err(err).Msg("start-up load incomplete; the failed declarations are retried on schedule")
		}
		log.Info().Dur("took_ms", time.Since(t0)).Msg("start-up load finished")
		if !open() || ctx.Err() != nil {
			return
		}
		t0, what = time.Now(), "start-up catch-up finished"
	}
	res, err := w.CatchUp(ctx, catchUp)
	ev := log.Info()
	if err != nil {
		ev = log.Warn().Err(err)
	}
	ev.Int("checked", res.Checked).Int("due", res.Due).Int("refreshed", res.Refreshed).Int("failed", res.Failed).
		Int("unscheduled", res.Unscheduled).Dur("horizon_ms", res.Horizon).
		Dur("took_ms", time.Since(t0)).Msg(what)
	if first && prewarm != nil && ctx.Err() == nil {
		prewarm(ctx)
	}
}

// termContext is ctx, also cancelled when the term ends.
func termContext(ctx context.Context, term *Term) (context.Context, context.CancelFunc) {
	tctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-term.Done():
			cancel()
		case <-tctx.Done():
		}
	}()
	return tctx, cancel
}

// Wait returns once the campaign started by Start has returned.
func (l *Leadership) Wait() { <-l.done }

// Release gives the lease up after the last write, so that a standby takes
// over at once instead of after the lease expires.
func (l *Leadership) Release(ctx context.Context) error {
	if l.lease == nil {
		return nil
	}
	l.mu.Lock()
	t := l.term
	l.mu.Unlock()
	if t == nil || t.Err() != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := t.Release(ctx); err != nil {
		return err
	}
	l.log.Info().Int64("epoch", t.Epoch).Msg("lease released")
	return nil
}

// Leading reports whether this instance holds a valid lease term (always, with
// leader election disabled): the admin API refreshes only on the leader, whose
// writes the fence lets through.
func (l *Leadership) Leading() bool {
	if l.lease == nil {
		return true
	}
	l.mu.Lock()
	t := l.term
	l.mu.Unlock()
	return t != nil && t.Valid()
}

// Close stops the lease's renewal, after Release.
func (l *Leadership) Close(ctx context.Context) error {
	if l.lease == nil {
		return nil
	}
	return l.lease.Close(ctx)
}

// Instance names this instance (its lease id), or "" without a lease.
func (l *Leadership) Instance() string {
	if l.lease == nil {
		return ""
	}
	return l.lease.ID()
}

// Store is the store the warmer writes through: fenced with a lease, else plain.
func (l *Leadership) Store() warmer.Store { return l.store }

// Gate admits the warmer's writes while this instance leads (nil without a lease).
func (l *Leadership) Gate() warmer.Gate { return l.gate }

// Elector lets the scheduler run jobs only while this instance leads (nil
// without a lease).
func (l *Leadership) Elector() gocron.Elector { return l.elector }
