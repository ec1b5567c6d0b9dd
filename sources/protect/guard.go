// Package protect is the origin protection put around every source: a
// concurrency bound, a rate limit, retries with exponential backoff and
// jitter, a circuit breaker with probes, and their metrics.
package protect

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/rs/zerolog"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"

	"github.com/hearth-dev/hearth/internal/neterr"
	"github.com/hearth-dev/hearth/warmer"
)

// GuardConfig is the protection put around one source. Zero values switch a
// protection off; the config package supplies the defaults.
type GuardConfig struct {
	// Name is the source's name, the metrics' source label.
	Name string
	// MaxInFlight bounds the origin calls in flight at once (0: unbounded).
	MaxInFlight int
	// Rate bounds origin calls per second, Burst of them at once (0: unbounded).
	// A call is one load: one SQL query, or one batch of HTTP requests.
	Rate  float64
	Burst int
	// AttemptTimeout bounds one call; 0 leaves only the load's own deadline.
	AttemptTimeout time.Duration
	// Retries is how many times a call that failed for a reason worth
	// retrying (see Retryable) is repeated, after RetryBackoff, doubling up to
	// RetryMaxBackoff, each wait randomised by ±50%. Retries never outlast the
	// load's deadline.
	Retries         int
	RetryBackoff    time.Duration
	RetryMaxBackoff time.Duration
	// BreakerFailures consecutive failed calls open the circuit breaker for
	// BreakerOpenFor; then one trial call decides whether it closes (0: no breaker).
	BreakerFailures int
	BreakerOpenFor  time.Duration
	// ProbeInterval, when set, pings the origin (warmer.Source.Ping) this often
	// while the breaker is open or half-open, instead of waiting out
	// BreakerOpenFor for a trial call: a ping that answers closes the breaker
	// half-open style (the first failed call re-opens it) and calls the
	// OnRecover callbacks, which refresh what went stale. A recovery that
	// re-opens before any call succeeded doubles the interval, up to
	// BreakerOpenFor, so an origin that answers pings but not loads sees no
	// more than one load per interval. 0: no probes.
	ProbeInterval time.Duration
	// Retryable classifies errors; nil means the package's Retryable.
	Retryable func(error) bool
	// Metrics is shared by every guarded source of a process (nil: unregistered).
	Metrics *GuardMetrics
	Logger  zerolog.Logger
}

// Guarded is a warmer.Source behind origin protection: a concurrency bound, a rate
// limit, retries with exponential backoff and jitter, and a circuit breaker.
type Guarded struct {
	src       warmer.Source
	cfg       GuardConfig
	sem       *semaphore.Weighted
	limiter   *rate.Limiter
	retryable func(error) bool
	metrics   *GuardMetrics
	log       zerolog.Logger

	// breaker is replaced by a fresh one when a probe finds the origin back
	// (gobreaker has no way to close a breaker from outside); gen numbers
	// them, so that a late verdict on a replaced one changes nothing.
	breaker atomic.Pointer[gobreaker.TwoStepCircuitBreaker[struct{}]]
	gen     atomic.Uint64
	// probe state: one prober at a time, owned by Close.
	probeMu   sync.Mutex
	probing   bool
	falseRecs int // recoveries in a row that re-opened before any call succeeded
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	onRecover []func(context.Context)
}

// guardedLister is a Guarded source whose origin can list members.
type guardedLister struct{ *Guarded }

var (
	_ warmer.Source       = (*Guarded)(nil)
	_ warmer.Preparer     = (*Guarded)(nil)
	_ warmer.MemberLister = guardedLister{}
)

