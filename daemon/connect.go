package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/internal/neterr"
	"github.com/hearth-dev/hearth/internal/redact"
	"github.com/hearth-dev/hearth/sources/budget"
	httpsrc "github.com/hearth-dev/hearth/sources/http"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/sources/protect"
	"github.com/hearth-dev/hearth/warmer"
)

// ConnectTimeout bounds each start-up check of Redis and the sources.
const ConnectTimeout = 5 * time.Second

// NewRedis builds a UniversalClient: single node, Sentinel (master_name) or Cluster
// (several addresses).
func NewRedis(c config.Redis) redis.UniversalClient {
	opts := &redis.UniversalOptions{
		Addrs:        c.Addrs,
		Username:     c.Username,
		Password:     c.Password,
		DB:           c.DB,
		MasterName:   c.MasterName,
		PoolSize:     c.PoolSize,
		DialTimeout:  c.DialTimeout,
		ReadTimeout:  c.ReadTimeout,
		WriteTimeout: c.WriteTimeout,
		// Deadlines of the caller's context bound commands too: a lease
		// renewal must not outlive its renew deadline.
		ContextTimeoutEnabled: true,
	}
	if c.TLS {
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if opts.MasterName == "" {
		// Not behind Sentinel: there each of go-redis's dial attempts asks
		// for the master's address again, which a failover needs.
		opts.Dialer = redialRefused(answered(redis.NewDialer(&redis.Options{DialTimeout: c.DialTimeout, TLSConfig: opts.TLSConfig}), c.DialTimeout))
		opts.DialerRetries = 1 // redialRefused is the retry
	}
	if opts.MasterName == "" && len(opts.Addrs) > 1 {
		return clusterClient(opts.Cluster())
	}
	if opts.MasterName == "" {
		opts.Dialer = refusedAsConn(opts.Dialer)
	}
	return redis.NewUniversalClient(opts)
}

// refusedFor is how long one dial of the daemon's Redis client redials a
// refused connection (see redialRefused).
const refusedFor = 500 * time.Millisecond

// redialRefused wraps dial so that a refused connection (Redis restarting)
// is dialled again every 2–20 ms (jittered) for up to refusedFor: go-redis's
// own 5 dials 100 ms apart saw a restarted Redis up to 100 ms late. Any other
// dial error is returned at once. Once a whole window was refused, later
// dials try once until one connects, so that no command spends refusedFor on
// each retry while Redis stays down (docs/configuration.md, redis).
func redialRefused(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var down atomic.Bool // a whole redial window was refused; no dial has connected since
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		deadline := time.Now().Add(refusedFor)
		bo := &backoff.ExponentialBackOff{InitialInterval: 2 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 20 * time.Millisecond}
		bo.Reset()
		for {
			conn, err := dial(ctx, network, addr)
			if err == nil {
				down.Store(false)
				return conn, nil
			}
			if !errors.Is(err, syscall.ECONNREFUSED) || down.Load() {
				return nil, err
			}
			wait := bo.NextBackOff()
			if time.Until(deadline) < wait {
				down.Store(true)
				return nil, err
			}
			select {
			case <-ctx.Done():
				return nil, err
			case <-time.After(wait):
			}
		}
	}
}

// answered wraps dial so that a connection accepted and then closed before
// Redis answered anything is a refused dial. A TCP proxy, load balancer or
// sidecar in front of a Redis that is down or restarting accepts, fails to
// reach Redis, and closes: each command then met EOF after a successful dial,
// go-redis retried it after 8-512 ms backoffs, and a restarted Redis was seen
// 50-170 ms late (BenchmarkRestartLeader, proxied). As a refused dial it is
// redialled every 2-20 ms by redialRefused, as a direct connection is. The
// test is a PING sent on the new connection: any reply (+PONG, or an error
// such as NOAUTH, which go-redis's own handshake then deals with) is an
// answer. A server that has not answered within probeWait (paused, or busy)
// is not a refusal: the connection is returned as it was before, and the
// PING's reply, when it comes, is dropped before go-redis reads its own
// (pendingReply), so a paused Redis times out go-redis's commands exactly as
// it did. One round trip per new connection; connections are pooled.
func answered(dial func(ctx context.Context, network, addr string) (net.Conn, error), timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		wait := probeWait
		if timeout > 0 {
			wait = min(timeout, probeWait)
		}
		err = pingConn(ctx, conn, wait)
		switch {
		case err == nil:
			return conn, nil
		case errors.Is(err, errNoReplyYet):
			if err := conn.SetDeadline(time.Time{}); err != nil {
				_ = conn.Close()
				return nil, err
			}
			return &pendingReply{Conn: conn}, nil
		}
		_ = conn.Close()
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
			err = unanswered{err}
		}
		return nil, &net.OpError{Op: "dial", Net: network, Addr: conn.RemoteAddr(), Err: err}
	}
}

