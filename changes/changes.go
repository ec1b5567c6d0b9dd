// Package changes owns change-driven refresh: while this instance leads, one
// dedicated connection per postgres source LISTENs on the channels its
// declarations name (notify.channel), and the members the shipped trigger
// sends are refreshed through the engine's batched, fenced write path (a
// Refresher). Batching, the full refresh after every (re)connection and the
// pacing are described in docs/freshness.md.
package changes

import (
	"context"
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

	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/warmer"
)

const (
	// MaxPendingChanges bounds, per declaration, the changed members waiting
	// for their refresh; past it they are dropped for one full refresh.
	MaxPendingChanges = 10_000
	// DefaultMinFullInterval is Options.MinFullInterval's default.
	DefaultMinFullInterval = 10 * time.Second
	// DefaultConnectTimeout is Options.ConnectTimeout's default.
	DefaultConnectTimeout = 5 * time.Second
)

var (
	// ErrClosed is what Run returns on Listeners already closed.
	ErrClosed = errors.New("change listeners closed")
	// ErrRunning is what Run returns while another Run of the same Listeners runs.
	ErrRunning = errors.New("change listeners already running")
)

// Refresher is what change-driven refresh needs of the engine (the warmer).
type Refresher interface {
	// Spec is a declaration's current spec (its template validates members).
	Spec(name string) (*warmer.Spec, bool)
	// Hot keeps the members the declaration keeps warm.
	Hot(name string, members []string) ([]string, bool)
	// RefreshMembers loads and writes the given members in one batch.
	RefreshMembers(ctx context.Context, name string, members []string) (warmer.Outcome, error)
	// Refresh refreshes the whole declaration.
	Refresh(ctx context.Context, name string, ro warmer.RunOptions) (warmer.Outcome, error)
}

// Options configures the change listeners.
type Options struct {
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
	// ConnectTimeout bounds connecting a listener and pinging an idle one
	// (default DefaultConnectTimeout).
	ConnectTimeout time.Duration
}

// Listeners runs the change listeners, one per postgres source with notify
// declarations. Its lifecycle is New, Run until the context ends, Close;
// Apply follows reloaded declarations at any time.
type Listeners struct {
	w    Refresher
	m    *metrics
	opts Options

	mu     sync.Mutex // guards everything below
	closed bool
	specs  []*warmer.Spec // the declarations listened for
	// paces is each declaration's pacing, kept across restarts of the
	// listeners (Apply, Run again) so that none starts with a fresh allowance.
	paces map[string]*pacing
	run   *running // the Run in progress, nil when none
}

// running is one Run: its context and the listeners started under it.
type running struct {
	ctx       context.Context
	cancel    context.CancelFunc
	listeners []*listener
	cancelLs  context.CancelFunc // stops listeners only (Apply restarts them)
	wg        sync.WaitGroup     // the listeners' and queues' goroutines
	done      chan struct{}      // closed when Run returns
}

// New checks the declarations (a notify declaration needs a postgres source
// with a valid DSN) and returns Listeners that listen once Run.
func New(w Refresher, opts Options) (*Listeners, error) {
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MinFullInterval <= 0 {
		opts.MinFullInterval = DefaultMinFullInterval
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = DefaultConnectTimeout
	}
	c := &Listeners{w: w, m: newMetrics(opts.Registerer), opts: opts, paces: map[string]*pacing{}}
	if _, err := c.build(opts.Specs); err != nil {
		return nil, err
	}
	c.specs = opts.Specs
	return c, nil
}

// Run listens until ctx ends or Close, then stops the listeners and waits for
// them and their refreshes. It returns nil, or ErrClosed / ErrRunning when it
// could not start.
func (c *Listeners) Run(ctx context.Context) error {
	r, err := c.start(ctx)
	if err != nil {
		return err
	}
	<-r.ctx.Done()
	c.mu.Lock()
	c.stopLocked()
	c.run = nil
	c.mu.Unlock()
	close(r.done)
	return nil
}

func (c *Listeners) start(ctx context.Context) (*running, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return nil, ErrClosed
	case c.run != nil:
		return nil, ErrRunning
	}
	ls, err := c.build(c.specs)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &running{ctx: rctx, cancel: cancel, done: make(chan struct{})}
	c.run = r
	c.startLocked(ls)
	return r, nil
}

// Apply makes the listeners follow reloaded declarations: when what they
// listen for changed (a declaration's notify channel, coalesce and gather
// waits, batch size or source, or which declarations have one), the running
// listeners stop and new ones start. Each new session refreshes its
// declarations in full once, as after a reconnection, which covers what
// changed in between. An error (a notify declaration on a source that is not
// postgres) leaves the running listeners as they are.
func (c *Listeners) Apply(specs []*warmer.Spec) error {
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
	c.specs = specs
	c.startLocked(ls)
	return nil
}

// Close stops listening and waits for the listeners and their refreshes (or
// for ctx to end).
func (c *Listeners) Close(ctx context.Context) error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	c.closed = true
	r := c.run
	c.mu.Unlock()
	if r == nil {
		return nil
	}
	r.cancel()
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close change listeners: %w", ctx.Err())
	}
}

// notifySignature is what change listening depends on in specs.
func notifySignature(specs []*warmer.Spec) string {
	var b strings.Builder
	for _, s := range specs {
		if s != nil && s.Notify != "" {
			fmt.Fprintf(&b, "%q %q %q %d %d %d\n", s.Name, s.Notify, s.Source, s.Coalesce, s.Gather, s.BatchSize)
		}
	}
	return b.String()
}

// build makes a listener per source with notify declarations, in source order.
func (c *Listeners) build(specs []*warmer.Spec) ([]*listener, error) {
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
				w: c.w, m: c.m, now: opts.Now, connectTimeout: opts.ConnectTimeout,
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
		q := newQueue(s.Name, s.Coalesce, s.Gather, s.BatchSize, l, pace)
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

// startLocked starts ls under the running Run's context, if one runs.
func (c *Listeners) startLocked(ls []*listener) {
	r := c.run
	if r == nil {
		return
	}
	ctx, cancel := context.WithCancel(r.ctx)
	r.cancelLs, r.listeners = cancel, ls
	for _, l := range ls {
		r.wg.Go(func() { l.run(ctx) })
		for _, q := range l.queues {
			r.wg.Go(func() { q.run(ctx) })
		}
	}
}

// stopLocked stops the running listeners and waits for them and their refreshes.
func (c *Listeners) stopLocked() {
	r := c.run
	if r == nil || r.cancelLs == nil {
		return
	}
	r.cancelLs()
	r.wg.Wait()
	r.cancelLs, r.listeners = nil, nil
}
