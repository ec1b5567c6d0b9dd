package warmer

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/hearth-dev/hearth/internal/hstate"
)

// MarkerKey is the key, under Hearth's namespace, whose absence tells the
// Rewarmer that Redis lost its data. It holds the Redis TIME (unix seconds) it
// was written at and has no TTL.
func MarkerKey(namespace string) string { return namespace + ":warm" }

// DefaultRewarmMinGap is the least time between the starts of two full
// re-warms. Losses seen sooner (a DEL loop on the marker, flushes in a row)
// are counted as suppressed, and one re-warm runs once the gap has passed.
const DefaultRewarmMinGap = 10 * time.Second

// markerScript checks the marker and writes it back when it is absent or
// foreign (not the decimal unix seconds Hearth writes, at most hstate.MaxEpochAhead
// ahead of Redis TIME; another Redis type; a TTL, which no Hearth sets),
// or always with ARGV[1] = '1'. KEYS marker. Returns {state, found}: state
// ok, absent or foreign; found is what a foreign marker held, truncated.
var markerScript = hstate.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1])
local state, found = 'ok', ''
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then
  state, found = 'foreign', hearth_type(KEYS[1])
elseif not v then
  state = 'absent'
elseif string.len(v) > 12 or not string.match(v, '^%d+$') or tonumber(v) > now + HEARTH_AHEAD_MS / 1000 then
  state, found = 'foreign', v
elseif redis.call('PTTL', KEYS[1]) >= 0 then
  state, found = 'foreign', 'ttl set: ' .. v
