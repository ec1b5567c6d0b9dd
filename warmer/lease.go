package warmer

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// Why a term ended or a write was refused.
var (
	// ErrNotLeader: this instance does not hold the lease (or can no longer
	// prove it does), so it must not write.
	ErrNotLeader = errors.New("not the leader")
	// ErrLeaseLost: renewing found the lease gone or held by another instance.
	ErrLeaseLost = errors.New("lease lost")
	// ErrLeaseExpired: no renew succeeded before the renew deadline.
	ErrLeaseExpired = errors.New("lease renew deadline passed")
	// ErrFenced: Redis refused a write because a newer leader exists.
	ErrFenced = errors.New("write fenced by a newer leader")
	// ErrReleased: the leader gave the lease up (shutdown).
	ErrReleased = errors.New("lease released")
)

// Gate admits the writes of one batch. A leader's gate returns a context that
// carries its term, whose epoch a fenced store attaches to every write; a
// standby's gate refuses with ErrNotLeader. The check is in memory.
type Gate interface {
	Admit(ctx context.Context) (context.Context, error)
}

// Fence is raised to a new leader's epoch before its first write, so that the
// writes of every older leader are refused from then on.
type Fence interface {
	Raise(ctx context.Context, epoch int64) error
}

// LeaseOptions configures a Lease. Client, Namespace and Duration are required.
type LeaseOptions struct {
	Client redis.UniversalClient
	// Namespace prefixes the lease's keys, <ns>:{lease} and <ns>:{lease}:epoch
	// (one hash tag, so that a Cluster keeps them in one slot), and its
	// release channel <ns>:lease:released.
	Namespace string
	// ID names this instance in the lease; the default is host-pid-random.
	ID string
	// Duration is how long the lease lives in Redis after each renewal.
	Duration time.Duration
	// RenewInterval is how often the leader renews (default Duration/3).
	RenewInterval time.Duration
	// RetryPeriod is how often a standby tries to acquire (default 1s); a
	// released lease is announced and taken at once.
	RetryPeriod time.Duration
	// Fence, when set, is raised to every new epoch before Campaign returns.
	Fence      Fence
	Registerer prometheus.Registerer
	Logger     zerolog.Logger
}

// Lease is a Redis leader lease with fencing epochs. Acquisition is one script:
// SET <ns>:{lease} <epoch>:<token> NX PX <lease> and the next epoch, atomically,
// so every term gets a strictly greater epoch. The leader renews with a
// compare-and-PEXPIRE every RenewInterval from a goroutine owned by the term;
// it counts as leader only until the start of its last successful renewal plus
// the lease minus a safety margin, measured on the monotonic clock, and stops
// writing from that moment even if Redis cannot be reached to say so.
type Lease struct {
	opts     LeaseOptions
	leaseKey string
	epochKey string
	channel  string
	safety   time.Duration
	base     time.Time // monotonic origin of deadlines
	metrics  *leaseMetrics
	log      zerolog.Logger

	attempt atomic.Uint64
	current atomic.Pointer[Term]
	wg      sync.WaitGroup
}

// Term is one tenure of this instance as leader.
type Term struct {
	// Epoch is the fencing token: greater than every earlier term's.
	Epoch int64

	lease    *Lease
	value    string // what the lease key holds: <epoch>:<token>
	deadline atomic.Int64
	done     chan struct{}
	once     sync.Once
	err      error
}

// NewLease builds a Lease; nothing talks to Redis until Campaign.
func NewLease(opts LeaseOptions) (*Lease, error) {
	if opts.Client == nil {
		return nil, errors.New("lease: no redis client")
	}
	if opts.Duration <= 0 {
		return nil, fmt.Errorf("lease: duration must be > 0 (got %s)", opts.Duration)
	}
	if opts.RenewInterval <= 0 {
		opts.RenewInterval = opts.Duration / 3
	}
	if opts.RenewInterval >= opts.Duration {
		return nil, fmt.Errorf("lease: renew interval %s must be shorter than the lease %s", opts.RenewInterval, opts.Duration)
	}
	if opts.RetryPeriod <= 0 {
		opts.RetryPeriod = time.Second
	}
	if opts.ID == "" {
		opts.ID = InstanceID()
	}
	if strings.ContainsAny(opts.ID, "/:") {
		return nil, fmt.Errorf("lease: instance id %q must not contain '/' or ':'", opts.ID)
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	ns := opts.Namespace
	return &Lease{
		opts:     opts,
		leaseKey: ns + ":{lease}",
		epochKey: ns + ":{lease}:epoch",
		channel:  ns + ":lease:released",
		safety:   opts.Duration / 10,
		base:     time.Now(),
		metrics:  newLeaseMetrics(opts.Registerer),
		log:      opts.Logger.With().Str("component", "lease").Str("instance", opts.ID).Logger(),
	}, nil
}

// InstanceID returns host-pid-random: unique per process, readable in logs.
func InstanceID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "hearth"
	}
	host = strings.NewReplacer("/", "_", ":", "_").Replace(host)
	b := make([]byte, 3)
	_, _ = crand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// ID is this instance's name in the lease.