// probeWait bounds how long answered waits for the PING's reply before it
// hands the connection over unanswered: a proxy closes at once when Redis is
// down, a Redis that takes longer is paused or busy.
const probeWait = 100 * time.Millisecond

// pingCommand is PING in RESP, which every Redis and Redis proxy reads.
const pingCommand = "*1\r\n$4\r\nPING\r\n"

// errNoReplyYet: PING was sent and its reply has not come within the wait.
var errNoReplyYet = errors.New("no reply to PING yet")

// pingConn writes PING and reads its one-line reply, within wait and ctx. It
// returns errNoReplyYet when the reply did not begin in time.
func pingConn(ctx context.Context, conn net.Conn, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	if _, err := io.WriteString(conn, pingCommand); err != nil {
		return err
	}
	var b [1]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		if neterr.IsTimeout(err) {
			return errNoReplyYet
		}
		return err
	}
	if b[0] != '+' && b[0] != '-' {
		return fmt.Errorf("not a Redis reply to PING (first byte %q)", b[0])
	}
	// The rest of the line, a byte at a time, so that nothing after it is
	// taken from go-redis; a simple string or error has no line break inside.
	if err := conn.SetDeadline(time.Now().Add(max(wait, time.Second))); err != nil {
		return err
	}
	if err := skipLine(conn); err != nil {
		return err
	}
	return conn.SetDeadline(time.Time{})
}

// skipLine reads up to and including the next '\n' (at most 4096 bytes).
func skipLine(r io.Reader) error {
	var b [1]byte
	for range 4096 {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return err
		}
		if b[0] == '\n' {
			return nil
		}
	}
	return errors.New("reply to PING longer than 4096 bytes")
}

// pendingReply is a connection whose PING has not been answered yet: its first
// read drops that reply's line, then reads go on as usual. go-redis reads a
// connection from one goroutine at a time.
type pendingReply struct {
	net.Conn
	skipped bool
}

func (c *pendingReply) Read(p []byte) (int, error) {
	if !c.skipped {
		if err := skipLine(c.Conn); err != nil {
			return 0, err
		}
		c.skipped = true
	}
	return c.Conn.Read(p)
}

// unanswered is a connection accepted and closed before Redis answered: it
// reads as, and unwraps to, a refused connection, and keeps its cause.
type unanswered struct{ cause error }

func (u unanswered) Error() string {
	return "connection refused (accepted, then closed before Redis answered: " + u.cause.Error() + ")"
}

func (u unanswered) Unwrap() []error { return []error{syscall.ECONNREFUSED, u.cause} }

// refusedAsConn wraps a single node's dial (after redialRefused) so that a
// refusal is returned as a connection whose every read and write fails with
// it, not as a dial error. go-redis's pool counts failed dials over the
// client's life, and after PoolSize of them stops dialling: every command
// fails with the last dial error until a background probe, once a second,
// connects again. A Redis restarted after a second down was so seen up to a
// second late by every command (the re-warm's check among them, which then
// waited for the next poll: keys gone for 2 s in the restart benchmark). The
// command fails as before, with the same text, at once and without go-redis
// retrying it (redialRefused already redialled, and no longer does once Redis
// is known down); the connection is dropped; the next command dials again,
// and connects as soon as Redis does. A refused port costs Redis nothing. Any
// other dial error (a timeout, an address that does not resolve) stays a dial
// error, for the pool to pace. A Cluster keeps the plain dial: its client
// reacts to a node's dial errors (slot-map reloads, failing nodes).
func refusedAsConn(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		var op *net.OpError
		if err != nil && errors.Is(err, syscall.ECONNREFUSED) && errors.As(err, &op) {
			// go-redis unwraps a failed connection's error once before
			// returning it: the outer %w is what it takes off.
			return refusedConn{err: fmt.Errorf("%w", refusal{op})}, nil
		}
		return conn, err
	}
}

// refusal reads as the refused dial's error, so internal/neterr counts it a
// connection failure (by its text), but it is neither a *net.OpError nor a
// net.Error, which go-redis would retry.
type refusal struct{ op *net.OpError }

func (r refusal) Error() string { return r.op.Error() }

// refusedConn is a connection that was refused: every read and write fails
// with the refusal.
type refusedConn struct{ err error }

func (c refusedConn) Read([]byte) (int, error)         { return 0, c.err }
func (c refusedConn) Write([]byte) (int, error)        { return 0, c.err }
func (c refusedConn) Close() error                     { return nil }
func (c refusedConn) LocalAddr() net.Addr              { return refusedAddr{} }
func (c refusedConn) RemoteAddr() net.Addr             { return refusedAddr{} }
func (c refusedConn) SetDeadline(time.Time) error      { return nil }
func (c refusedConn) SetReadDeadline(time.Time) error  { return nil }
func (c refusedConn) SetWriteDeadline(time.Time) error { return nil }

