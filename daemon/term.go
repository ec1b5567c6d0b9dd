package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/catchup"
	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// The leader's work is one unit, the term: winning the campaign starts every
// leader-only service in one group under the term's context, and the term's
// end stops and waits for the group (docs/leadership.md draws it). With
// leader.enabled false there is one endless term, without a lease.

// releaseTimeout bounds giving the lease up at shutdown.
const releaseTimeout = 2 * time.Second

// status is where the campaign reports this instance's role (leader or
// standby, and the leader's epoch) and its readiness: the daemon's HTTP
// server, which answers /healthz and /readyz from them.
type status interface {
	SetRole(role string, epoch int64)
	SetReady(ready bool)
}

// term is one tenure as leader, as the daemon runs it: its context ends when
// the term does, and release gives it up.
type term struct {
	ctx     context.Context
	epoch   int64
	release func(context.Context) error
}

// leadership is the lease side of `hearth run`: the lease and the fenced
// store (or, with leader.enabled false, an unfenced store and one endless
// term), and the campaign loop that runs the leader's work term by term.
type leadership struct {
	lease *leader.Lease // nil when leader.enabled is false
	store warmer.Store
	gate  warmer.Gate // nil without a lease
	log   zerolog.Logger

	mu      sync.Mutex
	current *term // the latest term, released at shutdown
	endless bool  // the endless term was handed out
	done    chan struct{}
}