end
if state ~= 'ok' or ARGV[1] == '1' then redis.call('SET', KEYS[1], t[1]) end
return {state, string.sub(found, 1, ` + strconv.Itoa(hstate.FoundMax) + `)}
`)

// Reasons for a re-warm.
const (
	// RewarmRestart: the Redis run_id changed (a restart or a failover).
	RewarmRestart = "restart"
	// RewarmFlush: the marker key is gone (FLUSHDB, FLUSHALL, eviction).
	RewarmFlush = "flush"
)

// RewarmOptions configures a Rewarmer. Client, Namespace and Warmer are required.
type RewarmOptions struct {
	Client redis.UniversalClient
	// Namespace prefixes the marker key (see MarkerKey).
	Namespace string
	// Interval is how often Redis is checked (default 2s).
	Interval time.Duration
	// MinGap is the least time between the starts of two full re-warms
	// (default DefaultRewarmMinGap). A loss seen sooner is counted in
	// hearth_prewarm_rewarms_suppressed_total and re-warmed once the gap
	// has passed: coalesced, never lost.
	MinGap time.Duration
	// Gate, when set, must return true for checks to run: only the leader
	// re-warms. The baseline outlives a closed gate, so that a loss that cost
	// this instance its lease (a FLUSHALL takes the lease key too) is still
	// re-warmed once it leads again.
	Gate   func() bool
	Warmer *Warmer
	// Prewarm shapes the pre-warm a re-warm runs (its Reason is replaced).
	Prewarm    PrewarmOptions
	Registerer prometheus.Registerer
	Logger     zerolog.Logger
}

// Rewarmer notices that Redis lost its data, by its run_id changing (restart)
// or by a marker key it keeps disappearing (flush), and then re-runs the
// pre-warm and every declaration's refresh at once, so that a cold Redis is
// warm again within seconds rather than after each key's next scheduled refresh.
type Rewarmer struct {
	opts       RewarmOptions
	log        zerolog.Logger
	rewarms    *prometheus.CounterVec
	suppressed *prometheus.CounterVec
	errors     prometheus.Counter
	repairs    *hstate.Repairs

	mu       sync.Mutex
	runID    string    // "" until a baseline is taken
	pending  string    // a loss whose re-warm did not finish as leader
	deferred string    // a loss seen within MinGap of the last re-warm
	last     time.Time // start of the last full re-warm
	quiet    bool      // a suppression was logged since the last re-warm
	cause    context.CancelCauseFunc
	g        *errgroup.Group
}

// NewRewarmer builds a Rewarmer; nothing runs until Open or CheckOnce.
func NewRewarmer(opts RewarmOptions) (*Rewarmer, error) {
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
		opts.MinGap = DefaultRewarmMinGap
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	log := opts.Logger.With().Str("component", "rewarm").Logger()
	r := &Rewarmer{
		opts:    opts,
		log:     log,
		repairs: hstate.NewRepairs(opts.Registerer, log),
		rewarms: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_prewarm_rewarms_total",
			Help: "Re-warms started because Redis lost its data, by reason (restart, flush).",
		}, []string{"reason"}),
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_prewarm_rewarms_suppressed_total",
			Help: "Losses of Redis data seen within the minimum gap after a re-warm, by reason: coalesced into one re-warm once the gap has passed.",
		}, []string{"reason"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hearth_prewarm_rewarm_check_errors_total",
			Help: "Checks for lost Redis data that could not reach Redis.",
		}),
	}
	r.rewarms.WithLabelValues(RewarmRestart)
	r.rewarms.WithLabelValues(RewarmFlush)
	r.suppressed.WithLabelValues(RewarmRestart)
	r.suppressed.WithLabelValues(RewarmFlush)
	opts.Registerer.MustRegister(r.rewarms, r.suppressed, r.errors)
	return r, nil
}

// CheckOnce checks Redis once and, if it lost its data, re-warms before
// returning. It returns the reason of the re-warm it ran ("" when none). The
// first check only takes the baseline: it writes the marker and remembers the
// run_id. A re-warm during which the gate closed (leadership lost) is run
// again by the first check after it reopens. Re-warms start at least MinGap
// apart: a loss seen sooner is counted as suppressed and re-warmed by the
// first check after the gap. A marker holding a foreign value counts as
// absent (a flush): it is repaired, logged and counted.
func (r *Rewarmer) CheckOnce(ctx context.Context) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.open() {
		return "", nil
	}
	id, err := runID(ctx, r.opts.Client)
	if err != nil {
		r.errors.Inc()
		return "", fmt.Errorf("rewarm check: %w", err)
	}
	marker := MarkerKey(r.opts.Namespace)
	if r.runID == "" {
		if _, err := r.setMarker(ctx, true); err != nil {
			return "", err
		}
		r.runID = id
		r.log.Debug().Str("marker", marker).Msg("re-warm watch armed")
		return "", nil
	}
	// The marker goes back first: a flush during the re-warm is then seen
	// by the next check, and re-warmed again.
	present, err := r.setMarker(ctx, false)
	if err != nil {
		return "", err
	}
	detected := ""
	switch {
	case id != r.runID:
		detected = RewarmRestart
	case !present:
		detected = RewarmFlush
	}
	r.runID = id
	reason := r.pending
	if reason == "" {
		reason = r.deferred
	}
	if reason == "" {
		reason = detected
	}
	if reason == "" {
		return "", nil
	}
	if wait := r.opts.MinGap - time.Since(r.last); !r.last.IsZero() && wait > 0 {
		if detected != "" {
			r.suppressed.WithLabelValues(detected).Inc()
			ev := r.log.Debug()
			if !r.quiet {
				ev, r.quiet = r.log.Warn(), true
			}
			ev.Str("reason", detected).Dur("gap", r.opts.MinGap).Dur("runs_in", wait).
				Msg("redis lost its data again soon after a re-warm: one re-warm runs once the minimum gap has passed")
		}
		if r.pending == "" {
			r.deferred = reason
		}
		return "", nil
	}
	if r.pending == "" {
		r.rewarms.WithLabelValues(reason).Inc()
		r.log.Warn().Str("reason", reason).Msg("redis lost its data: re-warming")
	} else {
		r.log.Warn().Str("reason", reason).Msg("leading again: finishing the re-warm")
	}
	r.pending, r.deferred, r.last, r.quiet = reason, "", time.Now(), false
	err = r.rewarm(ctx, reason)
	if r.open() {
		r.pending = ""
	} else {
		r.log.Warn().Str("reason", reason).Msg("leadership lost during the re-warm: it runs again once leading")
	}
	return reason, err
}

func (r *Rewarmer) open() bool { return r.opts.Gate == nil || r.opts.Gate() }

// Mark arms the watch now: it writes the marker and takes the run_id as the
// baseline. Call it right after warming Redis (the start-up pre-warm), so that a
// loss from then on is seen, even one before the first periodic check.
func (r *Rewarmer) Mark(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, err := runID(ctx, r.opts.Client)
	if err != nil {
		r.errors.Inc()
		return fmt.Errorf("rewarm mark: %w", err)
	}
	if _, err := r.setMarker(ctx, true); err != nil {
		return err
	}
	r.runID = id
	r.log.Debug().Str("marker", MarkerKey(r.opts.Namespace)).Msg("re-warm watch armed")
	return nil
}

// setMarker writes the marker back if it is absent or foreign (always, with
// force) and reports whether a valid one was there. A foreign marker is
// logged and counted, and reported absent: Hearth cannot tell what happened
// to Redis's data, so it re-warms.
func (r *Rewarmer) setMarker(ctx context.Context, force bool) (present bool, err error) {
	marker := MarkerKey(r.opts.Namespace)
	arg := "0"
	if force {
		arg = "1"
	}
	reply, err := markerScript.Run(ctx, r.opts.Client, []string{marker}, arg).StringSlice()
	if err == nil && len(reply) != 2 {
		err = fmt.Errorf("unexpected reply %q", reply)
	}
	if err != nil {
		r.errors.Inc()
		return false, fmt.Errorf("rewarm: check and set %s: %w", marker, err)
	}
	switch reply[0] {
	case "ok":
		return true, nil
	case "foreign":
		r.repairs.Repaired(hstate.KindMarker, marker, reply[1])
	}
	return false, nil
}

// rewarm runs the pre-warm (the hottest keys first), then every declaration's refresh.
func (r *Rewarmer) rewarm(ctx context.Context, reason string) error {
	t0 := time.Now()
	po := r.opts.Prewarm
	po.Reason = reason
	_, perr := r.opts.Warmer.Prewarm(ctx, po)
	rerr := r.opts.Warmer.RefreshAll(ctx)
	r.log.Info().Str("reason", reason).Dur("took", time.Since(t0)).AnErr("prewarm_error", perr).
		AnErr("refresh_error", rerr).Msg("re-warm finished")
	return errors.Join(perr, rerr)
}

// runID identifies the Redis server process: INFO server's run_id, or for a
// cluster the sorted run_ids of every master, so that any node's restart shows.
func runID(ctx context.Context, c redis.UniversalClient) (string, error) {
	if cc, ok := c.(*redis.ClusterClient); ok {
		var (
			mu  sync.Mutex
			ids []string
		)
		err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			id, err := nodeRunID(ctx, n)
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
			return err
		})
		if err != nil {
			return "", err
		}
		sort.Strings(ids)
		return strings.Join(ids, ","), nil
	}
	return nodeRunID(ctx, c)
}

func nodeRunID(ctx context.Context, c redis.Cmdable) (string, error) {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("info server: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok && v != "" {
			return v, nil
		}
	}
	return "", errors.New("info server: no run_id")
}

// Open takes the baseline now (so that a loss from here on is seen), then
// checks every Interval until Close or ctx ends. A failed check is logged and
// counted, and the loop keeps going.
func (r *Rewarmer) Open(ctx context.Context) error {
	if r.cause != nil {
		return errors.New("rewarmer: already open")
	}
	if _, err := r.CheckOnce(ctx); err != nil {
		r.log.Warn().Err(err).Msg("rewarm baseline not taken; retrying")
	}
	ctx, cancel := context.WithCancelCause(ctx)
	r.cause = cancel
	r.g = &errgroup.Group{}
	r.g.Go(func() error {
		t := time.NewTicker(r.opts.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
			if _, err := r.CheckOnce(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn().Err(err).Msg("rewarm check failed")
			}
		}
	})
	return nil
}

// errRewarmerClosed ends the loop on Close.
var errRewarmerClosed = errors.New("rewarmer closed")

// Close stops the loop, abandoning a re-warm in progress, and waits for it within ctx.
func (r *Rewarmer) Close(ctx context.Context) error {
	if r.cause == nil {
		return nil
	}
	r.cause(errRewarmerClosed)
	done := make(chan struct{})
	go func() { _ = r.g.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close rewarmer: %w", ctx.Err())
	}
}