// refusedAddr is both ends of a refusedConn.
type refusedAddr struct{}

func (refusedAddr) Network() string { return "tcp" }
func (refusedAddr) String() string  { return "refused" }

// pingRedis fails with a message naming the addresses and the cause, never the password.
func pingRedis(ctx context.Context, rdb redis.UniversalClient, c config.Redis) error {
	ctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis %s unreachable: %w", strings.Join(c.Addrs, ","), redact.Secrets(err, c.Password))
	}
	return nil
}

// closer is a source that holds connections.
type closer interface{ Close() }

// Sources are the configured origins, open and checked: each behind its origin
// protection (protect.Guard) for loads; the postgres ones are also kept as
// themselves, for the access log, which reads through their pool and not
// through the protection.
type Sources struct {
	// Guarded are the sources by name, as the warmer loads from them.
	Guarded  map[string]warmer.Source
	postgres map[string]*postgres.Source
	closers  []closer
	guards   []closer // the protections' probers, stopped before the sources close
}

// Close stops the origin probes and closes every source's connections.
func (s *Sources) Close() {
	for _, c := range s.guards {
		c.Close()
	}
	for _, c := range s.closers {
		c.Close()
	}
}

// OpenSources builds every configured source, checks that each answers, and
// puts each behind its origin protection (protect.Guard), whose metrics go to reg.
func OpenSources(ctx context.Context, cfg *config.Config, reg prometheus.Registerer, log zerolog.Logger) (*Sources, error) {
	guards := protect.NewGuardMetrics(reg)
	httpMetrics := httpsrc.NewMetrics(reg)
	payloads := budget.New(cfg.Refresh.MaxInflightBytes, reg)
	out := &Sources{Guarded: make(map[string]warmer.Source, len(cfg.Sources)), postgres: map[string]*postgres.Source{}}
	for _, sc := range cfg.Sources {
		var (
			src warmer.Source
			err error
		)
		switch sc.Type {
		case "postgres":
			var s *postgres.Source
			s, err = postgres.New(postgres.Config{Name: sc.Name, DSN: sc.DSN, MaxConns: sc.MaxConns, StatementTimeout: sc.StatementTimeout, Log: log})
			if err == nil {
				out.closers = append(out.closers, s)
				out.postgres[sc.Name] = s
				src = s
			}
		case "http":
			var s *httpsrc.Source
			s, err = httpsrc.New(httpsrc.Config{Name: sc.Name, BaseURL: sc.BaseURL, Headers: sc.Headers, Timeout: sc.Timeout,
				Concurrency: sc.Concurrency, MaxBodyBytes: sc.MaxBodyBytes, HealthPath: sc.HealthPath,
				Redirects: sc.Redirects, Metrics: httpMetrics, Budget: payloads, Log: log})
			if err == nil {
				out.closers = append(out.closers, s)
				src = s
			}
		default:
			err = errors.New("unknown type " + sc.Type)
		}
		if err != nil {
			out.Close()
			return nil, fmt.Errorf("source %s: %w", sc.Name, err)
		}
		pctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
		err = src.Ping(pctx)
		cancel()
		if err != nil {
			out.Close()
			return nil, fmt.Errorf("source %s unreachable: %w", sc.Name, err)
		}
		g := protect.Guard(src, sc.Guard(guards, log))
		if c, ok := g.(closer); ok {
			out.guards = append(out.guards, c)
		}
		out.Guarded[sc.Name] = g
	}
	return out, nil
}

// RedisURL returns the Redis a URL or a host:port names (`hearth prewarm
// --redis` or --from), or the config's if the URL is empty, and a name for it
// that holds no password; errors name flag.
func RedisURL(c config.Redis, rawURL, flag string) (redis.UniversalClient, string, error) {
	if rawURL == "" {
		return NewRedis(c), strings.Join(c.Addrs, ",") + fmt.Sprintf(" db %d", c.DB), nil
	}
	if !strings.Contains(rawURL, "://") { // host:port, as `hearth demo --redis` takes
		rawURL = "redis://" + rawURL
	}
	if rdb, ok, err := multiHostURL(rawURL); ok {
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", flag, redact.URLError(err, rawURL))
		}
		return rdb, redact.URL(rawURL), nil
	}
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", flag, redact.URLError(err, rawURL))
	}
	if opts.DialTimeout == 0 { // not in the URL: take the config's
		opts.DialTimeout = c.DialTimeout
	}
	return redis.NewClient(opts), redact.URL(rawURL), nil
}

// PingRedis checks that rdb answers, naming it target in the error.
func PingRedis(ctx context.Context, rdb redis.UniversalClient, target string) error {
	ctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis %s unreachable: %w", target, err)
	}
	return nil
}
