package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
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
		opts.Dialer = redialRefused(redis.NewDialer(&redis.Options{DialTimeout: c.DialTimeout, TLSConfig: opts.TLSConfig}))
		opts.DialerRetries = 1 // redialRefused is the retry
	}
	if opts.MasterName == "" && len(opts.Addrs) > 1 {
		return newClusterClient(opts)
	}
	return redis.NewUniversalClient(opts)
}

// refusedFor is how long one dial of the daemon's Redis client redials a
// refused connection (see redialRefused).
const refusedFor = 500 * time.Millisecond

// redialRefused wraps dial so that a refused connection (Redis restarting,
// its port closed) is dialled again every few milliseconds (2 ms doubling to
// 20 ms, ±50%) for up to refusedFor before the error is returned. go-redis
// on its own dials 5 times 100 ms apart: about as long before an error, but
// a Redis that accepts connections again was seen up to 100 ms late by every
// command waiting on a dial, the re-warm of a restarted Redis's keys among
// them. A refused connect costs Redis nothing; any other dial error (a
// timeout, an address that does not resolve) is returned at once, and the
// command's own retries (go-redis MaxRetries) dial again.
//
// Once one dial has redialled for refusedFor in vain, Redis is known down:
// later dials try once until one connects, so that a command does not spend
// refusedFor on each of its retries while Redis stays down (a lease release
// at shutdown reports the refusal within its bound instead of running out
// of time).
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

// RedisURL returns the Redis a URL or a host:port names (`hearth prewarm --redis`), or the
// config's if the URL is empty, and a name for it that holds no password.
func RedisURL(c config.Redis, rawURL string) (redis.UniversalClient, string, error) {
	return RedisURLFlag(c, rawURL, "--redis")
}

// RedisURLFlag is RedisURL for the URL of the named flag (`hearth prewarm
// --from` takes what --redis takes); errors name the flag.
func RedisURLFlag(c config.Redis, rawURL, flag string) (redis.UniversalClient, string, error) {
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
