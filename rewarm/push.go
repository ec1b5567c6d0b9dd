package rewarm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/neterr"
	"github.com/hearth-dev/hearth/store"
)

// invalidateChannel is where Redis publishes client-tracking invalidations
// for a client that redirects them (CLIENT TRACKING … REDIRECT).
const invalidateChannel = "__redis__:invalidate"

// pushWatch keeps, per master, a subscriber connection that receives
// client-tracking invalidations of that master's marker: a write or delete of
// the marker, and a FLUSHDB/FLUSHALL (an invalidation with no keys), make the
// Rewarmer check at once. A dropped connection (a restart, a failover, a
// network cut) does too, once the watch reconnects; the periodic check stays
// the fallback for everything the watch cannot see.
//
// Tracking is in its default mode on the marker alone (the watch reads it
// after every invalidation), not BCAST on a prefix: BCAST PREFIX <ns>:warm
// also matched <ns>:warmX, and anyone writing such keys 7,400 times a second
// made as many checks. Redis sends nothing for other keys; whatever still
// arrives that is not the marker's invalidation (anyone may PUBLISH on
// __redis__:invalidate) is counted, logged once per ignoredLogEvery and
// dropped, and the checks a push asks for are paced by the Rewarmer's loop.
type pushWatch struct {
	r        *Rewarmer
	ctx      context.Context
	cancel   context.CancelFunc
	mu       sync.Mutex
	sessions map[string]context.CancelFunc // by master address and marker
	refused  bool                          // tracking was refused once (ACL, old Redis): logged
	wg       sync.WaitGroup

	// ignored counts invalidations that were not the marker's since the
	// last log line about them, at ignoredLogged.
	ignoredMu     sync.Mutex
	ignored       int
	ignoredLogged time.Time
}

// ignoredLogEvery is how often ignored invalidations are logged, with their count.
const ignoredLogEvery = time.Minute

func newPushWatch(ctx context.Context, r *Rewarmer) *pushWatch {
	ctx, cancel := context.WithCancel(ctx)
	return &pushWatch{r: r, ctx: ctx, cancel: cancel, sessions: map[string]context.CancelFunc{}}
}

// watch brings the push sessions in line with the masters a check found.
func (r *Rewarmer) watch(sites []site) {
	if r.push != nil {
		r.push.sync(sites)
	}
}

// kickNow asks the loop for a check at once; a check already asked for covers it.
func (r *Rewarmer) kickNow() {
	select {
	case r.kick <- DetectPush:
	default:
	}
}

func (p *pushWatch) sync(sites []site) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		return
	}
	want := map[string]bool{}
	for _, st := range sites {
		// A master whose marker moved (a reshard) gets a new session.
		id := st.addr + " " + st.marker
		want[id] = true
		if _, ok := p.sessions[id]; ok {
			continue
		}
		c, ok := st.node.(*redis.Client)
		if !ok {
			continue // not a plain connection: the poll alone watches it
		}
		ctx, cancel := context.WithCancel(p.ctx)
		p.sessions[id] = cancel
		p.wg.Go(func() { p.run(ctx, c, st.addr, st.marker) })
	}
	for addr, cancel := range p.sessions {
		if !want[addr] {
			cancel()
			delete(p.sessions, addr)
		}
	}
}

func (p *pushWatch) close() {
	p.cancel()
	p.wg.Wait()
}

// errTrackingRefused: the server does not allow the watch (ACL, no CLIENT TRACKING).
var errTrackingRefused = errors.New("client tracking refused")

// How the watch reconnects. While the master does not answer (a restart, a
// failover, a network cut) it redials every few milliseconds, with jitter and
// a low cap: a refused dial costs Redis nothing, and the reconnection is what
// starts the check that re-warms a restarted master, so it comes within
// reconnectMax of Redis accepting connections again. A session that reaches
// Redis but cannot be set up backs off to setupMax, and sessions that reach
// Redis start at least MinCheckGap apart (a FLUSHDB loop or a flapping master
// costs it at most 10 sessions a second). While the watch is down it asks for
// a check at once, then with the setup backoff (100 ms doubling to 2 s), so
// that a Cluster master gone for good is replaced by its promoted replica.
const (
	reconnectMin = 2 * time.Millisecond
	reconnectMax = 20 * time.Millisecond
	setupMin     = 100 * time.Millisecond
	setupMax     = 2 * time.Second
)

