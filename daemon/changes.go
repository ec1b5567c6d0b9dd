package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/warmer"
)

// Change-driven refresh: while this instance leads, one dedicated connection
// per postgres source LISTENs on the channels its declarations name
// (notify.channel). The trigger Hearth ships (migrations/00005, `hearth
// notify-sql`) sends the changed members; they are gathered for the
// declaration's coalescing window and refreshed through its batched query and
// the fenced, version-checked write path. Every time the connection is
// (re)established, which includes every new term, the declarations it covers
// are refreshed in full once: whatever changed while nobody listened is read
// again. The schedule stays the safety net. Every load a notification
// causes is paced (see pacer below).

const (
	// MaxPendingChanges bounds, per declaration, the changed members waiting
	// for their refresh; past it they are dropped for one full refresh.
	MaxPendingChanges = 10_000
	// listenIdle bounds one wait for a notification; then the connection is
	// pinged, so that a dead peer is noticed.
	listenIdle = 30 * time.Second
	// maxBackoff bounds the wait between reconnection attempts.
	maxBackoff = 5 * time.Second
	// maxPayloadAge bounds how old a payload's timestamp may be and still be
	// measured as change-to-Redis latency (an older one is from a clock that
	// disagrees, or replayed).
	maxPayloadAge = time.Hour
)

// ChangeRefresher is what the change listener needs of the warmer.
type ChangeRefresher interface {
	Hot(name string, members []string) ([]string, bool)
	RefreshMembers(ctx context.Context, name string, members []string) (warmer.Outcome, error)
	Refresh(ctx context.Context, name string, ro warmer.RunOptions) (warmer.Outcome, error)
	Spec(name string) (*warmer.Spec, bool)
}

// ChangeOptions configures the change listeners.
type ChangeOptions struct {
	// Specs are the declarations; those with Notify set are listened for.
	Specs []*warmer.Spec
	// DSNs maps a postgres source's name to its connection string.
	DSNs       map[string]string
	Registerer prometheus.Registerer
	Logger     zerolog.Logger
	// Now is the clock latency is measured with.
	Now func() time.Time
	// MinFullInterval spaces a declaration's change-driven full refreshes
	// (after reconnections and reloads, "all" payloads, overflows): one that
	// comes sooner after the last waits, so that neither a flapping
	// connection nor anyone who can NOTIFY can turn it into back-to-back full
	// loads of the origin (default DefaultMinFullInterval). Changed members
	// keep being loaded while a full refresh waits.
	MinFullInterval time.Duration
}

// DefaultMinFullInterval is ChangeOptions.MinFullInterval's default.
const DefaultMinFullInterval = 10 * time.Second

// Changes runs the change listeners, one per postgres source with notify
// declarations.
type Changes struct {
	w    ChangeRefresher
	m    *changeMetrics
	opts ChangeOptions

	mu     sync.Mutex // guards everything below
	closed bool
	// parent is the running term's context (see Run), nil between terms.
	parent    context.Context
	specs     []*warmer.Spec // what the running listeners were built from
	listeners []*listener
	// paces is each declaration's pacing, kept across restarts of the
	// listeners (Apply) so that no reload starts with a fresh allowance.
	paces  map[string]*pacing
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// OpenChanges builds a listener per source that has notify declarations;
// they listen while Run runs (a leader term). It returns a Changes that does
// nothing when none has.
func OpenChanges(w ChangeRefresher, opts ChangeOptions) (*Changes, error) {
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MinFullInterval <= 0 {
		opts.MinFullInterval = DefaultMinFullInterval
	}
	c := &Changes{w: w, m: newChangeMetrics(opts.Registerer), opts: opts, paces: map[string]*pacing{}}
	ls, err := c.build(opts.Specs)
	if err != nil {
		return nil, err
	}
	c.listeners, c.specs = ls, opts.Specs
	return c, nil
}

// Run listens until ctx ends (the leader's term), then stops the listeners
// and waits for them and their refreshes. Each session refreshes its
// declarations in full once, so a new term reads what changed before it.
func (c *Changes) Run(ctx context.Context) error {
	c.mu.Lock()
	if c.closed || c.parent != nil {
		c.mu.Unlock()
		return nil
	}
	c.parent = ctx
	c.startLocked(c.listeners, c.specs)
	c.mu.Unlock()
	<-ctx.Done()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopLocked()
	c.parent = nil
	return nil
}

// Apply makes the listeners follow reloaded declarations: when what they
// listen for changed (a declaration's notify channel, coalesce window, batch
// size or source, or which declarations have one), the running listeners stop
// and new ones start. Each new session refreshes its declarations in full
// once, as after a reconnection, which covers what changed in between. An
// error (a notify declaration on a source that is not postgres) leaves the
// running listeners as they are. Between terms it only replaces what the
// next Run listens with.
func (c *Changes) Apply(specs []*warmer.Spec) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || notifySignature(specs) == notifySignature(c.specs) {
		return nil
	}
	ls, err := c.build(specs)
	if err != nil {
		return err
	}
	c.stopLocked()
	c.m.forget(c.specs, specs)
	for name := range c.paces {
		if !slices.ContainsFunc(specs, func(s *warmer.Spec) bool { return s != nil && s.Notify != "" && s.Name == name }) {
			delete(c.paces, name)
		}
	}
	if c.parent == nil {
		c.listeners, c.specs = ls, specs
		return nil
	}
	c.startLocked(ls, specs)
	return nil
}

