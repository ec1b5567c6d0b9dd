// Package rewarm owns the re-warm: it notices that Redis lost its data — a
// flush, a restart, a failover — by a marker key per master and the masters'
// run_ids, watched by a periodic check and pushed client-tracking
// invalidations, and then loads again at once what a warm Redis holds. It sees
// the refresh engine through Refresher and the pre-warm through a function
// (Options.Prewarm); the daemon runs it per leader term.
package rewarm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/neterr"
	"github.com/hearth-dev/hearth/store"
)

// DefaultMinGap is the least time between the starts of two full
// re-warms. Losses seen sooner (a DEL loop on the marker, flushes in a row)
// are counted as suppressed, and one re-warm runs once the gap has passed.
const DefaultMinGap = 10 * time.Second

// MinCheckGap is the least time between the starts of two checks that
// reached Redis, whatever asks for them (the poll, a push, a reconnection):
// at most 10 checks a second. A trigger that comes sooner is covered by one
// check once the gap has passed. A check that no Redis answered does not
// count: while Redis is down, the push watch's own backoff paces them. After
// checks that met MOVED or ASK (a reshard moving a marker's slot) the gap
// doubles, up to a second.
const MinCheckGap = 100 * time.Millisecond

// Reasons for a re-warm.
const (
	// Restart: the Redis run_id changed (a restart or a failover).
	Restart = "restart"
	// Flush: the marker key is gone (FLUSHDB, FLUSHALL, eviction).
	Flush = "flush"
)

// How a loss was detected, the via label of hearth_prewarm_rewarm_detections_total.
const (
	// DetectPush: a push (an invalidation, a dropped watch connection) made
	// the check run at once.
	DetectPush = "push"
	// DetectPoll: the periodic check.
	DetectPoll = "poll"
)

// Refresher is what a re-warm needs of the refresh engine (*warmer.Warmer):
// every declaration's members refreshed once, unpaced, or only those whose key
// keep accepts (nil: all).
type Refresher interface {
	RefreshWhere(ctx context.Context, keep func(key string) bool) error
}

// Options configures a Rewarmer. Client, Namespace and Warmer are required.
type Options struct {
	Client redis.UniversalClient
	// Namespace prefixes the marker key (see store.MarkerKey).
	Namespace string
	// Interval is how often Redis is checked (default 2s).
	Interval time.Duration
	// MinGap is the least time between the starts of two full re-warms
	// (default DefaultMinGap). A loss seen sooner is counted in
	// hearth_prewarm_rewarms_suppressed_total and re-warmed once the gap
	// has passed: coalesced, never lost.
	MinGap time.Duration
	Warmer Refresher
	// NoPush turns the push watch off: losses are then seen by the periodic
	// check only. With it on (the default), Run also keeps one connection
	// per master subscribed to client-tracking invalidations of its marker
	// (CLIENT TRACKING ON REDIRECT, the marker key alone): a flush, a change
	// of the marker or a dropped connection (a restart, a failover) makes the
	// check run at once instead of at the next Interval.
	NoPush bool
	// Prewarm, if not nil, runs first in a re-warm, before the refresh of
	// every declaration: the daemon's pre-warm (the hottest keys first)
	// without its rate, for reason, loading only the access-log keys keep
	// accepts (nil: all).
	Prewarm func(ctx context.Context, reason string, keep func(key string) bool) error
	// OnLoss, if not nil, is called when a check found that Redis lost its
	// data: after the re-warm it ran, or at once when the re-warm waits for
	// MinGap. It must not block: the daemon has the leader's term renew its
	// lease then, since the lease was lost with the data and a new term's
	// catch-up writes the declared keys back.
	OnLoss     func()
	Registerer prometheus.Registerer
	Logger     zerolog.Logger
}