// sessionEnd is how far a session got before it ended.
type sessionEnd int

const (
	endUnreached sessionEnd = iota // Redis did not answer: down, restarting, unreachable
	endSetup                       // Redis answered, but the watch could not be set up
	endDropped                     // the watch was up: its connection dropped, or a flush ended it
)

// jittered is an exponential backoff from lo doubling to hi, ±50%.
func jittered(lo, hi time.Duration) *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{InitialInterval: lo, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: hi}
	b.Reset()
	return b
}

// run keeps one master's session up until ctx ends, reconnecting as above;
// every reconnection is followed by a check (the connection may have dropped
// because the master restarted or was replaced).
func (p *pushWatch) run(ctx context.Context, c *redis.Client, addr, marker string) {
	log := p.r.log.With().Str("master", addr).Logger()
	down, setup, asks := jittered(reconnectMin, reconnectMax), jittered(setupMin, setupMax), jittered(setupMin, setupMax)
	var reached, askAt time.Time // start of the last session that reached Redis; when to ask for a check next
	last := sessionEnd(-1)       // how the previous session ended
	for first := true; ctx.Err() == nil; first = false {
		t0 := time.Now()
		end, err := p.session(ctx, c, marker, !first)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errTrackingRefused) {
			p.mu.Lock()
			logIt := !p.refused
			p.refused = true
			p.mu.Unlock()
			if logIt {
				log.Warn().Err(err).Msg("re-warm push watch unavailable: losses are seen by the periodic check only")
			}
			return
		}
		now := time.Now()
		var wait time.Duration
		switch end {
		case endDropped:
			down.Reset()
			setup.Reset()
			asks.Reset()
			reached, askAt = t0, now
		case endSetup:
			reached = t0
			wait = setup.NextBackOff()
		default:
			wait = down.NextBackOff()
		}
		if !now.Before(askAt) {
			p.r.kickNow()
			askAt = now.Add(asks.NextBackOff())
		}
		wait = max(wait, time.Until(reached.Add(MinCheckGap)))
		if end == endDropped || end != last { // not once per redial: they come every few ms
			log.Debug().Err(err).Dur("retry_in_ms", wait).Msg("re-warm push watch reconnecting")
		}
		last = end
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// session subscribes to the invalidations, turns tracking on for the marker
// on a second connection, and waits for pushes. It returns on a flush (after
// kicking a check), or when a connection fails, and says how far it got.
func (p *pushWatch) session(ctx context.Context, base *redis.Client, marker string, kick bool) (sessionEnd, error) {
	opts := *base.Options()
	name := "hearth-rewarm-" + rand.Text()
	opts.ClientName = name
	opts.Protocol = 2 // invalidations as pub/sub messages on the redirect connection
	opts.PoolSize, opts.MinIdleConns, opts.MaxIdleConns = 2, 0, 0
	// One dial, no retries: run's loop is the retry, at its own pace.
	opts.DialerRetries, opts.MaxRetries = 1, -1
	cl := redis.NewClient(&opts)
	defer cl.Close()
	ps := cl.Subscribe(ctx, invalidateChannel)
	defer ps.Close()
	// A read in progress does not watch ctx: closing the subscription ends
	// it at once, so that Close (and a shutdown handing the lease over) never
	// waits for the receive timeout. A close already started is waited for:
	// the session (and Run) returns with nothing of it still running.
	closed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(closed)
		_ = ps.Close()
	})
	defer func() {
		if !stop() {
			<-closed
		}
	}()
	if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); err != nil {
		end := endUnreached
		var rerr redis.Error
		if errors.As(err, &rerr) {
			end = endSetup // an answer (NOAUTH, a full server): not worth redialling at once
		}
		return end, fmt.Errorf("subscribe %s: %w", invalidateChannel, err)
	}
	if kick {
		// Reconnected: whatever dropped the connection may have lost data,
		// and Redis answers again: check now, not after the tracking's
		// round trips (a restarted Redis's keys wait for this check).
		p.r.kickNow()
	}
	id, err := subscriberID(ctx, cl, name)
	if err != nil {
		return endSetup, err
	}
	conn := cl.Conn()
	defer conn.Close()
	err = conn.Do(ctx, "CLIENT", "TRACKING", "ON", "REDIRECT", id).Err()
	var rerr redis.Error
	if errors.As(err, &rerr) && (strings.HasPrefix(err.Error(), "ERR") || strings.HasPrefix(err.Error(), "NOPERM")) {
		return endSetup, fmt.Errorf("%w: %v", errTrackingRefused, err)
	}
	if err != nil {
		return endSetup, fmt.Errorf("client tracking: %w", err)
	}
	// Reading the marker is what makes Redis track it for this connection,
	// once: it is read again after each of its invalidations. On a Cluster
	// the marker's slot may have moved (a reshard): the session goes on
	// (a flush still reaches every tracking connection), asks for a check,
	// which moves the watch to the master's new marker, and retries when idle.
	tracked, moved := false, false
	track := func() error {
		err := conn.Get(ctx, marker).Err()
		switch {
		case err == nil || errors.Is(err, redis.Nil):
			tracked, moved = true, false
			return nil
		case movedError(err):
			if !moved {
				p.r.kickNow() // once per move, not per retry
			}
			tracked, moved = false, true
			return nil
		}
		return fmt.Errorf("track %s: %w", marker, err)
	}
	if err := track(); err != nil {
		return endSetup, err
	}
	if kick {
		// Again once tracked: a flush between that check and the tracking
		// was pushed to nobody.
		p.r.kickNow()
	}
	for {
		msg, err := ps.ReceiveTimeout(ctx, 5*time.Second)
		switch {
		case err == nil:
		case neterr.IsTimeout(err) && ctx.Err() == nil:
			// Quiet: make sure the tracking connection is still there.
			if err := conn.Ping(ctx).Err(); err != nil {
				return endDropped, fmt.Errorf("tracking connection: %w", err)
			}
			p.ignore(0)
			if !tracked {
				if err := track(); err != nil {
					return endDropped, err
				}
			}
			continue
		case strings.Contains(err.Error(), "unsupported pubsub message payload"):
			// An invalidation with a null key list: FLUSHDB or FLUSHALL.
			p.r.kickNow()
			return endDropped, nil
		default:
			return endDropped, err
		}
		m, ok := msg.(*redis.Message)
		if !ok || m.Channel != invalidateChannel {
			continue
		}
		// A real invalidation is a list of keys; a plain string is
		// someone's PUBLISH on the channel.
		mine, foreign := false, 0
		for _, k := range m.PayloadSlice {
			if k == marker {
				mine = true
			} else {
				foreign++
			}
		}
		if m.PayloadSlice == nil {
			foreign++
		}
		if foreign > 0 {
			p.ignore(foreign)
		}
		if mine {
			p.r.kickNow()
			if err := track(); err != nil {
				return endDropped, err
			}
		}
	}
}