// Guard wraps src in origin protection. The result is a warmer.MemberLister exactly
// when src is one, with member listing protected like loads.
func Guard(src warmer.Source, cfg GuardConfig) warmer.Source {
	if cfg.Metrics == nil {
		cfg.Metrics = NewGuardMetrics(nil)
	}
	g := &Guarded{
		src: src, cfg: cfg, retryable: cfg.Retryable, metrics: cfg.Metrics,
		log: cfg.Logger.With().Str("component", "guard").Str("source", cfg.Name).Logger(),
	}
	if g.retryable == nil {
		g.retryable = Retryable
	}
	if cfg.MaxInFlight > 0 {
		g.sem = semaphore.NewWeighted(int64(cfg.MaxInFlight))
	}
	g.limiter = rate.NewLimiter(rate.Inf, 0)
	if cfg.Rate > 0 {
		g.limiter = rate.NewLimiter(rate.Limit(cfg.Rate), max(1, cfg.Burst))
	}
	g.metrics.breakerState.WithLabelValues(cfg.Name).Set(float64(gobreaker.StateClosed))
	g.metrics.probes.WithLabelValues(cfg.Name, "ok")
	g.metrics.probes.WithLabelValues(cfg.Name, "error")
	g.ctx, g.cancel = context.WithCancel(context.Background())
	if cfg.BreakerFailures > 0 {
		g.breaker.Store(g.newBreaker(false))
	}
	if _, ok := src.(warmer.MemberLister); ok {
		return guardedLister{g}
	}
	return g
}

// newBreaker builds the breaker of the next generation. afterProbe: a probe
// closed the previous one, and this one trips on the first failure until a
// call succeeds (the half-open rule, for as many calls as the refresh needs).
func (g *Guarded) newBreaker(afterProbe bool) *gobreaker.TwoStepCircuitBreaker[struct{}] {
	gen := g.gen.Add(1)
	state := g.metrics.breakerState.WithLabelValues(g.cfg.Name)
	state.Set(float64(gobreaker.StateClosed))
	return gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        g.cfg.Name,
		MaxRequests: 1,
		Timeout:     g.cfg.BreakerOpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			if afterProbe && c.TotalSuccesses == 0 {
				if c.ConsecutiveFailures < 1 {
					return false
				}
				g.probeMu.Lock()
				g.falseRecs++
				g.probeMu.Unlock()
				return true
			}
			return c.ConsecutiveFailures >= uint32(g.cfg.BreakerFailures)
		},
		IsExcluded: func(err error) bool { return errors.Is(err, errExcluded) },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			if g.gen.Load() != gen {
				return // replaced: its state is no longer the source's
			}
			state.Set(float64(to))
			ev := g.log.Info()
			if to == gobreaker.StateOpen {
				ev = g.log.Warn()
			}
			ev.Str("from", from.String()).Str("to", to.String()).Dur("open_for_ms", g.cfg.BreakerOpenFor).
				Msg("origin circuit breaker " + to.String())
			switch to {
			case gobreaker.StateOpen:
				g.startProbe(gen)
			case gobreaker.StateClosed:
				g.probeMu.Lock()
				g.falseRecs = 0
				g.probeMu.Unlock()
			}
		},
	})
}

// OnRecover registers fn to be called when a probe finds the origin back
// after an outage (the breaker was open); the warmer refreshes the
// declarations that went stale. fn runs on the prober's goroutine, with a
// context that Close cancels.
func (g *Guarded) OnRecover(fn func(ctx context.Context)) {
	g.probeMu.Lock()
	g.onRecover = append(g.onRecover, fn)
	g.probeMu.Unlock()
}

// Close stops the prober, waiting for it (and a recovery refresh it runs).
func (g *Guarded) Close() {
	g.cancel()
	g.wg.Wait()
}

// startProbe starts the prober of breaker generation gen, unless probes are
// off or one runs.
func (g *Guarded) startProbe(gen uint64) {
	if g.cfg.ProbeInterval <= 0 || g.ctx.Err() != nil {
		return
	}
	g.probeMu.Lock()
	defer g.probeMu.Unlock()
	if g.probing {
		return
	}
	g.probing = true
	g.wg.Add(1)
	go g.probe(gen)
}

