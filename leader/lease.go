package leader

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

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/neterr"
	"github.com/hearth-dev/hearth/store"
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

// MaxEpochAhead bounds how far past Redis TIME an epoch read from Hearth's own
// keys may lie and still count as one Hearth issued (see store.MaxEpochAhead).
const MaxEpochAhead = store.MaxEpochAhead

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
	// MaxBackoff bounds the wait after failed attempts (default 4 ×
	// RetryPeriod), and BackoffJitter randomises it (±, default 0.2): the
	// takeover timing a config promises counts both.
	MaxBackoff    time.Duration
	BackoffJitter float64
	// Fence, when set, is raised to every new epoch before Campaign returns.
	Fence Fence
	// FailoverGrace, when set, lets a term outlive its renew deadline while
	// its lease cannot be renewed because Redis does not answer (a network
	// error, a renewal that hangs, CLUSTERDOWN, TRYAGAIN, MASTERDOWN,
	// LOADING: the lease's master failing over), for at most this long past
	// that deadline. Set it only with per-slot fences on a Cluster, where the
	// lease's master is one of several: every write is checked against the
	// fence of its slot and a new leader raises every slot's fence before it
	// writes, so what keeps a write safe is the fence, not the lease, and the
	// other masters' keys need not expire while one master is replaced. The
	// grace ends at once when the lease answers again (renewed: the term goes
	// on; gone or another's: it ends), when a write is refused by a fence, or
	// when it runs out. Zero (the default, and a single node's) ends the term
	// at its renew deadline.
	FailoverGrace time.Duration
	Registerer    prometheus.Registerer
	Logger        zerolog.Logger
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
	repairs  *store.Repairs
	log      zerolog.Logger

	attempt atomic.Uint64
	current atomic.Pointer[Term]
	wg      sync.WaitGroup
}