// notifySignature is what change listening depends on in specs.
func notifySignature(specs []*warmer.Spec) string {
	var b strings.Builder
	for _, s := range specs {
		if s != nil && s.Notify != "" {
			fmt.Fprintf(&b, "%q %q %q %d %d\n", s.Name, s.Notify, s.Source, s.Coalesce, s.BatchSize)
		}
	}
	return b.String()
}

// build makes a listener per source with notify declarations, in source order.
func (c *Changes) build(specs []*warmer.Spec) ([]*listener, error) {
	opts := c.opts
	bySource := map[string]*listener{}
	var names []string
	for _, s := range specs {
		if s == nil || s.Notify == "" {
			continue
		}
		l := bySource[s.Source]
		if l == nil {
			dsn, ok := opts.DSNs[s.Source]
			if !ok {
				return nil, fmt.Errorf("keys[%s].notify: source %s is not a postgres source", s.Name, s.Source)
			}
			cc, err := pgx.ParseConfig(dsn)
			if err != nil {
				return nil, fmt.Errorf("keys[%s].notify: source %s: %w", s.Name, s.Source, postgres.RedactError(err, dsn))
			}
			cc.RuntimeParams["application_name"] = "hearth-listen"
			l = &listener{
				source: s.Source, conn: cc, channels: map[string][]*queue{},
				w: c.w, m: c.m, now: opts.Now,
				// A flood of foreign payloads would log one line each: a
				// burst, then one per period (every one is counted).
				log: opts.Logger.With().Str("component", "changes").Str("source", s.Source).Logger().
					Sample(&zerolog.BurstSampler{Burst: 10, Period: time.Minute}),
			}
			bySource[s.Source] = l
			names = append(names, s.Source)
		}
		pace := c.paces[s.Name]
		if pace == nil {
			pace = newPacing(opts.MinFullInterval)
			c.paces[s.Name] = pace
		}
		q := newQueue(s.Name, s.Coalesce, s.BatchSize, l, pace)
		l.channels[s.Notify] = append(l.channels[s.Notify], q)
		l.queues = append(l.queues, q)
		c.m.init(s.Name, s.Notify, s.Source)
	}
	sort.Strings(names)
	ls := make([]*listener, len(names))
	for i, n := range names {
		ls[i] = bySource[n]
	}
	return ls, nil
}

func (c *Changes) startLocked(ls []*listener, specs []*warmer.Spec) {
	ctx, cancel := context.WithCancel(c.parent)
	c.cancel, c.listeners, c.specs = cancel, ls, specs
	for _, l := range ls {
		c.wg.Go(func() { l.run(ctx) })
		for _, q := range l.queues {
			c.wg.Go(func() { q.run(ctx) })
		}
	}
}

// stopLocked stops the running listeners and waits for them and their refreshes.
func (c *Changes) stopLocked() {
	if c.cancel == nil {
		return
	}
	c.cancel()
	c.wg.Wait()
	c.cancel = nil
}