// Rewarmer notices that Redis lost its data, by its run_id changing (restart)
// or by a marker key it keeps disappearing (flush), and then re-runs the
// pre-warm and every declaration's refresh at once, so that a cold Redis is
// warm again within seconds rather than after each key's next scheduled refresh.
type Rewarmer struct {
	opts       Options
	log        zerolog.Logger
	rewarms    *prometheus.CounterVec
	suppressed *prometheus.CounterVec
	errors     prometheus.Counter
	ignored    prometheus.Counter
	repairs    *store.Repairs

	detections *prometheus.CounterVec

	mu       sync.Mutex
	runIDs   map[string]string // marker key → run_id of its master; nil until a baseline is taken
	pending  string            // a loss whose re-warm did not finish as leader
	deferred string            // a loss seen within MinGap of the last re-warm
	scope    *slotScope        // the slots to re-warm for pending/deferred; nil: all
	last     time.Time         // start of the last full re-warm
	quiet    bool              // a suppression was logged since the last re-warm
	running  bool              // Run is running
	kick     chan string       // a push asks for a check now
	push     *pushWatch        // nil with NoPush or outside Run
}

// New builds a Rewarmer; nothing runs until Run or CheckOnce.
func New(opts Options) (*Rewarmer, error) {
	switch {
	case opts.Client == nil:
		return nil, errors.New("rewarmer: no redis client")
	case opts.Namespace == "":
		return nil, errors.New("rewarmer: no namespace")
	case opts.Warmer == nil:
		return nil, errors.New("rewarmer: no warmer")
	}
	if opts.Interval <= 0 {
		opts.Interval = 2 * time.Second
	}
	if opts.MinGap <= 0 {
		opts.MinGap = DefaultMinGap
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	log := opts.Logger.With().Str("component", "rewarm").Logger()
	f := promauto.With(opts.Registerer)
	r := &Rewarmer{
		opts:    opts,
		log:     log,
		repairs: store.NewRepairs(opts.Registerer, log),
		kick:    make(chan string, 1),
		rewarms: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_prewarm_rewarms_total",
			Help: "Re-warms started because Redis lost its data, by reason (restart, flush).",
		}, []string{"reason"}),
		suppressed: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_prewarm_rewarms_suppressed_total",
			Help: "Losses of Redis data seen within the minimum gap after a re-warm, by reason: coalesced into one re-warm once the gap has passed.",
		}, []string{"reason"}),
		errors: f.NewCounter(prometheus.CounterOpts{
			Name: "hearth_prewarm_rewarm_check_errors_total",
			Help: "Checks for lost Redis data that could not reach Redis.",
		}),
		detections: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_prewarm_rewarm_detections_total",
			Help: "Losses of Redis data detected, by how: push (a client-tracking invalidation or a dropped watch connection made the check run at once) or poll (the periodic check).",
		}, []string{"via"}),
		ignored: f.NewCounter(prometheus.CounterOpts{
			Name: "hearth_prewarm_rewarm_ignored_invalidations_total",
			Help: "Invalidations the re-warm push watch received that were not of its marker key (another client's PUBLISH on __redis__:invalidate): dropped without a check.",
		}),
	}
	for _, reason := range []string{Restart, Flush} {
		r.rewarms.WithLabelValues(reason)
		r.suppressed.WithLabelValues(reason)
	}
	r.detections.WithLabelValues(DetectPush)
	r.detections.WithLabelValues(DetectPoll)
	return r, nil
}

// CheckOnce checks Redis once and, if it lost its data, re-warms before
// returning. It returns the reason of the re-warm it ran ("" when none). The
// first check only takes the baseline: it writes the marker and remembers the
// run_id. A re-warm whose context ended (the leader's term) is run again by
// the first check of the next Run. Re-warms start at least MinGap
// apart: a loss seen sooner is counted as suppressed and re-warmed by the
// first check after the gap. A marker holding a foreign value counts as
// absent (a flush): it is repaired, logged and counted.
func (r *Rewarmer) CheckOnce(ctx context.Context) (string, error) {
	return r.check(ctx, DetectPoll)
}

