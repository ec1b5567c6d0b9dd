package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
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
	// httpMaxBodyBytes bounds a request's body. No route of the listener
	// takes one; a small one is read (and ignored) so that clients that send
	// one anyway keep working.
	httpMaxBodyBytes = 4 << 10
	// httpBodyTimeout bounds reading that body. A client trickling a body
	// byte by byte holds its connection no longer, and can be shed meanwhile.
	httpBodyTimeout = time.Second
	// httpMaxConns bounds the open connections. At the bound, a new connection
	// takes the place of the longest idle one (or of the oldest that has not
	// sent a whole request yet, or of the oldest still sending its body), so a
	// probe gets in however many idle or slow connections a client leaves open;
	// only when every connection is busy in a handler is the newcomer closed at
	// once.
	httpMaxConns = 1024
	// httpProbeMaxConns bounds the probe listener's connections: a kubelet
	// opens one per probe, and idle ones are shed as on the main listener.
	httpProbeMaxConns = 64
)

// httpLimits are the listener's limits; tests shorten them.
type httpLimits struct {
	readHeader, read, write, idle, body time.Duration
	maxHeaderBytes, maxConns, maxBody   int
}

var defaultHTTPLimits = httpLimits{
	readHeader: httpReadHeaderTimeout, read: httpReadTimeout, write: httpWriteTimeout, idle: httpIdleTimeout,
	body: httpBodyTimeout, maxHeaderBytes: httpMaxHeaderBytes, maxConns: httpMaxConns, maxBody: httpMaxBodyBytes,
}

// listenTCP opens the listener; tests replace it to break the listener.
var listenTCP = net.Listen