// Close stops listening and waits for the listeners and their refreshes.
func (c *Changes) Close(context.Context) error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.stopLocked()
	return nil
}

// listener is one source's LISTEN connection and its declarations' queues.
type listener struct {
	source   string
	conn     *pgx.ConnConfig
	channels map[string][]*queue // channel → the declarations it drives
	queues   []*queue
	w        ChangeRefresher
	m        *changeMetrics
	now      func() time.Time
	log      zerolog.Logger
}

// run listens until ctx ends (the term).
func (l *listener) run(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := l.session(ctx)
		l.m.connected.WithLabelValues(l.source).Set(0)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			l.m.reconnects.WithLabelValues(l.source).Inc()
			l.log.Warn().Err(err).Dur("retry_in_ms", backoff).Msg("change listener disconnected: reconnecting; the schedule keeps refreshing")
			if !sleep(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = 100 * time.Millisecond
	}
}

// session connects, LISTENs, refreshes every covered declaration in full
// once, then handles notifications until the connection fails (an error) or
// ctx ends (nil): the term ends, and the session with it.
func (l *listener) session(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cctx, ccancel := context.WithTimeout(sctx, ConnectTimeout)
	conn, err := pgx.ConnectConfig(cctx, l.conn)
	ccancel()
	if err != nil {
		if sctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("connect: %w", postgres.RedactError(err, l.conn.ConnString()))
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	channels := make([]string, 0, len(l.channels))
	for ch := range l.channels {
		channels = append(channels, ch)
	}
	sort.Strings(channels)
	for _, ch := range channels {
		if _, err := conn.Exec(sctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			if sctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("listen %s: %w", ch, err)
		}
	}
	l.m.connected.WithLabelValues(l.source).Set(1)
	l.log.Info().Strs("channels", channels).Msg("listening for changes; refreshing the declarations they cover in full once")
	for _, q := range l.queues {
		q.full()
	}
	// One wait context per idle period, not per notification: a flood costs
	// no timer and context each.
	wait := &idleWait{parent: sctx}
	wait.renew()
	defer func() { wait.cancel() }()
	for {
		n, err := conn.WaitForNotification(wait.ctx)
		idle := wait.ctx.Err() != nil
		if err != nil || idle {
			wait.renew()
		}
		if sctx.Err() != nil {
			return nil
		}
		if err != nil {
			// Its own deadline leaves the connection open (pgconn): ping it.
			if idle && !conn.IsClosed() {
				pctx, pcancel := context.WithTimeout(sctx, ConnectTimeout)
				err = conn.Ping(pctx)
				pcancel()
				if err == nil {
					continue
				}
			}
			return fmt.Errorf("wait for notification: %w", err)
		}
		l.handle(n.Channel, n.Payload)
	}
}

// idleWait bounds the waits for notifications to listenIdle from its last renew.
type idleWait struct {
	parent context.Context
	ctx    context.Context
	cancel context.CancelFunc
}

func (w *idleWait) renew() {
	if w.cancel != nil {
		w.cancel()
	}
	w.ctx, w.cancel = context.WithTimeout(w.parent, listenIdle)
}

// payload is what hearth_notify() sends.
type payload struct {
	Hearth int      `json:"hearth"`
	TS     int64    `json:"ts"`
	IDs    []string `json:"ids"`
	All    bool     `json:"all"`
}

// parsePayload decodes a notification; anything but Hearth's format is an error.
func parsePayload(s string) (payload, error) {
	var p payload
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return p, fmt.Errorf("not hearth's payload: %w", err)
	}
	if dec.More() {
		return p, errors.New("not hearth's payload: trailing data")
	}
	if p.Hearth != 1 {
		return p, fmt.Errorf("not hearth's payload: hearth is %d, want 1", p.Hearth)
	}
	if !p.All && len(p.IDs) == 0 {
		return p, errors.New("not hearth's payload: neither ids nor all")
	}
	return p, nil
}