// check is CheckOnce; via says what made it run, for the detections metric.
func (r *Rewarmer) check(ctx context.Context, via string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Err() != nil {
		return "", nil
	}
	sites, err := r.sites(ctx)
	if err != nil {
		r.errors.Inc()
		return "", fmt.Errorf("rewarm check: %w", err)
	}
	defer r.watch(sites)
	if r.runIDs == nil {
		return "", r.arm(ctx, sites)
	}
	// Each master's marker goes back first: a flush during the re-warm is
	// then seen by the next check, and re-warmed again.
	detected := ""
	var lost []site
	ids := make(map[string]string, len(sites))
	watched := make(map[string]bool, len(r.runIDs))
	for _, id := range r.runIDs {
		watched[id] = true
	}
	for i := range sites {
		st := &sites[i]
		present, err := r.setMarker(ctx, st, false)
		if err != nil {
			return "", err
		}
		ids[st.marker] = st.runID
		known, ok := r.runIDs[st.marker]
		if !ok || (st.runID != known && watched[st.runID]) {
			// A new master, or the master's lowest slot moved (a reshard):
			// armed now (the script wrote the marker back), there is no
			// baseline to compare with. A marker now served by another
			// master that was watched under the same run_id is a slot that
			// moved between two live masters with its keys (the reshard's
			// target gained a lower slot): no loss. A restart or a failover
			// shows a run_id never watched.
			continue
		}
		switch {
		case st.runID != known:
			detected = Restart
			lost = append(lost, *st)
		case !present:
			if detected == "" {
				detected = Flush
			}
			lost = append(lost, *st)
		}
	}
	r.runIDs = ids
	if detected != "" {
		r.detections.WithLabelValues(via).Inc()
	}
	// The loss took the lease with it: once the keys are back (or at once,
	// when the re-warm waits for its gap) the term renews now, so that a
	// lost lease ends it and the next term's catch-up runs. Not before the
	// re-warm: ending the term would cancel it.
	onLoss := func() {
		if detected != "" && r.opts.OnLoss != nil {
			r.opts.OnLoss()
		}
	}
	scope := scopeOf(lost, len(sites))
	reason := r.pending
	if reason == "" {
		reason = r.deferred
	}
	if reason != "" {
		scope = r.scope.union(scope, detected != "")
	} else {
		reason = detected
	}
	if reason == "" {
		return "", nil
	}
	// A re-warm that a term's end cut short is finished at once by the next
	// term: the gap bounds how often losses are re-warmed, and that loss
	// was counted once.
	if wait := r.opts.MinGap - time.Since(r.last); r.pending == "" && !r.last.IsZero() && wait > 0 {
		if detected != "" {
			r.suppressed.WithLabelValues(detected).Inc()
			ev := r.log.Debug()
			if !r.quiet {
				ev, r.quiet = r.log.Warn(), true
			}
			ev.Str("reason", detected).Dur("gap_ms", r.opts.MinGap).Dur("runs_in_ms", wait).
				Msg("redis lost its data again soon after a re-warm: one re-warm runs once the minimum gap has passed")
		}
		r.deferred = reason
		r.scope = scope
		// The poll may be far off, or off: come back once the gap has passed.
		time.AfterFunc(wait, r.kickNow)
		onLoss()
		return "", nil
	}
	if r.pending == "" {
		r.rewarms.WithLabelValues(reason).Inc()
		r.log.Warn().Str("reason", reason).Str("via", via).Str("slots", scope.String()).Msg("redis lost its data: re-warming")
	} else {
		r.log.Warn().Str("reason", reason).Msg("leading again: finishing the re-warm")
	}
	r.pending, r.deferred, r.scope, r.last, r.quiet = reason, "", scope, time.Now(), false
	err = r.rewarm(ctx, reason, scope)
	onLoss()
	if ctx.Err() == nil {
		r.pending, r.scope = "", nil
	} else {
		r.log.Warn().Str("reason", reason).Msg("leadership lost during the re-warm: it runs again once leading")
	}
	return reason, err
}