// ignore counts n invalidations that were not the marker's, and logs their
// count at most once per ignoredLogEvery (n = 0 only logs what is due).
func (p *pushWatch) ignore(n int) {
	if n > 0 {
		p.r.ignored.Add(float64(n))
	}
	p.ignoredMu.Lock()
	p.ignored += n
	now := time.Now()
	logIt := p.ignored > 0 && now.Sub(p.ignoredLogged) >= ignoredLogEvery
	count := p.ignored
	if logIt {
		p.ignored, p.ignoredLogged = 0, now
	}
	p.ignoredMu.Unlock()
	if logIt {
		p.r.log.Warn().Int("ignored", count).Str("marker_prefix", store.MarkerKey(p.r.opts.Namespace)).Dur("log_every_ms", ignoredLogEvery).
			Msg("re-warm push watch ignored invalidations that were not of its marker (published on __redis__:invalidate by another client)")
	}
}

// movedError reports a Cluster redirection (MOVED, ASK): the key's slot is
// served elsewhere now.
func movedError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && (strings.HasPrefix(err.Error(), "MOVED ") || strings.HasPrefix(err.Error(), "ASK "))
}

// subscriberID finds the client id of the connection named name that is
// subscribed (flags P), the target of the tracking redirect.
func subscriberID(ctx context.Context, c *redis.Client, name string) (string, error) {
	list, err := c.Do(ctx, "CLIENT", "LIST", "TYPE", "pubsub").Text()
	if err != nil {
		return "", fmt.Errorf("client list: %w", err)
	}
	for _, line := range strings.Split(list, "\n") {
		var id string
		match := false
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
			}
			if f == "name="+name {
				match = true
			}
		}
		if match && id != "" {
			return id, nil
		}
	}
	return "", errors.New("client list: the watch's subscriber connection is not listed")
}