// Term is one tenure of this instance as leader: its epoch, and a context
// that ends when the term does (lease lost, renew deadline passed, fenced,
// released). The leader's work runs under that context.
type Term struct {
	// Epoch is the fencing token: greater than every earlier term's.
	Epoch int64

	lease    *Lease
	value    string // what the lease key holds: <epoch>:<token>
	deadline atomic.Int64
	// grace is set while the term outlives its renew deadline under
	// LeaseOptions.FailoverGrace (its lease's master unreachable).
	grace  atomic.Bool
	ctx    context.Context
	cancel context.CancelCauseFunc
	once   sync.Once
	err    error
	// renewNow asks the renew loop for a renewal at once (RenewNow).
	renewNow chan struct{}
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
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 4 * opts.RetryPeriod
	}
	if opts.BackoffJitter <= 0 {
		opts.BackoffJitter = 0.2
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
	log := opts.Logger.With().Str("component", "lease").Str("instance", opts.ID).Logger()
	return &Lease{
		opts:     opts,
		leaseKey: store.LeaseKey(ns),
		epochKey: store.EpochKey(ns),
		channel:  store.ReleaseChannel(ns),
		safety:   opts.Duration / 10,
		base:     time.Now(),
		metrics:  newLeaseMetrics(opts.Registerer),
		repairs:  store.NewRepairs(opts.Registerer, log),
		log:      log,
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

func (l *Lease) since() time.Duration { return time.Since(l.base) }

// Campaign blocks until this instance holds the lease, then returns its term,
// with the fence already raised to the term's epoch. While another instance
// leads it retries every RetryPeriod (±10%), and soon after another instance
// announces a release (its own announcements, and a flood of them, do not
// make it spin: at most one attempt per RetryPeriod/10). After a failed attempt
// (Redis unreachable, the fence refused the new epoch, raising it failed) it
// backs off exponentially with jitter, up to 4 × RetryPeriod (±20%), and logs what
// failed when that changes. It returns only ctx's error otherwise.
func (l *Lease) Campaign(ctx context.Context) (*Term, error) {
	released, closeSub := l.subscribe(ctx)
	defer closeSub()
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = l.opts.RetryPeriod
	// config's timing rule counts this backoff (config.TakeoverWait).
	bo.MaxInterval = l.opts.MaxBackoff
	bo.RandomizationFactor = l.opts.BackoffJitter
	bo.Multiplier = 2
	bo.Reset()
	minGap := l.opts.RetryPeriod / 10
	failing := ""
	var watch holderWatch
	for {
		last := time.Now()
		term, err := l.tryAcquire(ctx, &watch)
		if term != nil {
			l.metrics.attempts.WithLabelValues("acquired").Inc()
			return term, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var wait time.Duration
		if err != nil {
			what, result := campaignFailure(err)
			l.metrics.attempts.WithLabelValues(result).Inc()
			if result == "error" {
				l.metrics.campaignErrors.Inc()
			}
			wait = bo.NextBackOff()
			if neterr.IsRefused(err) && !errors.Is(err, errRaise) {
				// Nothing listens: Redis is restarting. A refused dial
				// costs it nothing, and the next term's catch-up writes
				// the keys back: try again every RetryPeriod/10 (±20%),
				// not after a backoff that grew while it was down.
				bo.Reset()
				wait = time.Duration(float64(minGap) * (0.8 + 0.4*rand.Float64()))
			}
			if what != failing {
				l.log.Warn().Err(err).Dur("retry_in_ms", wait).Msg("campaign: " + what + "; backing off")
				failing = what
			} else {
				l.log.Debug().Err(err).Dur("retry_in_ms", wait).Msg("campaign: " + what)
			}
		} else {
			l.metrics.attempts.WithLabelValues("held").Inc()
			if failing != "" {
				l.log.Info().Str("was", failing).Msg("campaign: attempts succeed again; standing by")
				failing = ""
			}
			bo.Reset()
			// ±10% so that standbys started together do not campaign in lockstep.
			wait = time.Duration(float64(l.opts.RetryPeriod) * (0.9 + 0.2*rand.Float64()))
			if due, ok := watch.due(l.opts.Duration); ok {
				// Look again the moment the holder has gone a lease unrenewed.
				wait = min(wait, max(0, due-l.since()))
			}
		}
		if err := l.wait(ctx, released, last, wait, minGap, failing != ""); err != nil {
			return nil, err
		}
	}
}

// wait sleeps until the next attempt: for wait, or until minGap after the
// last attempt's start once another instance announces a release. After a failed attempt releases
// do not cut the backoff short (two fenced instances would otherwise wake
// each other at once, forever).
func (l *Lease) wait(ctx context.Context, released <-chan *redis.Message, last time.Time, wait, minGap time.Duration, failing bool) error {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	early := false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return nil
		case m, ok := <-released:
			if !ok {
				released = nil
				continue
			}
			if failing || early || l.ownRelease(m.Payload) {
				continue
			}
			l.log.Debug().Str("lease", m.Payload).Msg("campaign: lease released by the leader")
			early = true
			timer.Reset(max(0, minGap-time.Since(last)))
		}
	}
}

// ownRelease reports whether a release announcement (the released lease value,
// <epoch>:<id>/<attempt>) came from this instance.
func (l *Lease) ownRelease(payload string) bool {
	_, tok, ok := strings.Cut(payload, ":")
	if !ok {
		return false
	}
	id, _, ok := strings.Cut(tok, "/")
	return ok && id == l.opts.ID
}

// errRaise marks a fence raise that failed for another reason than a newer epoch.
var errRaise = errors.New("raise fence failed")

// campaignFailure says what a failed attempt ran into, for the log, and its
// result label in hearth_lease_campaign_attempts_total.
func campaignFailure(err error) (what, result string) {
	var rerr redis.Error
	switch {
	case errors.Is(err, ErrFenced):
		return "fenced: the fence holds a newer epoch than the one just acquired", "fenced"
	case errors.Is(err, ErrLeaseExpired):
		return "raising the fence outlasted the lease", "error"
	case errors.Is(err, errRaise) && neterr.Is(err):
		return "raising the fence failed: cannot reach redis", "error"
	case errors.Is(err, errRaise) && errors.As(err, &rerr):
		return "raising the fence failed: redis refused it", "error"
	case errors.Is(err, errRaise):
		return "raising the fence failed", "error"
	case neterr.Is(err):
		return "cannot reach redis", "error"
	case errors.As(err, &rerr):
		return "acquiring the lease failed: redis refused it", "error"
	default:
		return "acquiring the lease failed", "error"
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

// holderWatch is what a standby saw of another instance's lease: its value,
// its expiry in Redis ms (TIME + PTTL) and since when (l.since()) it has seen
// that pair unchanged. A Hearth holder renews every renew interval, which is
// shorter than the lease, and each renewal moves the expiry; a holder seen
// unrenewed for a whole lease is not one (with the same lease setting, its
// own deadline, last renewal + lease − lease/10, has passed by then).
type holderWatch struct {
	value string
	exp   int64
	since time.Duration
}

// saw records one look at the lease: a new holder, or a renewal, restarts the clock.
func (w *holderWatch) saw(value string, exp int64, at time.Duration) {
	if value == w.value && exp >= w.exp-store.RenewTolerance && exp <= w.exp+store.RenewTolerance {
		return
	}
	*w = holderWatch{value: value, exp: exp, since: at}
}

// due says when the holder will have gone one lease unrenewed.
func (w *holderWatch) due(lease time.Duration) (time.Duration, bool) {
	if w.value == "" {
		return 0, false
	}
	return w.since + lease + time.Millisecond, true
}

func (l *Lease) tryAcquire(ctx context.Context, watch *holderWatch) (*Term, error) {
	start := l.since()
	token := l.opts.ID + "/" + strconv.FormatUint(l.attempt.Add(1), 10)
	ms := l.opts.Duration.Milliseconds()
	actx, cancel := context.WithTimeout(ctx, l.opts.Duration-l.safety)
	defer cancel()
	args := []any{token, l.opts.ID, ms}
	if due, ok := watch.due(l.opts.Duration); ok && start >= due {
		// Seen unrenewed for a whole lease: take it over if it is still
		// exactly what was seen.
		args = append(args, watch.value, watch.exp, (start - watch.since).Milliseconds())
	}
	reply, err := store.Acquire.Run(actx, l.opts.Client, []string{l.leaseKey, l.epochKey}, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("acquire lease %s: %w", l.leaseKey, err)
	}
	if len(reply) < 3 || len(reply)%3 != 0 {
		return nil, fmt.Errorf("acquire lease %s: unexpected reply %q", l.leaseKey, reply)
	}
	for i := 3; i+2 < len(reply); i += 3 {
		key := l.leaseKey
		if reply[i] == store.KindEpoch {
			key = l.epochKey
		}
		l.repairs.RepairedWhy(reply[i], key, reply[i+1], reply[i+2])
	}
	res := reply[0]
	if res == "" {
		if reply[1] == "" {
			return nil, fmt.Errorf("acquire lease %s: unexpected reply %q", l.leaseKey, reply)
		}
		exp, err := strconv.ParseInt(reply[2], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("acquire lease %s: bad expiry %q", l.leaseKey, reply[2])
		}
		// The look happened at the latest now: counting from now never
		// takes a renewal that arrived during the call for no renewal.
		watch.saw(reply[1], exp, l.since())
		return nil, nil
	}
	*watch = holderWatch{}
	epoch, err := strconv.ParseInt(res, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("acquire lease %s: bad epoch %q", l.leaseKey, res)
	}
	t := &Term{Epoch: epoch, lease: l, value: res + ":" + token, renewNow: make(chan struct{}, 1)}
	t.ctx, t.cancel = context.WithCancelCause(context.Background())
	t.deadline.Store(int64(start + l.opts.Duration - l.safety))
	if l.opts.Fence != nil {
		if err := l.opts.Fence.Raise(actx, epoch); err != nil {
			l.release(context.WithoutCancel(ctx), t)
			if errors.Is(err, ErrFenced) {
				return nil, fmt.Errorf("raise fence to epoch %d: %w", epoch, err)
			}
			return nil, fmt.Errorf("raise fence to epoch %d: %w: %w", epoch, errRaise, err)
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
// renewal hangs (a paused or partitioned Redis), unless FailoverGrace lets it
// outlive the deadline while the lease's master does not answer (see grace).
func (l *Lease) renewLoop(t *Term) {
	defer l.wg.Done()
	type result struct {
		n   int64
		err error
	}
	// lastOK is the start of the last successful renewal (or of the
	// acquisition): the grace is counted from the deadline it set.
	lastOK := time.Duration(t.deadline.Load()) - l.opts.Duration + l.safety
	// The first renewal is due a renew interval after the acquisition
	// began, not after this loop starts: raising a Cluster's 16,384 fences
	// can take most of a short lease, and a term that waited a whole
	// interval more would reach its deadline unrenewed.
	timer := time.NewTimer(max(0, lastOK+l.opts.RenewInterval-l.since()))
	defer timer.Stop()
	unreachable := false // the last renewal failed because Redis did not answer
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-timer.C:
		case <-t.renewNow:
		}
		start := l.since()
		deadline := time.Duration(t.deadline.Load())
		if start >= deadline && !l.grace(t, unreachable, lastOK) {
			t.end(ErrLeaseExpired)
			l.bestEffortRelease(t)
			return
		}
		deadline = time.Duration(t.deadline.Load())
		wait := deadline - start
		if t.grace.Load() {
			// A renewal that hangs in the grace is retried, not waited for
			// until the grace runs out.
			wait = min(wait, l.opts.Duration-l.safety)
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		res := make(chan result, 1)
		go func() {
			n, err := store.Renew.Run(ctx, l.opts.Client, []string{l.leaseKey}, t.value, l.opts.Duration.Milliseconds()).Int64()
			res <- result{n, err}
		}()
		var r result
		select {
		case r = <-res:
		case <-ctx.Done():
			// Outside the grace the wait ran to the deadline: the term ends
			// now, not when the renewal gives up, unless the grace begins.
			if !t.grace.Load() && !l.grace(t, true, lastOK) {
				t.end(ErrLeaseExpired)
				<-res // no renewal outlives this loop
				cancel()
				l.metrics.renew.WithLabelValues("error").Observe((l.since() - start).Seconds())
				l.bestEffortRelease(t)
				return
			}
			r = <-res // a renewal that hung in the grace is tried again
		}
		cancel()
		took := (l.since() - start).Seconds()
		switch {
		case r.err == nil && r.n == 1:
			l.metrics.renew.WithLabelValues("ok").Observe(took)
			lastOK, unreachable = start, false
			if t.grace.Load() {
				// The deadline goes back to what this renewal proves.
				if !t.setDeadline(start + l.opts.Duration - l.safety) {
					return
				}
				t.grace.Store(false)
				l.metrics.grace.Set(0)
				l.log.Info().Int64("epoch", t.Epoch).Msg("lease renewed again: the failover grace is over; still leading")
			} else {
				t.extend(start + l.opts.Duration - l.safety)
			}
			timer.Reset(l.opts.RenewInterval)
		case r.err == nil:
			l.metrics.renew.WithLabelValues("lost").Observe(took)
			t.end(ErrLeaseLost)
			return
		default:
			l.metrics.renew.WithLabelValues("error").Observe(took)
			unreachable = neterr.IsTopology(r.err)
			left := time.Duration(t.deadline.Load()) - l.since()
			if left <= 0 {
				timer.Reset(0) // the deadline passed: grace or the end, at once
				continue
			}
			if t.grace.Load() {
				l.log.Debug().Err(r.err).Dur("left_ms", left).Msg("lease renew failed in the failover grace; retrying")
			} else {
				l.log.Warn().Err(r.err).Dur("left_ms", left).Msg("lease renew failed; retrying until the renew deadline")
			}
			timer.Reset(max(0, min(l.opts.RetryPeriod, l.opts.RenewInterval, left)))
		}
	}
}

// grace decides, at t's renew deadline, whether the term goes on under
// FailoverGrace: only when the grace is set, the last renewal failed because
// Redis did not answer (never after a reply), the deadline is seen on time
// (within lease/10: not by a process that was stopped past it), and not
// already in a grace that ran out. It moves the deadline to lastOK's
// deadline + FailoverGrace.
func (l *Lease) grace(t *Term, unreachable bool, lastOK time.Duration) bool {
	if l.opts.FailoverGrace <= 0 || !unreachable || t.grace.Load() {
		return false
	}
	deadline := lastOK + l.opts.Duration - l.safety
	if l.since() > deadline+l.safety {
		// Seen this late, the deadline passed while this process did not
		// run (SIGSTOP, a frozen VM): not Redis's silence. A stopped
		// leader stops at its deadline, as on a single node.
		return false
	}
	if !t.setDeadline(deadline + l.opts.FailoverGrace) {
		return false
	}
	t.grace.Store(true)
	l.metrics.grace.Set(1)
	l.metrics.graces.Inc()
	l.log.Warn().Int64("epoch", t.Epoch).Dur("grace_ms", l.opts.FailoverGrace).
		Msg("lease master unreachable at the renew deadline: writing on under the per-slot fences until it answers, at most the failover grace")
	return true
}

// setDeadline sets the deadline, earlier or later, unless the term ended.
func (t *Term) setDeadline(d time.Duration) bool {
	for {
		old := t.deadline.Load()
		if old == 0 {
			return false
		}
		if t.deadline.CompareAndSwap(old, int64(d)) {
			return true
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
		if t.grace.Load() {
			l.metrics.grace.Set(0)
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
		t.cancel(reason)
	})
	return ended
}

// Context ends when the term ends; its cause (context.Cause) is Err.
func (t *Term) Context() context.Context { return t.ctx }

// Done is closed when the term ends.
func (t *Term) Done() <-chan struct{} { return t.ctx.Done() }

// Err says why the term ended (nil while it lasts).
func (t *Term) Err() error {
	select {
	case <-t.ctx.Done():
		return t.err
	default:
		return nil
	}
}

// RenewNow asks for a renewal at once instead of at the next renew
// interval: when Redis has just lost its data (a restart, a flush), the lease
// went with it, and the sooner the term sees that, the sooner a new term's
// catch-up writes every key back. It never waits; asks made while one is
// pending are one.
func (t *Term) RenewNow() {
	select {
	case t.renewNow <- struct{}{}:
	default:
	}
}

// Valid reports whether this instance can still prove it leads in this term,
// or, in its failover grace (LeaseOptions.FailoverGrace), may still write
// under the per-slot fences.
func (t *Term) Valid() bool { return t.valid() }

// Fenced ends the term because Redis refused one of its writes: a newer
// leader exists. Calls for an already ended term do nothing. Unless the
// refusal came from a foreign fence: while the term is valid and the epoch
// counter still holds its epoch (no newer term was issued), the fences are
// raised to it again, which repairs a fence above the counter; if that
// succeeds the term goes on (the refused write stays refused).
func (t *Term) Fenced() {
	if t.refence() {
		return
	}
	if t.end(ErrFenced) {
		t.lease.bestEffortRelease(t)
	}
}

// refence raises the fences to the term's epoch again after a refused write,
// if no newer epoch was issued; true if the term may go on.
func (t *Term) refence() bool {
	l := t.lease
	if l.opts.Fence == nil || !t.valid() || t.grace.Load() {
		// In the failover grace the epoch counter, beside the lease, cannot
		// be read: a refused write ends the term.
		return false
	}
	left := time.Duration(t.deadline.Load()) - l.since()
	// Raising 16,384 per-slot fences can take a while: up to the deadline.
	ctx, cancel := context.WithTimeout(context.Background(), max(0, left))
	defer cancel()
	raw, err := l.opts.Client.Get(ctx, l.epochKey).Result()
	if err != nil || raw != strconv.FormatInt(t.Epoch, 10) {
		return false // a newer term exists, or it cannot be told
	}
	if err := l.opts.Fence.Raise(ctx, t.Epoch); err != nil {
		return false
	}
	if !t.valid() {
		return false
	}
	l.log.Warn().Int64("epoch", t.Epoch).Msg("write refused by a foreign fence, which is repaired; still leading")
	return true
}

// Release ends the term and gives the lease up, then announces it so that a
// standby takes over at once. Call it after the last write.
func (t *Term) Release(ctx context.Context) error {
	t.end(ErrReleased)
	return t.lease.release(ctx, t)
}

func (l *Lease) release(ctx context.Context, t *Term) error {
	n, err := store.Release.Run(ctx, l.opts.Client, []string{l.leaseKey}, t.value).Int64()
	if err != nil {
		return fmt.Errorf("release lease %s: %w", l.leaseKey, err)
	}
	if n == 1 {
		// The released value names this instance: its own campaign skips it.
		if err := l.opts.Client.Publish(ctx, l.channel, t.value).Err(); err != nil {
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

// Close ends the current term without releasing the lease (use Term.Release
// for that) and waits for the renew loop until ctx ends.
func (l *Lease) Close(ctx context.Context) error {
	if t := l.current.Load(); t != nil {
		t.end(ErrReleased)
	}
	done := make(chan struct{})
	go func() {
		l.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("lease: close: renew loop still running: %w", context.Cause(ctx))
	}
}

type leaseMetrics struct {
	leader      prometheus.Gauge
	epoch       prometheus.Gauge
	transitions *prometheus.CounterVec
	renew       *prometheus.HistogramVec
	// campaignErrors makes a standby that cannot reach Redis visible.
	campaignErrors prometheus.Counter
	// attempts shows a campaign loop's pace: it must never spin.
	attempts *prometheus.CounterVec
	// grace is 1 while a term outlives its renew deadline under
	// FailoverGrace; graces counts the terms that entered one.
	grace  prometheus.Gauge
	graces prometheus.Counter
}

func newLeaseMetrics(reg prometheus.Registerer) *leaseMetrics {
	f := promauto.With(reg)
	m := &leaseMetrics{
		leader: f.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_leader",
			Help: "1 while this instance holds the leader lease and may write, else 0.",
		}),
		epoch: f.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_leader_epoch",
			Help: "Fencing epoch of this instance's latest term as leader.",
		}),
		transitions: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_leader_transitions_total",
			Help: "Leadership changes of this instance: acquired, released, lost, expired, fenced.",
		}, []string{"result"}),
		renew: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hearth_lease_renew_duration_seconds",
			Help:    "Duration of lease renewals by result (ok, lost, error).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 10),
		}, []string{"result"}),
	}
	m.campaignErrors = f.NewCounter(prometheus.CounterOpts{
		Name: "hearth_lease_campaign_errors_total",
		Help: "Attempts to take the lease that failed: Redis unreachable or refusing the script, or raising the fence failed (a fence holding a newer epoch is counted in hearth_lease_campaign_attempts_total{result=\"fenced\"}).",
	})
	m.attempts = f.NewCounterVec(prometheus.CounterOpts{
		Name: "hearth_lease_campaign_attempts_total",
		Help: "Attempts to take the lease, by result (acquired, held: another instance leads, fenced: the fence refused the new epoch, error).",
	}, []string{"result"})
	m.grace = f.NewGauge(prometheus.GaugeOpts{
		Name: "hearth_leader_failover_grace",
		Help: "1 while this instance's term outlives its renew deadline because the lease's master does not answer (leader.failover_grace; per-slot fences on a Cluster keep its writes safe).",
	})
	m.graces = f.NewCounter(prometheus.CounterOpts{
		Name: "hearth_leader_failover_graces_total",
		Help: "Terms that went on past their renew deadline under the failover grace because the lease's master did not answer.",
	})
	for _, r := range []string{"acquired", "released", "lost", "expired", "fenced"} {
		m.transitions.WithLabelValues(r)
	}
	for _, r := range []string{"acquired", "held", "fenced", "error"} {
		m.attempts.WithLabelValues(r)
	}
	return m
}