// server is Hearth's own HTTP listener: metrics, liveness and readiness.
type server struct {
	ln    *connLimiter
	srv   *http.Server
	mux   *http.ServeMux
	ready atomic.Bool
	// probeLn and probeSrv are the probe-only listener, nil without one.
	probeLn  *connLimiter
	probeSrv *http.Server
	// done is closed when the first Serve returns; wg waits for them all.
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup
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

var _ status = (*server)(nil)

// listen binds the address now, so that a taken port fails start-up;
// instance names this instance on /healthz.
// probeAddr, when set, is a second listener that serves only the probes.
func listen(addr, probeAddr, instance string, reg *prometheus.Registry, log zerolog.Logger) (*server, error) {
	s, err := listenWith(addr, defaultHTTPLimits, reg, log)
	if err != nil {
		return nil, err
	}
	if probeAddr != "" {
		lim := defaultHTTPLimits
		lim.maxConns = httpProbeMaxConns
		if err := s.listenProbes(probeAddr, lim, reg, log); err != nil {
			_ = s.ln.Close()
			return nil, err
		}
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
	s, err := listen(addr, "", "", reg, log)
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
	s := &server{mux: mux, done: make(chan struct{})}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s.probes(mux)
	s.ln, s.srv = newHTTPServer(ln, mux, lim, prometheus.WrapRegistererWith(prometheus.Labels{"listener": "main"}, reg))
	log.Info().Str("addr", ln.Addr().String()).Int("max_connections", lim.maxConns).Msg("http listening")
	return s, nil
}

// listenProbes opens the probe-only listener (http.probe_listen): /healthz
// and /readyz and nothing else, with an accept queue and a connection bound
// of its own, so that clients reconnecting to the main listener never queue
// ahead of the probes.
func (s *server) listenProbes(addr string, lim httpLimits, reg prometheus.Registerer, log zerolog.Logger) error {
	ln, err := listenTCP("tcp", addr)
	if err != nil {
		return fmt.Errorf("http probe listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	s.probes(mux)
	s.probeLn, s.probeSrv = newHTTPServer(ln, mux, lim, prometheus.WrapRegistererWith(prometheus.Labels{"listener": "probe"}, reg))
	log.Info().Str("addr", ln.Addr().String()).Int("max_connections", lim.maxConns).Msg("http probes listening")
	return nil
}

// ProbeAddr is the probe listener's bound address, "" without one.
func (s *server) ProbeAddr() string {
	if s.probeLn == nil {
		return ""
	}
	return s.probeLn.Addr().String()
}

// newHTTPServer is an http.Server on ln with the listener's limits, its
// connection bound and its body guard; its metrics go to reg.
func newHTTPServer(ln net.Listener, h http.Handler, lim httpLimits, reg prometheus.Registerer) (*connLimiter, *http.Server) {
	f := promauto.With(reg)
	cl := newConnLimiter(ln, lim.maxConns, reg)
	bodies := f.NewCounterVec(prometheus.CounterOpts{
		Name: "hearth_http_bodies_refused_total",
		Help: "Requests to Hearth's HTTP listener refused for their body: over the size bound (too_large) or not sent within the body timeout (slow); the connection is closed.",
	}, []string{"reason"})
	for _, r := range []string{"too_large", "slow"} {
		bodies.WithLabelValues(r)
	}
	cl.bodies = bodies
	return cl, &http.Server{
		Handler:           guardBody(h, lim, bodies),
		ConnContext:       withConn,
		ReadHeaderTimeout: lim.readHeader,
		ReadTimeout:       lim.read,
		WriteTimeout:      lim.write,
		IdleTimeout:       lim.idle,
		MaxHeaderBytes:    lim.maxHeaderBytes,
		ConnState:         cl.track,
	}
}

// probes mounts /healthz and /readyz on mux.
func (s *server) probes(mux *http.ServeMux) {
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
}

// Addr is the bound address (useful with port 0).
func (s *server) Addr() string { return s.ln.Addr().String() }

// serve serves until shutdown. Serve returning for any other reason (the
// listener failed) closes failed(); err() says why.
func (s *server) serve() {
	run := func(srv *http.Server, ln net.Listener) {
		defer s.wg.Done()
		err := srv.Serve(ln)
		s.once.Do(func() {
			if !errors.Is(err, http.ErrServerClosed) {
				s.err = fmt.Errorf("http server on %s: %w", ln.Addr(), err)
			}
			close(s.done)
		})
	}
	s.wg.Add(1)
	go run(s.srv, s.ln)
	if s.probeSrv != nil {
		s.wg.Add(1)
		go run(s.probeSrv, s.probeLn)
	}
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
	if s.probeSrv != nil {
		err = errors.Join(err, s.probeSrv.Shutdown(ctx))
	}
	s.wg.Wait()
	return err
}

// connLimiter bounds the open connections of a listener, shedding idle ones
// for newcomers. golang.org/x/net/netutil.LimitListener blocks Accept at the
// bound instead: a probe would wait in the kernel's backlog behind idle
// connections until their idle timeout, and a client reopening them as they
// close would starve the probes for good.
//
// The sheddable connections sit in three lists, oldest first (idle keep-alive,
// new without a whole request, and requests still sending their body), so that
// making room costs the same whatever the bound: under reconnect churn the
// accept loop is the probes' queue.
type connLimiter struct {
	net.Listener
	max  int
	open prometheus.Gauge
	shed *prometheus.CounterVec
	// bodies counts the requests guardBody refused on this listener.
	bodies *prometheus.CounterVec

	mu                sync.Mutex
	n                 int
	idle, fresh, body connList
}

// connList is an intrusive doubly linked list of connections, oldest first.
type connList struct{ head, tail *limitedConn }

func (q *connList) push(c *limitedConn) {
	c.list, c.prev, c.next = q, q.tail, nil
	if q.tail != nil {
		q.tail.next = c
	} else {
		q.head = c
	}
	q.tail = c
}

func (q *connList) remove(c *limitedConn) {
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		q.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		q.tail = c.prev
	}
	c.list, c.prev, c.next = nil, nil, nil
}

// limitedConn is one connection the limiter counts. inBody is whether its request is still sending its body and
// counted whether it holds a place; they, and the list it sits in, are
// guarded by l.mu. released is set by whoever closes it first.
type limitedConn struct {
	net.Conn
	l          *connLimiter
	inBody     bool
	counted    bool
	list       *connList
	prev, next *limitedConn
	released   atomic.Bool
}

func newConnLimiter(ln net.Listener, maxConns int, reg prometheus.Registerer) *connLimiter {
	f := promauto.With(reg)
	l := &connLimiter{
		Listener: ln, max: maxConns,
		open: f.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_http_connections_open",
			Help: "Connections open to Hearth's HTTP listener.",
		}),
		shed: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_http_connections_shed_total",
			Help: "Connections closed at the connection bound: idle (keep-alive, longest idle first), body (a request still sending its body, oldest first) or new (no whole request yet, oldest first) ones shed for a newcomer, or the newcomer itself when every connection was busy (full).",
		}, []string{"state"}),
	}
	for _, s := range []string{"idle", "new", "body", "full"} {
		l.shed.WithLabelValues(s)
	}
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
	state := ""
	if l.n >= l.max {
		switch {
		// A request still sending its body goes before a new connection: a
		// legitimate one sends its (tiny) body at once, and the newest
		// connection may be a probe whose request is not read yet.
		case l.idle.head != nil:
			victim, state = l.idle.head, "idle"
		case l.body.head != nil:
			victim, state = l.body.head, "body"
		case l.fresh.head != nil:
			victim, state = l.fresh.head, "new"
		default:
			l.mu.Unlock()
			return false
		}
		victim.list.remove(victim)
		victim.counted = false
		l.n--
		if !victim.released.CompareAndSwap(false, true) {
			victim = nil // closing on its own already: its place is free
		}
	}
	l.n++
	c.counted = true
	l.fresh.push(c)
	l.open.Set(float64(l.n))
	l.mu.Unlock()
	if victim != nil {
		_ = victim.Conn.Close()
		l.shed.WithLabelValues(state).Inc()
	}
	return true
}