// arm writes every master's marker and takes the run_ids as the baseline.
func (r *Rewarmer) arm(ctx context.Context, sites []site) error {
	ids := make(map[string]string, len(sites))
	for i := range sites {
		if _, err := r.setMarker(ctx, &sites[i], true); err != nil {
			return err
		}
		ids[sites[i].marker] = sites[i].runID
	}
	r.runIDs = ids
	r.log.Debug().Int("masters", len(sites)).Str("marker", store.MarkerKey(r.opts.Namespace)).Msg("re-warm watch armed")
	return nil
}

// Mark arms the watch now: it writes the marker and takes the run_id as the
// baseline. Call it right after warming Redis (the start-up pre-warm), so that a
// loss from then on is seen, even one before the first periodic check.
func (r *Rewarmer) Mark(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sites, err := r.sites(ctx)
	if err != nil {
		r.errors.Inc()
		return fmt.Errorf("rewarm mark: %w", err)
	}
	defer r.watch(sites)
	return r.arm(ctx, sites)
}

// setMarker writes the marker back if it is absent or foreign (always, with
// force), reports whether a valid one was there, and sets st.runID. A foreign
// marker is logged and counted, and reported absent: Hearth cannot tell what
// happened to Redis's data, so it re-warms. The script and INFO go in one
// pipeline, on one connection: both answers come from the same server, so a
// restart between them cannot pass for a flush under the old run_id (the
// connection breaks, and a retried pipeline runs both on the new server).
func (r *Rewarmer) setMarker(ctx context.Context, st *site, force bool) (present bool, err error) {
	marker := st.marker
	arg := "0"
	if force {
		arg = "1"
	}
	var (
		mark *redis.Cmd
		info *redis.StringCmd
	)
	_, err = st.node.Pipelined(ctx, func(p redis.Pipeliner) error {
		mark = store.Marker.Eval(ctx, p, []string{marker}, arg)
		info = p.Info(ctx, "server")
		return nil
	})
	if st.addr == "" && neterr.Is(err) {
		err = unreachedError{err}
	}
	var reply []string
	if err == nil {
		reply, err = mark.StringSlice()
	}
	if err == nil && len(reply) != 2 {
		err = fmt.Errorf("unexpected reply %q", reply)
	}
	if err == nil {
		st.runID, err = runID(info.Val())
	}
	if err != nil {
		r.errors.Inc()
		if cc, ok := r.opts.Client.(*redis.ClusterClient); ok && topologyError(err) {
			// The script goes to the master itself, whose redirections
			// the Cluster client never sees: have it reload its map.
			cc.ReloadState(ctx)
		}
		return false, fmt.Errorf("rewarm: check and set %s: %w", marker, err)
	}
	switch reply[0] {
	case "ok":
		return true, nil
	case "foreign":
		r.repairs.Repaired(store.KindMarker, marker, reply[1])
	}
	return false, nil
}

// rewarm runs the pre-warm (the hottest keys first), then every
// declaration's refresh, both without the pre-warm's rate (the warmer's load
// bound and each source's protection still apply). With a scope (a Cluster
// where some masters kept their data), only keys in the scope's slots are
// loaded.
func (r *Rewarmer) rewarm(ctx context.Context, reason string, scope *slotScope) error {
	t0 := time.Now()
	var keep func(string) bool
	if scope != nil {
		keep = scope.has
	}
	var rerr error
	if r.opts.Prewarm != nil {
		rerr = r.opts.Prewarm(ctx, reason, keep)
	}
	rerr = errors.Join(rerr, r.opts.Warmer.RefreshWhere(ctx, keep))
	r.log.Info().Str("reason", reason).Str("slots", scope.String()).Dur("took_ms", time.Since(t0)).
		AnErr("error", rerr).Msg("re-warm finished")
	return rerr
}

// runID is the run_id an INFO server reply names.
func runID(info string) (string, error) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok && v != "" {
			return v, nil
		}
	}
	return "", errors.New("info server: no run_id")
}

