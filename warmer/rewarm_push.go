package warmer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// invalidateChannel is where Redis publishes client-tracking invalidations
// for a client that redirects them (CLIENT TRACKING … REDIRECT).
const invalidateChannel = "__redis__:invalidate"

// pushWatch keeps, per master, a subscriber connection that receives
// client-tracking invalidations of the markers (BCAST PREFIX <ns>:warm): a
// write or delete of a marker, and a FLUSHDB/FLUSHALL (an invalidation with no
// keys), make the Rewarmer check at once. A dropped connection (a restart, a
// failover, a network cut) does too, once the watch reconnects; the periodic
// check stays the fallback for everything the watch cannot see.
type pushWatch struct {
	r        *Rewarmer
	ctx      context.Context
	cancel   context.CancelFunc
	mu       sync.Mutex
	sessions map[string]context.CancelFunc // by master address ("" single node)
	refused  bool                          // tracking was refused once (ACL, old Redis): logged
	wg       sync.WaitGroup
}

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
		want[st.addr] = true
		if _, ok := p.sessions[st.addr]; ok {
			continue
		}
		c, ok := st.node.(*redis.Client)
		if !ok {
			continue // not a plain connection: the poll alone watches it
		}
		ctx, cancel := context.WithCancel(p.ctx)
		p.sessions[st.addr] = cancel
		p.wg.Go(func() { p.run(ctx, c, st.addr) })
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

// run keeps one master's session up until ctx ends, reconnecting with
// backoff; every reconnection is followed by a check (the connection may have
// dropped because the master restarted or was replaced).
func (p *pushWatch) run(ctx context.Context, c *redis.Client, addr string) {
	log := p.r.log.With().Str("master", addr).Logger()
	backoff := 100 * time.Millisecond
	for first := true; ctx.Err() == nil; first = false {
		t0 := time.Now()
		err := p.session(ctx, c, !first)
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
		p.r.kickNow()
		if time.Since(t0) > 5*time.Second {
			backoff = 100 * time.Millisecond
		}
		log.Debug().Err(err).Dur("retry_in_ms", backoff).Msg("re-warm push watch reconnecting")
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// session subscribes to the invalidations, turns tracking on for the markers
// on a second connection, and waits for pushes. It returns on a flush (after
// kicking a check), or when a connection fails.
func (p *pushWatch) session(ctx context.Context, base *redis.Client, kick bool) error {
	opts := *base.Options()
	name := "hearth-rewarm-" + randHex(6)
	opts.ClientName = name
	opts.Protocol = 2 // invalidations as pub/sub messages on the redirect connection
	opts.PoolSize, opts.MinIdleConns, opts.MaxIdleConns = 2, 0, 0
	cl := redis.NewClient(&opts)
	defer cl.Close()
	ps := cl.Subscribe(ctx, invalidateChannel)
	defer ps.Close()
	// A read in progress does not watch ctx: closing the subscription ends
	// it at once, so that Close (and a shutdown handing the lease over) never
	// waits for the receive timeout.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
	if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); err != nil {
		return fmt.Errorf("subscribe %s: %w", invalidateChannel, err)
	}
	id, err := subscriberID(ctx, cl, name)
	if err != nil {
		return err
	}
	conn := cl.Conn()
	defer conn.Close()
	err = conn.Do(ctx, "CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST", "PREFIX", MarkerKey(p.r.opts.Namespace)).Err()
	var rerr redis.Error
	if errors.As(err, &rerr) && (strings.HasPrefix(err.Error(), "ERR") || strings.HasPrefix(err.Error(), "NOPERM")) {
		return fmt.Errorf("%w: %v", errTrackingRefused, err)
	}
	if err != nil {
		return fmt.Errorf("client tracking: %w", err)
	}
	if kick {
		// Reconnected: whatever dropped the connection may have lost data.
		p.r.kickNow()
	}
	for {
		msg, err := ps.ReceiveTimeout(ctx, 5*time.Second)
		var ne net.Error
		switch {
		case err == nil:
		case errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil:
			// Quiet: make sure the tracking connection is still there.
			if err := conn.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("tracking connection: %w", err)
			}
			continue
		case strings.Contains(err.Error(), "unsupported pubsub message payload"):
			// An invalidation with a null key list: FLUSHDB or FLUSHALL.
			p.r.kickNow()
			return nil
		default:
			return err
		}
		if m, ok := msg.(*redis.Message); ok && m.Channel == invalidateChannel {
			p.r.kickNow()
		}
	}
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

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