// probe pings the origin every probe interval while breaker generation gen is
// open or half-open; a ping that answers replaces it with a fresh breaker
// and runs the OnRecover callbacks.
func (g *Guarded) probe(gen uint64) {
	defer g.wg.Done()
	g.probeMu.Lock()
	every := g.cfg.ProbeInterval << min(g.falseRecs, 16)
	g.probeMu.Unlock()
	if g.cfg.BreakerOpenFor > 0 {
		every = min(every, g.cfg.BreakerOpenFor)
	}
	timeout := g.cfg.AttemptTimeout
	if timeout <= 0 {
		timeout = max(every, time.Second)
	}
	t := time.NewTimer(every)
	defer t.Stop()
	recovered := false
	for !recovered {
		select {
		case <-g.ctx.Done():
		case <-t.C:
		}
		if g.ctx.Err() != nil || g.gen.Load() != gen || g.breaker.Load().State() == gobreaker.StateClosed {
			break
		}
		pctx, cancel := context.WithTimeout(g.ctx, timeout)
		err := g.src.Ping(pctx)
		cancel()
		if err != nil {
			g.metrics.probes.WithLabelValues(g.cfg.Name, "error").Inc()
			g.log.Debug().Err(err).Msg("origin probe: still down")
			t.Reset(every)
			continue
		}
		g.metrics.probes.WithLabelValues(g.cfg.Name, "ok").Inc()
		recovered = true
	}
	g.probeMu.Lock()
	g.probing = false
	fns := g.onRecover
	g.probeMu.Unlock()
	if !recovered {
		return
	}
	g.breaker.Store(g.newBreaker(true))
	g.log.Info().Msg("origin probe answered: circuit breaker closed, refreshing what went stale")
	for _, fn := range fns {
		fn(g.ctx)
	}
}

// CallRate is the origin protection's bound on calls per second (0: none).
func (g *Guarded) CallRate() float64 {
	r := float64(g.limiter.Limit())
	if math.IsInf(r, 0) || !(r > 0) {
		return 0
	}
	return r
}

// Prepare gets the origin ready for n loads at once (warmer.Preparer), at most
// max_in_flight of them, unless the breaker is open: it opens connections,
// it does not load, so it takes no call slot or rate token.
func (g *Guarded) Prepare(ctx context.Context, specs []*warmer.Spec, n int) {
	p, ok := g.src.(warmer.Preparer)
	if b := g.breaker.Load(); !ok || b != nil && b.State() == gobreaker.StateOpen {
		return
	}
	if g.cfg.MaxInFlight > 0 {
		n = min(n, g.cfg.MaxInFlight)
	}
	p.Prepare(ctx, specs, n)
}

// Ping checks the origin directly: it is a start-up check, not load.
func (g *Guarded) Ping(ctx context.Context) error { return g.src.Ping(ctx) }

// Load loads members through the protection. A batch error is retried whole;
// members that failed alone for a reason worth retrying (an HTTP 5xx) are
// retried alone, and the other members keep their first answer.
func (g *Guarded) Load(ctx context.Context, spec *warmer.Spec, members []string) ([]warmer.Result, error) {
	var (
		out     []warmer.Result
		index   map[string]int // built only when a member is retried
		pending = members
		bo      *backoff.ExponentialBackOff
	)
	for attempt := 0; ; attempt++ {
		rs, err := call(g, ctx, func(actx context.Context) ([]warmer.Result, error) {
			return g.src.Load(actx, spec, pending)
		}, g.verdict)
		if err != nil {
			if out != nil {
				// Earlier attempts answered for every member; the retried ones
				// keep their first error.
				return out, nil
			}
			if !g.retryable(err) || !g.wait(ctx, &bo, attempt) {
				return nil, err
			}
			continue
		}
		switch {
		case out == nil:
			out = rs
		default:
			if index == nil {
				index = make(map[string]int, len(out))
				for i, r := range out {
					if _, dup := index[r.Member]; !dup {
						index[r.Member] = i
					}
				}
			}
			out = merge(out, index, pending, rs)
		}
		retry := retryMembers(out, g.retryable)
		if len(retry) == 0 || !g.wait(ctx, &bo, attempt) {
			return out, nil
		}
		if spec.Template.IsFamily() {
			pending = retry
		}
	}
}

