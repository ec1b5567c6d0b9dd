package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/leader"
)

// Limits of Hearth's own HTTP listener. It serves probes, scrapes and the admin
// API: a few clients, small requests, no bodies. Without them, idle
// keep-alive connections are kept forever and 20,000 of them exhausted the
// descriptors (the probes failed).
const (
	// httpReadHeaderTimeout bounds reading a request's headers (slow clients).
	httpReadHeaderTimeout = 5 * time.Second
	// httpReadTimeout bounds reading a whole request; the admin refresh, which
	// can outlast it, lifts it for its own request.
	httpReadTimeout = 10 * time.Second
	// httpWriteTimeout bounds a handler and its answer (a /metrics scrape takes
	// milliseconds); the admin refresh extends it to its own load bound.
	httpWriteTimeout = 30 * time.Second
	// httpIdleTimeout closes a keep-alive connection idle this long.
	httpIdleTimeout = 60 * time.Second
	// httpMaxHeaderBytes bounds a request's headers.
	httpMaxHeaderBytes = 64 << 10
	// httpMaxConns bounds the open connections. At the bound, a new connection
	// takes the place of the longest idle one (or of the oldest that has not
	// sent a whole request yet), so a probe gets in however many idle
	// connections a client leaves open; only when every connection is busy
	// with a request is the newcomer closed at once.
	httpMaxConns = 1024
)

// httpLimits are the listener's limits; tests shorten them.
type httpLimits struct {
	readHeader, read, write, idle time.Duration
	maxHeaderBytes, maxConns      int
}

var defaultHTTPLimits = httpLimits{
	readHeader: httpReadHeaderTimeout, read: httpReadTimeout, write: httpWriteTimeout, idle: httpIdleTimeout,
	maxHeaderBytes: httpMaxHeaderBytes, maxConns: httpMaxConns,
}

// listenTCP opens the listener; tests replace it to break the listener.
var listenTCP = net.Listen

// server is Hearth's own HTTP listener: metrics, liveness and readiness.
type server struct {
	ln    *connLimiter
	srv   *http.Server
	mux   *http.ServeMux
	ready atomic.Bool
	done  chan struct{}
	// err is why Serve returned, other than a shutdown; read after done.
	err error
	// role ("leader", "standby") and epoch describe this instance on /healthz;
	// instance is its name in the leader lease.
	role     atomic.Value
	epoch    atomic.Int64
	instance string
	// leader is who leads as a standby last read it (reportStandby).
	leader atomic.Pointer[leaderSeen]
}

type leaderSeen struct {
	instance string
	epoch    int64
}

// SetLeader records who leads, as this standby sees it ("" when unknown).
func (s *server) SetLeader(instance string, epoch int64) {
	s.leader.Store(&leaderSeen{instance, epoch})
}

// SetRole records this instance's role and, for a leader, its epoch.
func (s *server) SetRole(role string, epoch int64) {
	s.epoch.Store(epoch)
	s.role.Store(role)
}

// SetReady sets what /readyz answers: 200 when ready, else 503.
func (s *server) SetReady(ready bool) { s.ready.Store(ready) }

var _ leader.Status = (*server)(nil)

// listen binds the address now, so that a taken port fails start-up;
// instance names this instance on /healthz.
func listen(addr, instance string, reg *prometheus.Registry, log zerolog.Logger) (*server, error) {
	s, err := listenWith(addr, defaultHTTPLimits, reg, log)
	if err != nil {
		return nil, err
	}
	s.instance = instance
	return s, nil
}

// servePprof mounts Go's runtime profiles under /debug/pprof/ (http.pprof).
// A CPU profile or trace longer than the write timeout is refused by the
// handler itself.
func (s *server) servePprof() {
	s.mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	s.mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	s.mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	s.mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	s.mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}

// ServeMetrics serves /metrics, /healthz and /readyz (ready at once) on addr
// until shutdown is called: Hearth's listener without a daemon behind it, for
// `hearth demo --listen`.
func ServeMetrics(addr string, reg *prometheus.Registry, log zerolog.Logger) (shutdown func(context.Context) error, err error) {
	s, err := listen(addr, "", reg, log)
	if err != nil {
		return nil, err
	}
	s.ready.Store(true)
	s.serve()
	return s.shutdown, nil
}