func (l *Lease) ID() string { return l.opts.ID }

// Timing returns the lease duration, renew interval and retry period in use.
func (l *Lease) Timing() (lease, renew, retry time.Duration) {
	return l.opts.Duration, l.opts.RenewInterval, l.opts.RetryPeriod
}

func (l *Lease) since() time.Duration { return time.Since(l.base) }

// acquireScript takes the lease if it is free, or held by an earlier attempt of
// this same instance, under a new epoch = max(last epoch + 1, Redis time in ms):
// strictly increasing, and still increasing if Redis lost its data. A
// retransmission of the same attempt (same token) returns the same epoch, so
// the script is idempotent. Returns the epoch, or nil if another instance leads.
var acquireScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur then
  local e, tok = string.match(cur, '^(%d+):(.*)$')
  if tok == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return e
  end
  if tok == nil or string.sub(tok, 1, string.len(ARGV[2]) + 1) ~= ARGV[2] .. '/' then
    return false
  end
end
local t = redis.call('TIME')
local e = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if last >= e then e = last + 1 end
local es = string.format('%.0f', e)
redis.call('SET', KEYS[2], es)
redis.call('SET', KEYS[1], es .. ':' .. ARGV[1], 'PX', ARGV[3])
return es
`)

// renewScript extends the lease only if it still holds this term's value.
var renewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// releaseScript deletes the lease only if it still holds this term's value.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// Campaign blocks until this instance holds the lease, then returns its term,
// with the fence already raised to the term's epoch. It retries every
// RetryPeriod, and at once when the leader announces a release. It returns
// only ctx's error otherwise.
func (l *Lease) Campaign(ctx context.Context) (*Term, error) {
	released, closeSub := l.subscribe(ctx)
	defer closeSub()
	failing := false
	for {
		term, err := l.tryAcquire(ctx)
		if term != nil {
			return term, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		switch {
		case err != nil && !failing:
			l.log.Warn().Err(err).Msg("campaign: cannot reach redis; retrying")
			failing = true
		case err != nil:
			l.log.Debug().Err(err).Msg("campaign failed")
		case failing:
			l.log.Info().Msg("campaign: redis reachable again; standing by")
			failing = false
		}
		// ±10% so that standbys started together do not campaign in lockstep.
		wait := time.Duration(float64(l.opts.RetryPeriod) * (0.9 + 0.2*rand.Float64()))
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		case <-released:
			l.log.Debug().Msg("campaign: lease released by the leader")
		case <-timer.C:
		}
		timer.Stop()
	}
}

// subscribe listens for release announcements; without Redis it returns a
// channel that never fires (the retry period still applies).
func (l *Lease) subscribe(ctx context.Context) (<-chan *redis.Message, func()) {
	sub := l.opts.Client.Subscribe(ctx, l.channel)
	rctx, cancel := context.WithTimeout(ctx, l.opts.RetryPeriod)
	_, err := sub.Receive(rctx) // the subscription confirmation
	cancel()
	if err != nil {
		_ = sub.Close()
		return nil, func() {}
	}
	return sub.Channel(), func() { _ = sub.Close() }
}

func (l *Lease) tryAcquire(ctx context.Context) (*Term, error) {
	start := l.since()
	token := l.opts.ID + "/" + strconv.FormatUint(l.attempt.Add(1), 10)
	ms := l.opts.Duration.Milliseconds()
	actx, cancel := context.WithTimeout(ctx, l.opts.Duration-l.safety)
	defer cancel()
	res, err := acquireScript.Run(actx, l.opts.Client, []string{l.leaseKey, l.epochKey}, token, l.opts.ID, ms).Text()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("acquire lease %s: %w", l.leaseKey, err)
	}
	epoch, err := strconv.ParseInt(res, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("acquire lease %s: bad epoch %q", l.leaseKey, res)
	}
	t := &Term{Epoch: epoch, lease: l, value: res + ":" + token, done: make(chan struct{})}
	t.deadline.Store(int64(start + l.opts.Duration - l.safety))
	if l.opts.Fence != nil {
		if err := l.opts.Fence.Raise(actx, epoch); err != nil {
			l.release(context.WithoutCancel(ctx), t)
			return nil, fmt.Errorf("raise fence to epoch %d: %w", epoch, err)
		}
	}
	if !t.valid() {
		// Raising the fence took longer than the lease could be trusted.
		l.release(context.WithoutCancel(ctx), t)
		return nil, fmt.Errorf("acquire lease %s: %w", l.leaseKey, ErrLeaseExpired)
	}
	l.current.Store(t)
	l.metrics.leader.Set(1)
	l.metrics.epoch.Set(float64(epoch))
	l.metrics.transitions.WithLabelValues("acquired").Inc()
	l.log.Info().Int64("epoch", epoch).Msg("leading")
	l.wg.Add(1)
	go l.renewLoop(t)
	return t, nil
}

// renewLoop keeps the term's lease alive until the term ends. It is the only
// goroutine that renews, and it stops with its term: a lease never outlives
// the work it protects. The term ends at its renew deadline even while a
// renewal hangs (a paused or partitioned Redis).
func (l *Lease) renewLoop(t *Term) {
	defer l.wg.Done()
	timer := time.NewTimer(l.opts.RenewInterval)
	defer timer.Stop()
	type result struct {
		n   int64
		err error
	}
	for {
		select {
		case <-t.done:
			return
		case <-timer.C:
		}
		start := l.since()
		deadline := time.Duration(t.deadline.Load())
		if start >= deadline {
			t.end(ErrLeaseExpired)
			l.bestEffortRelease(t)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), deadline-start)
		res := make(chan result, 1)
		go func() {
			n, err := renewScript.Run(ctx, l.opts.Client, []string{l.leaseKey}, t.value, l.opts.Duration.Milliseconds()).Int64()
			res <- result{n, err}
		}()
		var r result
		select {
		case r = <-res:
		case <-ctx.Done():
			t.end(ErrLeaseExpired)
			<-res // no renewal outlives this loop
			cancel()
			l.metrics.renew.WithLabelValues("error").Observe((l.since() - start).Seconds())
			l.bestEffortRelease(t)
			return
		}
		cancel()
		took := (l.since() - start).Seconds()
		switch {
		case r.err == nil && r.n == 1:
			l.metrics.renew.WithLabelValues("ok").Observe(took)
			t.extend(start + l.opts.Duration - l.safety)
			timer.Reset(l.opts.RenewInterval)
		case r.err == nil:
			l.metrics.renew.WithLabelValues("lost").Observe(took)
			t.end(ErrLeaseLost)
			return
		default:
			l.metrics.renew.WithLabelValues("error").Observe(took)
			left := deadline - l.since()
			l.log.Warn().Err(r.err).Dur("left", left).Msg("lease renew failed; retrying until the renew deadline")
			timer.Reset(max(0, min(l.opts.RetryPeriod, l.opts.RenewInterval, left)))
		}
	}
}

// extend moves the deadline later, never earlier, and never revives an ended term.
func (t *Term) extend(d time.Duration) {
	for {
		old := t.deadline.Load()
		if old == 0 || int64(d) <= old {
			return
		}
		if t.deadline.CompareAndSwap(old, int64(d)) {
			return
		}
	}
}

func (t *Term) valid() bool {
	return t.lease.since() < time.Duration(t.deadline.Load())
}

// end closes the term once: the gate shuts at once, the renew loop stops.
func (t *Term) end(reason error) (ended bool) {
	t.once.Do(func() {
		ended = true
		t.deadline.Store(0)
		t.err = reason
		l := t.lease
		if l.current.CompareAndSwap(t, nil) {
			l.metrics.leader.Set(0)
		}
		result := "lost"
		switch {
		case errors.Is(reason, ErrFenced):
			result = "fenced"
		case errors.Is(reason, ErrReleased):
			result = "released"
		case errors.Is(reason, ErrLeaseExpired):
			result = "expired"
		}
		l.metrics.transitions.WithLabelValues(result).Inc()
		ev := l.log.Warn()
		if result == "released" {
			ev = l.log.Info()
		}
		ev.Int64("epoch", t.Epoch).Str("reason", reason.Error()).Msg("stepped down")
		close(t.done)
	})
	return ended
}

// Done is closed when the term ends.
func (t *Term) Done() <-chan struct{} { return t.done }

// Err says why the term ended (nil while it lasts).
func (t *Term) Err() error {
	select {
	case <-t.done:
		return t.err
	default:
		return nil
	}
}

// Valid reports whether this instance can still prove it leads in this term.
func (t *Term) Valid() bool { return t.valid() }

// Fenced ends the term because Redis refused one of its writes: a newer
// leader exists. Calls for an already ended term do nothing.
func (t *Term) Fenced() {
	if t.end(ErrFenced) {
		t.lease.bestEffortRelease(t)
	}
}

// Release ends the term and gives the lease up, then announces it so that a
// standby takes over at once. Call it after the last write.
func (t *Term) Release(ctx context.Context) error {
	t.end(ErrReleased)
	return t.lease.release(ctx, t)
}

func (l *Lease) release(ctx context.Context, t *Term) error {
	n, err := releaseScript.Run(ctx, l.opts.Client, []string{l.leaseKey}, t.value).Int64()
	if err != nil {
		return fmt.Errorf("release lease %s: %w", l.leaseKey, err)
	}
	if n == 1 {
		if err := l.opts.Client.Publish(ctx, l.channel, strconv.FormatInt(t.Epoch, 10)).Err(); err != nil {
			return fmt.Errorf("announce release: %w", err)
		}
	}
	return nil
}

// bestEffortRelease frees a lease this instance stopped trusting, so that a
// standby need not wait for it to expire; failure is harmless.
func (l *Lease) bestEffortRelease(t *Term) {
	ctx, cancel := context.WithTimeout(context.Background(), l.opts.RetryPeriod)
	defer cancel()
	if err := l.release(ctx, t); err != nil {
		l.log.Debug().Err(err).Msg("release after stepping down failed")
	}
}

// Current returns the term in progress, if this instance leads.
func (l *Lease) Current() (*Term, bool) {
	t := l.current.Load()
	if t == nil || !t.valid() {
		return nil, false
	}
	return t, true
}

// Admit implements Gate: it attaches the current term to ctx, or refuses.
func (l *Lease) Admit(ctx context.Context) (context.Context, error) {
	t, ok := l.Current()
	if !ok {
		return ctx, ErrNotLeader
	}
	return WithTerm(ctx, t), nil
}

// IsLeader implements gocron.Elector: nil while this instance can prove it
// leads. It reads memory only, never Redis.
func (l *Lease) IsLeader(context.Context) error {
	if _, ok := l.Current(); !ok {
		return ErrNotLeader
	}
	return nil
}

// Close ends the current term without releasing the lease (use Term.Release
// for that) and waits for the renew loop.
func (l *Lease) Close() {
	if t := l.current.Load(); t != nil {
		t.end(ErrReleased)
	}
	l.wg.Wait()
}

type termKey struct{}

// WithTerm returns a context carrying term; a fenced store writes with its epoch.
func WithTerm(ctx context.Context, t *Term) context.Context {
	return context.WithValue(ctx, termKey{}, t)
}

// TermFrom returns the term a context carries.
func TermFrom(ctx context.Context) (*Term, bool) {
	t, ok := ctx.Value(termKey{}).(*Term)
	return t, ok && t != nil
}

type leaseMetrics struct {
	leader      prometheus.Gauge
	epoch       prometheus.Gauge
	transitions *prometheus.CounterVec
	renew       *prometheus.HistogramVec
}

func newLeaseMetrics(reg prometheus.Registerer) *leaseMetrics {
	m := &leaseMetrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_leader",
			Help: "1 while this instance holds the leader lease and may write, else 0.",
		}),
		epoch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_leader_epoch",
			Help: "Fencing epoch of this instance's latest term as leader.",
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_leader_transitions_total",
			Help: "Leadership changes of this instance: acquired, released, lost, expired, fenced.",
		}, []string{"result"}),
		renew: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hearth_lease_renew_duration_seconds",
			Help:    "Duration of lease renewals by result (ok, lost, error).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 10),
		}, []string{"result"}),
	}
	for _, r := range []string{"acquired", "released", "lost", "expired", "fenced"} {
		m.transitions.WithLabelValues(r)
	}
	reg.MustRegister(m.leader, m.epoch, m.transitions, m.renew)
	return m
}