// handle queues one notification's members for every declaration on its
// channel. A payload that is not Hearth's is counted and logged, never fatal.
func (l *listener) handle(channel, raw string) {
	queues := l.channels[channel]
	if len(queues) == 0 {
		return
	}
	p, err := parsePayload(raw)
	if err != nil {
		l.m.notifications.WithLabelValues(channel, "malformed").Inc()
		l.log.Warn().Str("channel", channel).Int("bytes", len(raw)).Err(err).Msg("change notification ignored")
		return
	}
	l.m.notifications.WithLabelValues(channel, "ok").Inc()
	now := l.now()
	ts := time.UnixMicro(p.TS)
	if p.TS <= 0 || ts.After(now.Add(time.Minute)) || now.Sub(ts) > maxPayloadAge {
		ts = now // no usable commit time: measured from receipt
	}
	for _, q := range queues {
		q.add(p, ts)
	}
}

// Pacing: every change-driven load passes one rule, a token bucket (GCRA)
// per thing it loads. A notification is a hint from anyone who can log in
// to PostgreSQL, never a command to do unbounded work:
//   - a declaration's full refresh (a new session, a reload, "all", an overflow):
//     one per MinFullInterval (10 s), whatever path asked for it;
//   - one member: MemberBurst loads at once, then one per MemberInterval;
//     a member pending or being loaded is loaded again only after that load;
//   - every load goes through the source's protection (its rate and
//     concurrency bounds), as the schedule's do.
//
// The state outlives a listener's restart (a reload, a reconnection), so
// that no path starts with a fresh allowance.
const (
	// MemberInterval and MemberBurst pace the change-driven loads of one
	// member: a member changing over and over is loaded MemberBurst times at
	// once, then once per MemberInterval. A change to a member not loaded in
	// the last seconds waits for nothing but the coalescing window.
	MemberInterval = time.Second
	MemberBurst    = 3
)

// pacer is a token bucket per key in its GCRA form: tat is the theoretical
// arrival time of the next load; a key may go when now ≥ tat − (burst−1)·every.
type pacer struct {
	every time.Duration
	burst int
	tat   map[string]time.Time // absent: a full bucket
	swept time.Time
}

func newPacer(every time.Duration, burst int) *pacer {
	return &pacer{every: every, burst: max(1, burst), tat: map[string]time.Time{}}
}

// due is when key may go next; the zero time (or a past one) is now.
func (p *pacer) due(key string) time.Time {
	tat, ok := p.tat[key]
	if !ok {
		return time.Time{}
	}
	return tat.Add(-time.Duration(p.burst-1) * p.every)
}

// take spends key's token for a load starting at now.
func (p *pacer) take(key string, now time.Time) {
	tat := p.tat[key]
	if tat.Before(now) {
		tat = now
	}
	p.tat[key] = tat.Add(p.every)
}

// sweep forgets the keys whose bucket is full again, at most once per
// bucket's length, so that the map holds only what was loaded lately.
func (p *pacer) sweep(now time.Time) {
	if now.Sub(p.swept) < time.Duration(p.burst)*p.every {
		return
	}
	p.swept = now
	for k, tat := range p.tat {
		if !tat.After(now) {
			delete(p.tat, k)
		}
	}
}

// pacing is one declaration's pacing state, kept by Changes across listener
// restarts. Only the declaration's queue uses it, and two queues of one
// declaration never run at once (Apply stops the old listeners first).
type pacing struct {
	full    *pacer // key "": the declaration's change-driven full refreshes
	members *pacer
}

func newPacing(minFull time.Duration) *pacing {
	return &pacing{full: newPacer(minFull, 1), members: newPacer(MemberInterval, MemberBurst)}
}

// queue gathers one declaration's changed members over its coalescing
// window and refreshes them from its own goroutine: at most one refresh of
// the declaration runs at a time, and what arrives meanwhile waits for it.
type queue struct {
	name     string
	coalesce time.Duration
	batch    int
	l        *listener
	pace     *pacing
	wake     chan struct{} // something was queued: recompute the deadline

	mu      sync.Mutex
	pending map[string]int64 // member → earliest change time (unix µs)
	all     bool             // a full refresh is wanted
	allTS   int64
	allAt   time.Time // when it was asked for
	// ready is when the first pending member that may be loaded at once
	// arrived (zero: none); held is the earliest time a pending member whose
	// pacing holds it back may go (zero: none).
	ready, held time.Time
	// waiting is the deadline the run loop sleeps until (zero: none) and
	// busy whether it is refreshing: the loop is woken only when what was
	// queued needs an earlier deadline, so that a flood of notifications
	// for what is already pending costs no goroutine switch each.
	waiting time.Time
	busy    bool
}