func listenWith(addr string, lim httpLimits, reg *prometheus.Registry, log zerolog.Logger) (*server, error) {
	ln, err := listenTCP("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	cl := newConnLimiter(ln, lim.maxConns, reg)
	s := &server{ln: cl, mux: mux, done: make(chan struct{})}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		// Healthy whether leader or standby; the body says which.
		role, _ := s.role.Load().(string)
		var seen leaderSeen
		if p := s.leader.Load(); p != nil && role == "standby" {
			seen = *p
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(struct {
			Status string `json:"status"`
			Role   string `json:"role,omitempty"`
			// Epoch is this instance's term (0 on a standby); a standby
			// names the leader it last saw and that leader's epoch.
			Epoch       int64  `json:"epoch"`
			Ready       bool   `json:"ready"`
			Instance    string `json:"instance,omitempty"`
			Leader      string `json:"leader,omitempty"`
			LeaderEpoch int64  `json:"leader_epoch,omitempty"`
		}{"ok", role, s.epoch.Load(), s.ready.Load(), s.instance, seen.instance, seen.epoch})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			msg := "not ready: start-up load not finished"
			if role, _ := s.role.Load().(string); role == "standby" {
				msg = "not ready: standby (another instance leads)"
			}
			http.Error(w, msg, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: lim.readHeader,
		ReadTimeout:       lim.read,
		WriteTimeout:      lim.write,
		IdleTimeout:       lim.idle,
		MaxHeaderBytes:    lim.maxHeaderBytes,
		ConnState:         cl.track,
	}
	log.Info().Str("addr", ln.Addr().String()).Int("max_connections", lim.maxConns).Msg("http listening")
	return s, nil
}

// Addr is the bound address (useful with port 0).
func (s *server) Addr() string { return s.ln.Addr().String() }

// serve serves until shutdown. Serve returning for any other reason (the
// listener failed) closes failed(); err() says why.
func (s *server) serve() {
	go func() {
		err := s.srv.Serve(s.ln)
		if !errors.Is(err, http.ErrServerClosed) {
			s.err = fmt.Errorf("http server on %s: %w", s.Addr(), err)
		}
		close(s.done)
	}()
}

// failed is closed once Serve has returned: at shutdown, or when the listener
// failed (then failure returns the error).
func (s *server) failed() <-chan struct{} { return s.done }

// failure is why Serve returned other than a shutdown, nil while it serves.
func (s *server) failure() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

func (s *server) shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	<-s.done
	return err
}

// connLimiter bounds the open connections of a listener, shedding idle ones
// for newcomers. golang.org/x/net/netutil.LimitListener blocks Accept at the
// bound instead: a probe would wait in the kernel's backlog behind idle
// connections until their idle timeout, and a client reopening them as they
// close would starve the probes for good.
type connLimiter struct {
	net.Listener
	max  int
	open prometheus.Gauge
	shed *prometheus.CounterVec

	mu    sync.Mutex
	conns map[*limitedConn]struct{}
}

// limitedConn is one connection the limiter counts; state is its last
// http.ConnState, since when it entered it (unix nanoseconds).
type limitedConn struct {
	net.Conn
	l        *connLimiter
	state    atomic.Int32
	since    atomic.Int64
	released atomic.Bool
}

func newConnLimiter(ln net.Listener, maxConns int, reg prometheus.Registerer) *connLimiter {
	l := &connLimiter{
		Listener: ln, max: maxConns, conns: map[*limitedConn]struct{}{},
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_http_connections_open",
			Help: "Connections open to Hearth's HTTP listener.",
		}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_http_connections_shed_total",
			Help: "Connections closed at the connection bound: idle (keep-alive, longest idle first) or new (no whole request yet, oldest first) ones shed for a newcomer, or the newcomer itself when every connection was busy (full).",
		}, []string{"state"}),
	}
	for _, s := range []string{"idle", "new", "full"} {
		l.shed.WithLabelValues(s)
	}
	reg.MustRegister(l.open, l.shed)
	return l
}

// Accept returns the next connection, making room for it if the bound is
// reached; a newcomer no room can be made for is closed and never returned.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := &limitedConn{Conn: c, l: l}
		lc.setState(http.StateNew)
		if l.admit(lc) {
			return lc, nil
		}
		// Counted before the close, so that whoever sees the close can see it counted.
		l.shed.WithLabelValues("full").Inc()
		_ = c.Close()
	}
}

func (l *connLimiter) admit(c *limitedConn) bool {
	l.mu.Lock()
	var victim *limitedConn
	if len(l.conns) >= l.max {
		victim = l.victim()
		if victim == nil {
			l.mu.Unlock()
			return false
		}
		delete(l.conns, victim)
		if !victim.released.CompareAndSwap(false, true) {
			victim = nil // closing on its own already: its place is free
		}
	}
	l.conns[c] = struct{}{}
	l.open.Set(float64(len(l.conns)))
	l.mu.Unlock()
	if victim != nil {
		state := "new"
		if http.ConnState(victim.state.Load()) == http.StateIdle {
			state = "idle"
		}
		_ = victim.Conn.Close()
		l.shed.WithLabelValues(state).Inc()
	}
	return true
}

// victim is the connection to shed: the longest idle one, else the oldest
// that has not sent a whole request yet; nil when all are busy. Call with l.mu
// held.
func (l *connLimiter) victim() *limitedConn {
	var idle, fresh *limitedConn
	for c := range l.conns {
		switch http.ConnState(c.state.Load()) {
		case http.StateIdle:
			if idle == nil || c.since.Load() < idle.since.Load() {
				idle = c
			}
		case http.StateNew:
			if fresh == nil || c.since.Load() < fresh.since.Load() {
				fresh = c
			}
		}
	}
	if idle != nil {
		return idle
	}
	return fresh
}

// track is the http.Server's ConnState hook.
func (l *connLimiter) track(c net.Conn, st http.ConnState) {
	if lc, ok := c.(*limitedConn); ok {
		lc.setState(st)
	}
}

func (c *limitedConn) setState(st http.ConnState) {
	c.since.Store(time.Now().UnixNano())
	c.state.Store(int32(st))
}

// Close frees the connection's place.
func (c *limitedConn) Close() error {
	if c.released.CompareAndSwap(false, true) {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.open.Set(float64(len(c.l.conns)))
		c.l.mu.Unlock()
	}
	return c.Conn.Close()
}
