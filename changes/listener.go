package changes

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/sources/postgres"
)

const (
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

// listener is one source's LISTEN connection and its declarations' queues.
type listener struct {
	source         string
	conn           *pgx.ConnConfig
	channels       map[string][]*queue // channel → the declarations it drives
	queues         []*queue
	w              Refresher
	m              *metrics
	now            func() time.Time
	log            zerolog.Logger
	connectTimeout time.Duration
}

// run listens until ctx ends (Run's: the leader's term).
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
	cctx, ccancel := context.WithTimeout(sctx, l.connectTimeout)
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
				pctx, pcancel := context.WithTimeout(sctx, l.connectTimeout)
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

// parsePayload decodes a notification; anything but Hearth's format is an
// error: one JSON object whose member names match exactly (no other member, no
// name twice, no other case), nothing after it.
func parsePayload(s string) (payload, error) {
	var p payload
	if err := jsonv2.Unmarshal([]byte(s), &p, jsonv2.RejectUnknownMembers(true)); err != nil {
		return p, fmt.Errorf("not hearth's payload: %w", err)
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
	} else {
		l.m.delivery.WithLabelValues(channel).Observe(max(0, now.Sub(ts)).Seconds())
	}
	for _, q := range queues {
		q.add(p, ts)
	}
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