func newQueue(name string, coalesce time.Duration, batch int, l *listener, pace *pacing) *queue {
	return &queue{name: name, coalesce: coalesce, batch: max(1, batch), l: l, pace: pace,
		wake: make(chan struct{}, 1), pending: map[string]int64{}}
}

func (q *queue) add(p payload, ts time.Time) {
	spec, ok := q.l.w.Spec(q.name)
	if !ok {
		return
	}
	m := q.l.m
	us := ts.UnixMicro()
	now := q.l.now()
	q.mu.Lock()
	defer q.mu.Unlock()
	defer q.signalLocked()
	switch {
	case p.All:
		m.members.WithLabelValues(q.name, "full").Inc()
		q.markAll(us, now)
	case !spec.Template.IsFamily():
		// The one key: a member like any other, paced like one.
		q.queueLocked("", us, now)
	default:
		for _, id := range p.IDs {
			if err := spec.Template.ValidateMember(id); err != nil {
				m.members.WithLabelValues(q.name, "invalid").Inc()
				continue
			}
			q.queueLocked(id, us, now)
		}
	}
}

// queueLocked queues one changed member. Call with q.mu held.
func (q *queue) queueLocked(id string, us int64, now time.Time) {
	m := q.l.m
	if q.all && !q.fullHeld(now) {
		// A full refresh about to run reads this change too.
		m.members.WithLabelValues(q.name, "coalesced").Inc()
		return
	}
	if old, dup := q.pending[id]; dup {
		m.members.WithLabelValues(q.name, "coalesced").Inc()
		q.pending[id] = min(old, us)
		return
	}
	if len(q.pending) >= MaxPendingChanges {
		m.overflows.WithLabelValues(q.name).Inc()
		if !q.all {
			q.l.log.Warn().Str("family", q.name).Int("pending", len(q.pending)).Msg("too many pending changes: one full refresh instead")
		}
		q.markAll(us, now)
		return
	}
	m.members.WithLabelValues(q.name, "queued").Inc()
	q.pending[id] = us
	if due := q.pace.members.due(id); due.After(now) {
		if q.held.IsZero() || due.Before(q.held) {
			q.held = due
		}
	} else if q.ready.IsZero() {
		q.ready = now
	}
}

// fullHeld reports whether a wanted full refresh must wait for its pacing
// longer than the coalescing window. Call with q.mu held.
func (q *queue) fullHeld(now time.Time) bool {
	return q.pace.full.due("").After(now.Add(q.coalesce))
}

// markAll asks for one full refresh; us is the earliest change it stands for
// (0: none, nothing to measure). When it can run soon it replaces the
// pending members; when its pacing holds it back they are still loaded
// meanwhile. Call with q.mu held.
func (q *queue) markAll(us int64, now time.Time) {
	if !q.all {
		q.allAt = now
	}
	if !q.fullHeld(now) {
		for _, t := range q.pending {
			us = earliest(us, t)
		}
		clear(q.pending)
		q.ready, q.held = time.Time{}, time.Time{}
	}
	if q.all {
		us = earliest(us, q.allTS)
	}
	q.all, q.allTS = true, us
}

// earliest is the earlier of two change times, 0 meaning none.
func earliest(a, b int64) int64 {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// full queues a full refresh (on every new LISTEN session): it catches up
// what changed while nobody listened, and measures no change.
func (q *queue) full() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.markAll(0, q.l.now())
	q.signalLocked()
}