// Run is the re-warm watch of one leader term: it takes the baseline now
// (so that a loss from here on is seen), then checks every Interval, and at
// once when the push watch asks, until ctx ends, abandoning a re-warm in
// progress. It returns once its goroutines stopped. A failed check is logged
// and counted, and the loop keeps going. The baseline outlives the term, so
// that a loss that cost this instance its lease (a FLUSHALL takes the lease
// key too) is still re-warmed once it leads again, by the next Run.
func (r *Rewarmer) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return errors.New("rewarmer: already running")
	}
	r.running = true
	if !r.opts.NoPush {
		r.push = newPushWatch(ctx, r)
	}
	r.mu.Unlock()
	defer r.stop()
	if _, err := r.CheckOnce(ctx); err != nil {
		r.log.Warn().Err(err).Msg("rewarm baseline not taken; retrying")
	}
	t := time.NewTicker(r.opts.Interval)
	defer t.Stop()
	var last time.Time // start of the last check that counts for the gap
	gap := MinCheckGap // the gap before the next check
	for {
		via := DetectPoll
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case via = <-r.kick:
		}
		// Paced whatever arrives: what asks for a check during the gap
		// is covered by the one that follows it.
		if wait := gap - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
			select {
			case v := <-r.kick:
				via = v
			default:
			}
		}
		start := time.Now()
		_, err := r.check(ctx, via)
		next := MinCheckGap
		switch {
		case ctx.Err() != nil:
		case topologyError(err):
			if redirected(err) {
				// A marker's slot is moving (a reshard moves a master's
				// lowest slots first): the watch asks for a check each
				// time the marker moves, and each would fail the same
				// way until the move is over. A failover's CLUSTERDOWN
				// keeps MinCheckGap: its re-warm waits for that check.
				next = min(2*gap, maxRedirectGap)
			}
			r.log.Debug().Err(err).Str("via", via).Dur("next_in_ms", next).Msg("rewarm check met a changing Cluster: no baseline changed")
		case err != nil:
			r.log.Warn().Err(err).Str("via", via).Msg("rewarm check failed")
		}
		gap = next
		if reachedRedis(err) {
			last = start
		}
	}
}

// maxRedirectGap bounds the gap between checks that fail with MOVED or ASK
// (a marker's slot moving): from MinCheckGap it doubles with each, up to
// this, and is back to MinCheckGap after any other outcome.
const maxRedirectGap = time.Second

// reachedRedis reports whether a check that ended with err reached Redis,
// and so counts for the gap between checks. One that no Redis answered
// (unreachedError: a single node or Sentinel master refusing connections, a
// Cluster none of whose nodes answers) cost Redis nothing: the push watch's
// reconnection, which follows Redis accepting connections again, is then
// checked at once, not up to MinCheckGap after the last failed one (while
// Redis is down, the watch asks for a check every 100 ms to 2 s). A Cluster
// check that one master failed (down, or MOVED during a reshard) reached the
// others, and counts.
func reachedRedis(err error) bool {
	var u unreachedError
	return !errors.As(err, &u)
}

// unreachedError is the error of a check whose first command, the one
// every check starts with (INFO on a single node or Sentinel master,
// CLUSTER SLOTS on a Cluster), failed to connect.
type unreachedError struct{ err error }

func (e unreachedError) Error() string { return e.err.Error() }
func (e unreachedError) Unwrap() error { return e.err }

// topologyError reports a check that failed on a Cluster's moving slot map
// rather than on a connection or an answer: a redirection (MOVED, ASK), a
// reply CLUSTERDOWN, TRYAGAIN, MASTERDOWN or LOADING (neterr.IsTopology's
// replies). None of them says anything about the data: such a check
// changes no baseline and reports no loss.
func topologyError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && (movedError(rerr) || (!neterr.Is(rerr) && neterr.IsTopology(rerr)))
}

// redirected reports a check that failed with MOVED or ASK.
func redirected(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && movedError(rerr)
}

// stop ends Run: the push watch's sessions are stopped and waited for.
func (r *Rewarmer) stop() {
	r.mu.Lock()
	p := r.push
	r.push, r.running = nil, false
	r.mu.Unlock()
	if p != nil {
		p.close()
	}
}