// newLeadership builds the leadership cfg declares: a lease and a fenced
// store, or, with leader.enabled false, an unfenced store and no lease.
func newLeadership(cfg *config.Config, rdb redis.UniversalClient, reg prometheus.Registerer, log zerolog.Logger) (*leadership, error) {
	l := &leadership{log: log, done: make(chan struct{})}
	if !cfg.Leader.Enabled {
		l.store = &store.RedisStore{Client: rdb}
		log.Warn().Msg("leader election disabled: this instance writes unfenced; run only one")
		return l, nil
	}
	t := cfg.LeaseTiming()
	if !t.Fits() {
		log.Warn().Dur("lease_ms", t.Lease).Dur("retry_period_ms", t.RetryPeriod).Dur("margin_ms", t.Margin).Str("declaration", t.MarginPath).
			Msg("leader lease + campaign backoff exceed the takeover margin: after a leader crash that key may expire before a standby takes over")
	}
	store := fence.NewFencedStore(fence.FencedStoreOptions{Client: rdb, Namespace: cfg.Redis.Namespace, Registerer: reg, Logger: log})
	var grace time.Duration
	if store.PerSlot() {
		// On a Cluster every write is checked on its own slot's fence: a
		// leader whose lease master fails over writes on to the others.
		grace = cfg.Leader.Grace()
	}
	lease, err := leader.NewLease(leader.LeaseOptions{
		Client: rdb, Namespace: cfg.Redis.Namespace,
		Duration: t.Lease, RenewInterval: t.RenewInterval, RetryPeriod: t.RetryPeriod,
		// config's timing rule (config.TakeoverWait) counts this backoff.
		MaxBackoff: config.CampaignBackoff * t.RetryPeriod, BackoffJitter: config.CampaignJitter,
		Fence: store, FailoverGrace: grace, Registerer: reg, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("leader lease: %w", err)
	}
	log.Info().Str("instance", lease.ID()).Dur("lease_ms", t.Lease).Dur("renew_interval_ms", t.RenewInterval).
		Dur("retry_period_ms", t.RetryPeriod).Dur("failover_grace_ms", grace).Msg("leader election enabled")
	l.lease, l.store, l.gate = lease, store, store.Gate(lease)
	return l, nil
}

// campaign blocks until this instance leads, then returns its term. Without
// a lease the first call returns the endless term at once (it ends only at
// release); a later one waits for ctx.
func (l *leadership) campaign(ctx context.Context) (*term, error) {
	var t *term
	if l.lease == nil {
		l.mu.Lock()
		again := l.endless
		l.endless = true
		l.mu.Unlock()
		if again {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		tctx, end := context.WithCancelCause(context.Background())
		t = &term{ctx: tctx, release: func(context.Context) error { end(leader.ErrReleased); return nil }}
	} else {
		lt, err := l.lease.Campaign(ctx)
		if err != nil {
			return nil, err
		}
		t = &term{ctx: lt.Context(), epoch: lt.Epoch, release: lt.Release}
	}
	l.mu.Lock()
	l.current = t
	l.mu.Unlock()
	return t, nil
}

// termWork is what a term runs: the start-up sequence and the leader-only
// services, each of which runs until its context ends.
type termWork struct {
	w     *warmer.Warmer
	sched *jobs.Scheduler
	// catchUp asks the schedule when it really writes each key next.
	catchUp catchup.Options
	// prewarm (if not nil) runs in the first term after the start-up load,
	// the schedule's opening and the catch-up, before ready.
	prewarm  func(context.Context)
	services []func(context.Context) error
	// standby (if not nil) runs while this instance campaigns, and stops
	// when it wins or ctx ends.
	standby func(context.Context)
	srv     status
}

// start runs the campaign in a goroutine of its own until ctx ends; wait
// waits for it.
func (l *leadership) start(ctx context.Context, work *termWork) {
	go l.run(ctx, work)
}

// wait returns once the campaign started by start has returned.
func (l *leadership) wait() { <-l.done }

// run campaigns until ctx ends. On winning it runs the term (see lead);
// when the term ends, /readyz turns 503 (the gate already refuses writes)
// and it campaigns again.
func (l *leadership) run(ctx context.Context, work *termWork) {
	defer close(l.done)
	loaded := false
	for {
		if l.lease != nil {
			work.srv.SetRole("standby", 0)
		}
		t, err := l.standBy(ctx, work.standby)
		if err != nil {
			return
		}
		work.srv.SetRole("leader", t.epoch)
		if l.lead(ctx, t, work, !loaded) {
			loaded = true
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// standBy campaigns, running standby beside the campaign (with a lease)
// until it returns.
func (l *leadership) standBy(ctx context.Context, standby func(context.Context)) (*term, error) {
	if l.lease == nil || standby == nil {
		return l.campaign(ctx)
	}
	sctx, stop := context.WithCancel(ctx)
	var g sync.WaitGroup
	g.Go(func() { standby(sctx) })
	defer g.Wait()
	defer stop()
	return l.campaign(ctx)
}

// lead runs one term: every leader-only service in one group under the
// term's context, and the start-up sequence (becomeLeader), then ready. It
// returns when the term ended, or ctx ended and the schedule was drained
// (Scheduler.Close), once every service of the group returned; loaded
// reports that the start-up sequence finished within the term.
//
// The services stop when ctx ends (shutdown) or the term does; the schedule
// runs under the term's context alone, so that a shutdown drains its runs
// instead of cancelling them, and the lease is released after the last write.
func (l *leadership) lead(ctx context.Context, t *term, work *termWork, first bool) (loaded bool) {
	wctx, stop := context.WithCancel(t.ctx)
	defer stop()
	stopOnShutdown := context.AfterFunc(ctx, stop)
	defer stopOnShutdown()
	var g sync.WaitGroup
	defer g.Wait()
	for _, run := range work.services {
		g.Go(func() {
			if err := run(wctx); err != nil && wctx.Err() == nil {
				l.log.Error().Err(err).Msg("leader service failed; it runs again next term")
			}
		})
	}
	open := func() bool {
		opened, failed := make(chan struct{}), make(chan error, 1)
		g.Go(func() {
			if err := work.sched.Run(t.ctx, func() { close(opened) }); err != nil {
				failed <- err
			}
		})
		select {
		case <-opened:
			return true
		case err := <-failed:
			if wctx.Err() == nil { // else shutting down: Run scheduled nothing
				l.log.Error().Err(err).Msg("scheduling failed")
			}
			return false
		}
	}
	becomeLeader(wctx, work.w, first, work.catchUp, open, work.prewarm, l.log)
	if wctx.Err() == nil {
		work.srv.SetReady(true)
		l.log.Info().Int64("epoch", t.epoch).Msg("ready")
		loaded = true
	}
	<-wctx.Done()
	if ctx.Err() == nil {
		// The term ended: unready at once, before the group is waited for.
		work.srv.SetReady(false)
		if l.lease != nil {
			work.srv.SetRole("standby", 0)
		}
		l.log.Warn().Int64("epoch", t.epoch).AnErr("reason", context.Cause(t.ctx)).Msg("not leading: writes stopped; standing by")
	}
	return loaded
}

// becomeLeader is what a new leader does before it reports ready: in its
// first term the start-up load, then the schedule opens (open) and a catch-up
// rewrites every key that would expire before its first scheduled write, then
// the pre-warm from the access log (prewarm, if not nil); in later terms the
// schedule opens first, then the takeover catch-up. ctx ends with the term.
// The schedule opens before the pre-warm, whose length nothing bounds, so
// that the keys the load wrote never wait for it (docs/leadership.md); the
// start-up catch-up covers a long load, whose first keys would otherwise wait
// up to an interval plus its pacing for their first scheduled write.
func becomeLeader(ctx context.Context, w *warmer.Warmer, first bool, catchUp catchup.Options,
	open func() bool, prewarm func(context.Context), log zerolog.Logger) {
	t0 := time.Now()
	what := "takeover catch-up finished"
	if first {
		if err := w.RefreshAll(ctx); err != nil {
			log.Error().Err(err).Msg("start-up load incomplete; the failed declarations are retried on schedule")
		}
		log.Info().Dur("took_ms", time.Since(t0)).Msg("start-up load finished")
		t0, what = time.Now(), "start-up catch-up finished"
	}
	if ctx.Err() != nil {
		return
	}
	if !open() && first {
		return
	}
	if ctx.Err() != nil {
		return
	}
	res, err := catchup.Run(ctx, w, catchUp)
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

// release gives the current term up after the last write, so that a standby
// takes over at once instead of after the lease expires.
func (l *leadership) release(ctx context.Context) error {
	l.mu.Lock()
	t := l.current
	l.mu.Unlock()
	if t == nil || t.ctx.Err() != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := t.release(ctx); err != nil {
		return err
	}
	if l.lease != nil {
		l.log.Info().Int64("epoch", t.epoch).Msg("lease released")
	}
	return nil
}

// Leading reports whether this instance holds a valid lease term (always, with
// leader election disabled): the admin API refreshes only on the leader, whose
// writes the fence lets through.
func (l *leadership) Leading() bool {
	if l.lease == nil {
		return true
	}
	_, ok := l.lease.Current()
	return ok
}

// renewNow has the current term renew its lease at once (see
// leader.Term.RenewNow): the re-warm calls it when Redis lost its data.
func (l *leadership) renewNow() {
	if l == nil || l.lease == nil {
		return
	}
	if t, ok := l.lease.Current(); ok {
		t.RenewNow()
	}
}

// Holder reads who holds the lease; without a lease this instance always
// leads, and it reports itself.
func (l *leadership) Holder(ctx context.Context) (instance string, epoch int64, held bool, err error) {
	if l.lease == nil {
		return l.instance(), 0, true, nil
	}
	return l.lease.Holder(ctx)
}

// close stops the lease's renewal, after release.
func (l *leadership) close(ctx context.Context) error {
	if l.lease == nil {
		return nil
	}
	return l.lease.Close(ctx)
}

// instance names this instance (its lease id), or "" without a lease.
func (l *leadership) instance() string {
	if l.lease == nil {
		return ""
	}
	return l.lease.ID()
}