// signalLocked wakes the run loop if it sleeps past the deadline now due (a
// busy loop recomputes it when its refresh ends). Call with q.mu held.
func (q *queue) signalLocked() {
	if q.busy {
		return
	}
	if at, ok := q.deadline(); !ok || (!q.waiting.IsZero() && !at.Before(q.waiting)) {
		return
	}
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// deadline is when the queue should refresh next (ok false: nothing
// pending). Call with q.mu held.
func (q *queue) deadline() (at time.Time, ok bool) {
	consider := func(t time.Time) {
		if !ok || t.Before(at) {
			at, ok = t, true
		}
	}
	if q.all {
		due := q.allAt.Add(q.coalesce)
		if d := q.pace.full.due(""); d.After(due) {
			due = d
		}
		consider(due)
	}
	if !q.ready.IsZero() {
		consider(q.ready.Add(q.coalesce))
	}
	if !q.held.IsZero() {
		consider(q.held)
	}
	return at, ok
}

// run refreshes what the queue gathers, each at its deadline, until ctx ends.
func (q *queue) run(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		q.mu.Lock()
		at, ok := q.deadline()
		q.waiting, q.busy = time.Time{}, false
		if ok {
			q.waiting = at
			t.Reset(max(0, at.Sub(q.l.now())))
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-q.wake:
			t.Stop()
			continue
		case <-t.C:
		}
		q.mu.Lock()
		q.waiting, q.busy = time.Time{}, true
		q.mu.Unlock()
		q.fire(ctx)
	}
}

// fire runs the refresh that is due: the full refresh if its pacing allows,
// else the pending members that theirs allows.
func (q *queue) fire(ctx context.Context) {
	now := q.l.now()
	q.mu.Lock()
	p := q.pace
	if q.all && !p.full.due("").After(now) {
		p.full.take("", now)
		allTS := q.allTS
		// The members pending now changed before the full refresh reads.
		q.all, q.allTS = false, 0
		clear(q.pending)
		q.ready, q.held = time.Time{}, time.Time{}
		q.mu.Unlock()
		q.refreshFull(ctx, allTS)
		return
	}
	if q.ready.IsZero() && (q.held.IsZero() || q.held.After(now)) {
		q.mu.Unlock()
		return // woken early: nothing is due yet
	}
	due := make([]string, 0, len(q.pending))
	q.held = time.Time{}
	for id := range q.pending {
		if d := p.members.due(id); d.After(now) {
			if q.held.IsZero() || d.Before(q.held) {
				q.held = d
			}
			continue
		}
		due = append(due, id)
	}
	q.ready = time.Time{}
	q.mu.Unlock()
	if len(due) == 0 {
		return
	}

	// Only members the declaration keeps warm are loaded, and only they
	// spend a token: the pacing state stays as small as what is loaded.
	hot, ok := q.l.w.Hot(q.name, due)
	q.mu.Lock()
	pending := make(map[string]int64, len(hot))
	if ok {
		for _, id := range hot {
			if ts, ok := q.pending[id]; ok {
				pending[id] = ts
				p.members.take(id, now)
			}
		}
	}
	for _, id := range due {
		delete(q.pending, id)
	}
	p.members.sweep(now)
	q.mu.Unlock()
	if n := len(due) - len(pending); n > 0 {
		q.l.m.members.WithLabelValues(q.name, "not_declared").Add(float64(n))
	}
	q.refreshMembers(ctx, pending)
}

func (q *queue) refreshFull(ctx context.Context, allTS int64) {
	if ctx.Err() != nil {
		return
	}
	m, log := q.l.m, q.l.log
	m.refreshes.WithLabelValues(q.name, "full").Inc()
	out, err := q.l.w.Refresh(ctx, q.name, warmer.RunOptions{})
	if err != nil {
		log.Warn().Str("family", q.name).Err(err).Int("failed", out.Failed).Msg("change-driven full refresh incomplete")
		return
	}
	if allTS != 0 {
		m.lag.WithLabelValues(q.name).Observe(q.since(allTS))
	}
}

func (q *queue) refreshMembers(ctx context.Context, pending map[string]int64) {
	if len(pending) == 0 || ctx.Err() != nil {
		return
	}
	m, log := q.l.m, q.l.log
	hot := make([]string, 0, len(pending))
	for id := range pending {
		hot = append(hot, id)
	}
	sort.Strings(hot)
	for len(hot) > 0 && ctx.Err() == nil {
		batch := hot[:min(q.batch, len(hot))]
		hot = hot[len(batch):]
		m.refreshes.WithLabelValues(q.name, "members").Inc()
		out, err := q.l.w.RefreshMembers(ctx, q.name, batch)
		if err != nil && out.Written+out.Negative == 0 {
			log.Warn().Str("family", q.name).Int("members", len(batch)).Err(err).Msg("change-driven refresh failed; the schedule retries")
			continue
		}
		for _, id := range batch {
			m.lag.WithLabelValues(q.name).Observe(q.since(pending[id]))
		}
	}
}