// retryMembers lists the members whose error is worth retrying.
func retryMembers(rs []warmer.Result, retryable func(error) bool) []string {
	var out []string
	for _, r := range rs {
		if r.Err != nil && retryable(r.Err) {
			out = append(out, r.Member)
		}
	}
	return out
}

// merge puts a retry's answers for pending members in place of their first
// answers; a pending member the retry does not mention is missing now.
func merge(out []warmer.Result, index map[string]int, pending []string, rs []warmer.Result) []warmer.Result {
	answered := make(map[string]bool, len(rs))
	for _, r := range rs {
		if i, ok := index[r.Member]; ok && !answered[r.Member] {
			out[i] = r
			answered[r.Member] = true
			continue
		}
		out = append(out, r) // not asked for: the warmer counts it
	}
	for _, m := range pending {
		if !answered[m] {
			out[index[m]] = warmer.Result{Member: m, Missing: true}
		}
	}
	return out
}

// ListMembers lists a family's members through the protection.
func (g guardedLister) ListMembers(ctx context.Context, spec *warmer.Spec, prev []string) ([]string, error) {
	lister := g.src.(warmer.MemberLister)
	var bo *backoff.ExponentialBackOff
	for attempt := 0; ; attempt++ {
		list, err := call(g.Guarded, ctx, func(actx context.Context) ([]string, error) {
			return lister.ListMembers(actx, spec, prev)
		}, func(ctx context.Context, _ []string, err error) error { return g.verdict(ctx, nil, err) })
		if err == nil || !g.retryable(err) || !g.wait(ctx, &bo, attempt) {
			return list, err
		}
	}
}

// call makes one origin call: breaker, call slot, rate token, attempt timeout.
func call[T any](g *Guarded, ctx context.Context, fn func(context.Context) (T, error), verdict func(context.Context, T, error) error) (T, error) {
	var zero T
	breaker := g.breaker.Load()
	if breaker != nil && breaker.State() == gobreaker.StateOpen {
		return zero, g.reject("breaker_open", warmer.ErrBreakerOpen, nil)
	}
	if g.sem != nil {
		if err := g.sem.Acquire(ctx, 1); err != nil {
			return zero, g.reject("in_flight", warmer.ErrOverloaded, err)
		}
		defer g.sem.Release(1)
	}
	if err := g.limiter.Wait(ctx); err != nil {
		return zero, g.reject("rate_limited", warmer.ErrOverloaded, err)
	}
	var done func(error)
	if breaker != nil {
		var err error
		if done, err = breaker.Allow(); err != nil {
			return zero, g.reject("breaker_open", warmer.ErrBreakerOpen, nil)
		}
	}
	actx, cancel := ctx, context.CancelFunc(func() {})
	if g.cfg.AttemptTimeout > 0 {
		actx, cancel = context.WithTimeout(ctx, g.cfg.AttemptTimeout)
	}
	v, err := fn(actx)
	cancel()
	if done != nil {
		done(verdict(ctx, v, err))
	}
	return v, err
}

func (g *Guarded) reject(reason string, sentinel, cause error) error {
	g.metrics.rejected.WithLabelValues(g.cfg.Name, reason).Inc()
	if cause != nil {
		return fmt.Errorf("source %s: %w: %w", g.cfg.Name, sentinel, cause)
	}
	return fmt.Errorf("source %s: %w", g.cfg.Name, sentinel)
}

// errExcluded marks a call the breaker must not count (the caller gave up).
var errExcluded = errors.New("excluded")

// errFailed is what the breaker is told about a failed call.
var errFailed = errors.New("failed")

