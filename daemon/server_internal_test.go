package daemon

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/admin"
	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/sourcetest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// testLimits are long timeouts, so that only what a test shortens acts.
func testLimits(maxConns int) httpLimits {
	return httpLimits{readHeader: time.Hour, read: time.Hour, write: time.Hour, idle: time.Hour, body: time.Hour,
		maxHeaderBytes: 1 << 16, maxConns: maxConns, maxBody: 1 << 12}
}

func startServer(t *testing.T, lim httpLimits) (*server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s, err := listenWith("127.0.0.1:0", lim, reg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	s.ready.Store(true)
	s.serve()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.shutdown(ctx)
	})
	return s, reg
}

// idleConn makes one keep-alive request on a raw connection and leaves it open, idle.
func idleConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: hearth\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_ = c.SetReadDeadline(time.Time{})
	return c
}

func probe(url string) error {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// TestConnectionBoundShedsIdle: with the bound reached by idle keep-alive
// connections (and idle timeouts far away), a probe still gets in: the longest
// idle connection makes room, and the open connections never exceed the bound.
func TestConnectionBoundShedsIdle(t *testing.T) {
	const max = 8
	s, _ := startServer(t, testLimits(max))
	for range max {
		idleConn(t, s.Addr())
	}
	for range 3 { // and some that never speak
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	for _, path := range []string{"/healthz", "/readyz", "/healthz"} {
		if err := probe("http://" + s.Addr() + path); err != nil {
			t.Fatalf("probe with %d idle connections open: %v", max, err)
		}
	}
	if got := testutil.ToFloat64(s.ln.open); got > max {
		t.Errorf("open connections = %g, want ≤ %d", got, max)
	}
	if got := testutil.ToFloat64(s.ln.shed.WithLabelValues("idle")) + testutil.ToFloat64(s.ln.shed.WithLabelValues("new")); got < 3 {
		t.Errorf("shed = %g, want ≥ 3 (the silent ones and the probes each made room)", got)
	}
}

// TestConnectionBoundRefusesWhenAllBusy: when every connection is busy with a
// request, a newcomer is closed at once and counted, never queued; once the
// requests end, probes get in again.
func TestConnectionBoundRefusesWhenAllBusy(t *testing.T) {
	const max = 2
	s, _ := startServer(t, testLimits(max))
	release := make(chan struct{})
	var entered sync.WaitGroup
	entered.Add(max)
	s.mux.HandleFunc("GET /block", func(w http.ResponseWriter, _ *http.Request) {
		entered.Done()
		<-release
	})
	var done sync.WaitGroup
	for range max {
		done.Go(func() { _ = probe("http://" + s.Addr() + "/block") })
	}
	entered.Wait()
	if err := probe("http://" + s.Addr() + "/healthz"); err == nil {
		t.Error("a probe got in while every connection was busy")
	}
	if got := testutil.ToFloat64(s.ln.shed.WithLabelValues("full")); got < 1 {
		t.Errorf("shed full = %g, want ≥ 1", got)
	}
	close(release)
	done.Wait()
	testenv.Eventually(t, 10*time.Second, "probes get in again", func() bool {
		return probe("http://"+s.Addr()+"/healthz") == nil
	})
}

// TestHTTPTimeouts: a client that never finishes its headers, and an idle
// keep-alive connection, are closed by the server.
func TestHTTPTimeouts(t *testing.T) {
	lim := testLimits(64)
	lim.readHeader, lim.idle = 300*time.Millisecond, 300*time.Millisecond
	s, _ := startServer(t, lim)
	closedByServer := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := io.Copy(io.Discard, c) // returns at EOF: the server closed it
		return err == nil
	}
	slow, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	_, _ = io.WriteString(slow, "GET /healthz HTTP/1.1\r\nHost: x\r\n") // never ends
	if !closedByServer(slow) {
		t.Error("a connection stuck in its headers was not closed (read_header_timeout)")
	}
	if !closedByServer(idleConn(t, s.Addr())) {
		t.Error("an idle keep-alive connection was not closed (idle_timeout)")
	}
	// The daemon's limits are the named defaults, none of them off.
	d, err := listen("127.0.0.1:0", "", "", prometheus.NewRegistry(), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer d.ln.Close()
	if d.srv.ReadHeaderTimeout != httpReadHeaderTimeout || d.srv.ReadTimeout != httpReadTimeout ||
		d.srv.WriteTimeout != httpWriteTimeout || d.srv.IdleTimeout != httpIdleTimeout ||
		d.srv.MaxHeaderBytes != httpMaxHeaderBytes || d.ln.max != httpMaxConns {
		t.Errorf("daemon listener limits = %+v (max %d), want the named defaults", d.srv, d.ln.max)
	}
}

// slowSource answers its single key after a delay.
func slowSource(delay time.Duration) *sourcetest.Fake {
	f := sourcetest.New("up")
	f.Set("", []byte("v"))
	f.SetDelay(delay)
	return f
}

// TestAdminRefreshOutlastsHTTPTimeouts: an admin refresh may take longer than
// the listener's read and write timeouts (a family run is bounded by its
// interval); it still answers, while the timeouts hold for everything else.
func TestAdminRefreshOutlastsHTTPTimeouts(t *testing.T) {
	rd := testenv.Redis(t)
	cfg, err := config.Parse("t.yaml", []byte(`
sources: [{name: up, type: http, base_url: "http://127.0.0.1:1", timeout: 10s}]
keys: [{name: k, key: "`+rd.Prefix+`k", source: up, ttl: 1h, path: /k, load_timeout: 10s}]
`))
	if err != nil {
		t.Fatal(err)
	}
	w, err := warmer.New(warmer.Options{Store: &store.RedisStore{Client: rd.Client},
		Sources: map[string]warmer.Source{"up": slowSource(1500 * time.Millisecond)}, Specs: cfg.Specs()})
	if err != nil {
		t.Fatal(err)
	}
	lim := testLimits(64)
	lim.read, lim.write = 300*time.Millisecond, 300*time.Millisecond
	s, _ := startServer(t, lim)
	a := admin.New(admin.Options{Token: "tok", Warmer: w, Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop()})
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	s.mux.Handle("/admin/", a)
	req, _ := http.NewRequest("POST", "http://"+s.Addr()+"/admin/refresh?declaration=k", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("admin refresh slower than the write timeout: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"written": 1`) {
		t.Errorf("admin refresh: %d %s, want 200 written 1", resp.StatusCode, body)
	}
}

// TestDaemonExitsWhenListenerFails: the HTTP listener failing mid-run (here
// closed under the server) ends Run with the listener's error (which `hearth
// run` maps to exit 1) and says why, instead of running on without probes or
// metrics; the lease is still released.
func TestDaemonExitsWhenListenerFails(t *testing.T) {
	r := testenv.Redis(t)
	origin := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "v") })}
	oln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = origin.Serve(oln) }()
	defer origin.Close()
	addr := e2e.FreeAddr(t)
	path := filepath.Join(t.TempDir(), "hearth.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(`
redis: {addrs: [%q], namespace: %q}
http: {listen: %q}
log: {level: info, format: json}
sources: [{name: api, type: http, base_url: "http://%s", timeout: 1s}]
keys: [{name: page, key: "%spage", source: api, ttl: 1h, path: /p}]
`, r.Addr, e2e.Namespace(t, r.Client), addr, oln.Addr(), r.Prefix)), 0o600); err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		opened net.Listener
	)
	listenTCP = func(network, address string) (net.Listener, error) {
		ln, err := net.Listen(network, address)
		mu.Lock()
		opened = ln
		mu.Unlock()
		return ln, err
	}
	t.Cleanup(func() { listenTCP = net.Listen })

	out := &testenv.SyncBuffer{}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, Options{Logger: zerolog.New(out)})
	if err != nil {
		t.Fatal(err)
	}
	code := make(chan error, 1)
	go func() { code <- d.Run(context.Background()) }()
	e2e.WaitHTTP(t, "http://"+addr+"/readyz", http.StatusOK, 20*time.Second)
	mu.Lock()
	_ = opened.Close() // the listener fails under the server
	mu.Unlock()
	select {
	case err := <-code:
		if err == nil || !strings.Contains(err.Error(), "http server on "+addr+": ") || !strings.Contains(err.Error(), "use of closed network connection") {
			t.Errorf("Run = %v, want the listener's error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the daemon runs on with its listener gone:\n%s", out)
	}
	for _, want := range []string{`"message":"http server failed: probes and metrics are gone; shutting down"`,
		"use of closed network connection", `"message":"lease released"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestPprofOnlyWhenAsked: the runtime profiles are served under /debug/pprof/
// only with http.pprof; without it the path is not found.
func TestPprofOnlyWhenAsked(t *testing.T) {
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	off, _ := startServer(t, testLimits(8))
	if code, _ := get("http://" + off.Addr() + "/debug/pprof/heap?debug=1"); code != http.StatusNotFound {
		t.Fatalf("without http.pprof: /debug/pprof/heap answered %d, want 404", code)
	}
	on, _ := startServer(t, testLimits(8))
	on.servePprof()
	code, body := get("http://" + on.Addr() + "/debug/pprof/heap?debug=1")
	if code != http.StatusOK || !strings.Contains(body, "heap profile") {
		t.Fatalf("with http.pprof: /debug/pprof/heap answered %d: %.200s", code, body)
	}
	if code, body := get("http://" + on.Addr() + "/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Fatalf("with http.pprof: /debug/pprof/ answered %d: %.200s", code, body)
	}
}

// trickle sends a request's headers announcing a body of n bytes and one
// byte of it, and leaves the connection open.
func trickle(t *testing.T, addr string, n int) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "POST /admin/refresh HTTP/1.1\r\nHost: hearth\r\nContent-Length: %d\r\n\r\nx", n); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestTricklingBodiesAreShed: with every place taken by requests still
// sending their bodies, a probe gets in (the oldest trickler makes room);
// a body not sent within the body timeout is refused 408, one over the size
// bound 413 unread, and a small one reaches the handler. Before, a request
// waiting for its body was busy and could not be shed: the probe was refused.
func TestTricklingBodiesAreShed(t *testing.T) {
	const max = 4
	s, _ := startServer(t, testLimits(max))
	for range max {
		trickle(t, s.Addr(), 1000)
	}
	testenv.Eventually(t, 5*time.Second, "every place held by a trickling body", func() bool {
		s.ln.mu.Lock()
		defer s.ln.mu.Unlock()
		n := 0
		for c := s.ln.body.head; c != nil; c = c.next {
			n++
		}
		return n == max
	})
	for _, path := range []string{"/healthz", "/readyz"} {
		if err := probe("http://" + s.Addr() + path); err != nil {
			t.Fatalf("probe with %d trickling bodies: %v", max, err)
		}
	}
	if got := testutil.ToFloat64(s.ln.shed.WithLabelValues("body")); got < 1 {
		t.Errorf("shed body = %g, want ≥ 1", got)
	}

	lim := testLimits(64)
	lim.body = 200 * time.Millisecond
	s2, _ := startServer(t, lim)
	var got string
	s2.mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
	})
	answer := func(req string) (int, bool) {
		c, err := net.DialTimeout("tcp", s2.Addr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode, resp.Close
	}
	if code, conn := answer("POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\nabc"); code != http.StatusRequestTimeout || !conn {
		t.Errorf("trickled body: %d, close %v; want 408, close", code, conn)
	}
	if code, conn := answer("POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n"); code != http.StatusRequestEntityTooLarge || !conn {
		t.Errorf("body over the bound: %d, close %v; want 413, close", code, conn)
	}
	if code, _ := answer("POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"); code != http.StatusOK || got != "hello" {
		t.Errorf("small body: %d, handler read %q; want 200, hello", code, got)
	}
	for _, r := range []string{"slow", "too_large"} {
		if n := testutil.ToFloat64(s2.ln.bodies.WithLabelValues(r)); n != 1 {
			t.Errorf("bodies refused %s = %g, want 1", r, n)
		}
	}
}