// since is the seconds from a change (unix µs) to now.
func (q *queue) since(us int64) float64 {
	return max(0, q.l.now().Sub(time.UnixMicro(us)).Seconds())
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// changeMetrics are the change listener's metrics.
type changeMetrics struct {
	notifications *prometheus.CounterVec
	members       *prometheus.CounterVec
	refreshes     *prometheus.CounterVec
	overflows     *prometheus.CounterVec
	lag           *prometheus.HistogramVec
	connected     *prometheus.GaugeVec
	reconnects    *prometheus.CounterVec
}

func newChangeMetrics(reg prometheus.Registerer) *changeMetrics {
	m := &changeMetrics{
		notifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_change_notifications_total",
			Help: "Change notifications received, by channel and result (ok, malformed: not Hearth's payload, ignored).",
		}, []string{"channel", "result"}),
		members: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_change_members_total",
			Help: "Changed members named by notifications, by what became of them (queued, coalesced into a pending refresh, full: turned into a full refresh, invalid, not_declared: no key of the declaration).",
		}, []string{"family", "result"}),
		refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_change_refreshes_total",
			Help: "Refreshes triggered by change notifications, by kind (members: one batched load of changed members, full: the whole declaration).",
		}, []string{"family", "kind"}),
		overflows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_change_overflows_total",
			Help: "Times a declaration's pending changed members exceeded the bound and were replaced by one full refresh.",
		}, []string{"family"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hearth_change_lag_seconds",
			Help:    "From a change (the trigger's clock_timestamp) to its refreshed value acknowledged by Redis.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"family"}),
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_change_listen_connected",
			Help: "1 while the source's LISTEN connection is up (on the leader), else 0.",
		}, []string{"source"}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_change_listen_reconnects_total",
			Help: "Times the source's LISTEN connection failed or dropped and was reconnected.",
		}, []string{"source"}),
	}
	reg.MustRegister(m.notifications, m.members, m.refreshes, m.overflows, m.lag, m.connected, m.reconnects)
	return m
}

func (m *changeMetrics) init(family, channel, source string) {
	m.notifications.WithLabelValues(channel, "ok")
	m.notifications.WithLabelValues(channel, "malformed")
	m.refreshes.WithLabelValues(family, "members")
	m.refreshes.WithLabelValues(family, "full")
	m.overflows.WithLabelValues(family)
	m.connected.WithLabelValues(source)
	m.reconnects.WithLabelValues(source)
}

// forget drops the series of the declarations, channels and sources that
// listened in old and do not in next, as a reload drops a removed
// declaration's other series.
func (m *changeMetrics) forget(old, next []*warmer.Spec) {
	keep := map[[2]string]bool{}
	for _, s := range next {
		if s != nil && s.Notify != "" {
			keep[[2]string{"family", s.Name}], keep[[2]string{"channel", s.Notify}], keep[[2]string{"source", s.Source}] = true, true, true
		}
	}
	for _, s := range old {
		if s == nil || s.Notify == "" {
			continue
		}
		if !keep[[2]string{"family", s.Name}] {
			l := prometheus.Labels{"family": s.Name}
			m.members.DeletePartialMatch(l)
			m.refreshes.DeletePartialMatch(l)
			m.overflows.DeletePartialMatch(l)
			m.lag.DeletePartialMatch(l)
		}
		if !keep[[2]string{"channel", s.Notify}] {
			m.notifications.DeletePartialMatch(prometheus.Labels{"channel": s.Notify})
		}
		if !keep[[2]string{"source", s.Source}] {
			l := prometheus.Labels{"source": s.Source}
			m.connected.DeletePartialMatch(l)
			m.reconnects.DeletePartialMatch(l)
		}
	}
}

// changeDSNs maps each postgres source's name to its DSN.
func changeDSNs(cfg *config.Config) map[string]string {
	out := map[string]string{}
	for _, s := range cfg.Sources {
		if s.Type == "postgres" {
			out[s.Name] = s.DSN
		}
	}
	return out
}