// track is the http.Server's ConnState hook.
func (l *connLimiter) track(c net.Conn, st http.ConnState) {
	if lc, ok := c.(*limitedConn); ok {
		lc.set(st, false)
	}
}

// set records the connection's state and whether it waits for a request
// body, and files it in the list it can be shed from (none when busy).
func (c *limitedConn) set(st http.ConnState, inBody bool) {
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if !c.counted {
		return // closed, or shed
	}
	c.inBody = inBody
	if c.list != nil {
		c.list.remove(c)
	}
	switch {
	case st == http.StateIdle:
		l.idle.push(c)
	case st == http.StateNew:
		l.fresh.push(c)
	case st == http.StateActive && inBody:
		l.body.push(c)
	}
}

// Close frees the connection's place.
func (c *limitedConn) Close() error {
	if c.released.CompareAndSwap(false, true) {
		l := c.l
		l.mu.Lock()
		if c.counted { // else shed: the limiter took it off already
			if c.list != nil {
				c.list.remove(c)
			}
			c.counted = false
			l.n--
			l.open.Set(float64(l.n))
		}
		l.mu.Unlock()
	}
	return c.Conn.Close()
}

type connKey struct{}

// withConn keeps the accepted connection in its requests' context, for
// guardBody to mark it sheddable while the body arrives.
func withConn(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitedConn); ok {
		return context.WithValue(ctx, connKey{}, lc)
	}
	return ctx
}

// guardBody reads a request's body, if any, before next sees the request:
// at most lim.maxBody bytes within lim.body, else the request is refused
// (413, 408) and its connection closed. Meanwhile the connection may be shed
// for a newcomer. Without it net/http waits for an unread body of up to
// 256 KiB before answering, and a client trickling one held a busy
// connection up to the read timeout: 1,100 of them kept every probe out.
func guardBody(next http.Handler, lim httpLimits, refused *prometheus.CounterVec) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		refuse := func(code int, reason, msg string) {
			refused.WithLabelValues(reason).Inc()
			// Closing skips net/http's wait for the rest of the body.
			w.Header().Set("Connection", "close")
			http.Error(w, msg, code)
		}
		if r.ContentLength > int64(lim.maxBody) {
			refuse(http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("request body over %d bytes: this listener takes none", lim.maxBody))
			return
		}
		lc, _ := r.Context().Value(connKey{}).(*limitedConn)
		if lc != nil {
			lc.set(http.StateActive, true)
		}
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(lim.body))
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(lim.maxBody)))
		if lc != nil {
			lc.set(http.StateActive, false)
		}
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			refuse(http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("request body over %d bytes: this listener takes none", lim.maxBody))
			return
		case err != nil:
			refuse(http.StatusRequestTimeout, "slow", fmt.Sprintf("request body not received within %v", lim.body))
			return
		}
		// The read deadline also ends the request's context once passed: give
		// the handler the listener's usual bound back.
		_ = rc.SetReadDeadline(time.Now().Add(lim.read))
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}