// verdict tells the breaker whether a call failed: the origin did not answer
// (connection, timeout, 5xx) for the batch, or for at least half of its members.
// Bad payloads, missing rows and oversized values are answers: the origin is up.
func (g *Guarded) verdict(ctx context.Context, rs []warmer.Result, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return errExcluded
	}
	if err != nil {
		if g.retryable(err) {
			return errFailed
		}
		return nil
	}
	failed := 0
	for _, r := range rs {
		if r.Err != nil && g.retryable(r.Err) {
			failed++
		}
	}
	if failed > 0 && 2*failed >= len(rs) {
		return errFailed
	}
	return nil
}

func (g *Guarded) backoff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = g.cfg.RetryBackoff
	if b.InitialInterval <= 0 {
		b.InitialInterval = 100 * time.Millisecond
	}
	b.MaxInterval = max(g.cfg.RetryMaxBackoff, b.InitialInterval)
	b.Multiplier = 2
	b.RandomizationFactor = 0.5
	b.Reset()
	return b
}

// wait sleeps before retry number attempt+1 (the backoff is made on the first
// retry); false means do not retry: no
// retries left, the breaker is open, or the deadline comes before the wait ends.
func (g *Guarded) wait(ctx context.Context, bo **backoff.ExponentialBackOff, attempt int) bool {
	if attempt >= g.cfg.Retries || ctx.Err() != nil {
		return false
	}
	if b := g.breaker.Load(); b != nil && b.State() == gobreaker.StateOpen {
		return false
	}
	if *bo == nil {
		*bo = g.backoff()
	}
	d := (*bo).NextBackOff()
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= d {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	g.metrics.retries.WithLabelValues(g.cfg.Name).Inc()
	return true
}

// Retryable reports whether an origin error is worth retrying: a timeout, a
// refused, reset or dropped connection, or warmer.ErrUnavailable (HTTP 5xx, 429). A bad
// payload, a refusal by the protection or a cancelled load never is.
func Retryable(err error) bool {
	switch {
	case err == nil,
		errors.Is(err, context.Canceled),
		errors.Is(err, warmer.ErrBreakerOpen), errors.Is(err, warmer.ErrOverloaded),
		errors.Is(err, warmer.ErrTooLarge), errors.Is(err, warmer.ErrBadPayload), errors.Is(err, warmer.ErrNullValue),
		errors.Is(err, warmer.ErrDuplicate), errors.Is(err, warmer.ErrBadMember), errors.Is(err, warmer.ErrTooMany):
		return false
	case errors.Is(err, warmer.ErrUnavailable):
		return true
	}
	return neterr.Is(err)
}

// GuardMetrics are the origin protection's metrics, shared by every guarded
// source of a process.
type GuardMetrics struct {
	breakerState *prometheus.GaugeVec
	retries      *prometheus.CounterVec
	rejected     *prometheus.CounterVec
	probes       *prometheus.CounterVec
}

// NewGuardMetrics registers the origin protection metrics with reg (nil: not
// registered anywhere).
func NewGuardMetrics(reg prometheus.Registerer) *GuardMetrics {
	f := promauto.With(reg) // nil: unregistered
	m := &GuardMetrics{
		breakerState: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_origin_breaker_state",
			Help: "Circuit breaker state of a source: 0 closed, 1 half-open, 2 open.",
		}, []string{"source"}),
		retries: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_origin_retries_total",
			Help: "Origin calls repeated after a failure worth retrying.",
		}, []string{"source"}),
		rejected: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_origin_rejected_total",
			Help: "Origin calls not made, by reason (breaker_open, in_flight, rate_limited).",
		}, []string{"source", "reason"}),
		probes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_origin_probes_total",
			Help: "Pings of an origin while its circuit breaker was open, by result (ok: the breaker closed and the stale declarations were refreshed; error: still down).",
		}, []string{"source", "result"}),
	}
	return m
}
