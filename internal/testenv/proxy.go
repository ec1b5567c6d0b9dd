package testenv

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Proxy is a fault-injecting TCP proxy in front of one upstream address, run
// in process with Toxiproxy. Its methods must be called from the test's
// goroutine.
type Proxy struct {
	// Addr is the listen address, 127.0.0.1:port; it stays the same after
	// [Proxy.Cut] and [Proxy.Restore].
	Addr string

	mu       sync.Mutex
	tp       *toxiproxy.Proxy
	cut      bool
	latency  bool
	blackout bool
}

// Names of the toxics this package adds, one per direction.
const (
	latencyToxic   = "hearth_latency"
	timeoutToxic   = "hearth_timeout"
	bandwidthToxic = "hearth_bandwidth"
	resetToxic     = "hearth_reset"
	replyToxic     = "hearth_reply_latency"
)

var streams = []string{"upstream", "downstream"}

// NewProxy starts a proxy on a free port of 127.0.0.1 forwarding to upstream
// (host:port). It is closed at cleanup.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	// Some toxics (bandwidth) log at trace level to zerolog's global logger,
	// which nothing here can hand a quiet one: trace goes, the rest stays.
	if zerolog.GlobalLevel() < zerolog.DebugLevel {
		zerolog.SetGlobalLevel(zerolog.DebugLevel)
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			lastErr = err
			break
		}
		listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		tp := toxiproxy.NewProxy(srv, "hearth-"+randomHex(4), listen, upstream)
		if err := tp.Start(); err != nil {
			lastErr = err
			continue
		}
		p := &Proxy{Addr: listen, tp: tp}
		t.Cleanup(tp.Stop)
		return p
	}
	t.Fatalf("testenv: starting proxy to %s: %v", upstream, lastErr)
	return nil
}

// quietCtx is a context whose zerolog logger discards Toxiproxy's logs.
func quietCtx() context.Context {
	return zerolog.Nop().WithContext(context.Background())
}

// addToxics adds a toxic named name_<stream> of type typ in both directions.
func (p *Proxy) addToxics(name, typ, attrs string) error {
	return p.addToxicsOn(streams, name, typ, attrs)
}

// addToxicsOn adds a toxic named name_<stream> of type typ on each of sts.
func (p *Proxy) addToxicsOn(sts []string, name, typ, attrs string) error {
	for _, st := range sts {
		js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`,
			name+"_"+st, typ, st, attrs)
		if _, err := p.tp.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			return fmt.Errorf("add %s toxic: %w", typ, err)
		}
	}
	return nil
}

func (p *Proxy) removeToxics(name string) error {
	for _, st := range streams {
		if err := p.tp.Toxics.RemoveToxic(quietCtx(), name+"_"+st); err != nil {
			return fmt.Errorf("remove toxic %s_%s: %w", name, st, err)
		}
	}
	return nil
}

// SetLatency delays the data in each direction by d (rounded up to whole
// milliseconds), so a request-response round trip takes at least 2*d longer.
// It applies to current and new connections; d <= 0 removes the latency.
func (p *Proxy) SetLatency(t testing.TB, d time.Duration) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	// Toxics are replaced rather than updated: Toxiproxy's update writes the
	// attributes that running connections read, which is a data race.
	if p.latency {
		if err := p.removeToxics(latencyToxic); err != nil {
			t.Fatalf("testenv: proxy %s: %v", p.Addr, err)
		}
		p.latency = false
	}
	if d <= 0 {
		return
	}
	ms := int64((d + time.Millisecond - 1) / time.Millisecond)
	if err := p.addToxics(latencyToxic, "latency", fmt.Sprintf(`{"latency":%d}`, ms)); err != nil {
		t.Fatalf("testenv: proxy %s: %v", p.Addr, err)
	}
	p.latency = true
}

// SetBandwidth limits the data in each direction to kbps kilobytes a second
// (Toxiproxy's bandwidth toxic), on current and new connections, until
// [Proxy.Restore]. Setting it again replaces the limit.
func (p *Proxy) SetBandwidth(t testing.TB, kbps int64) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.replaceLocked(t, bandwidthToxic, streams, "bandwidth", fmt.Sprintf(`{"rate":%d}`, max(kbps, 1)))
}

// SetReplyLatency delays only the data coming back from the upstream by d
// (rounded up to whole milliseconds): requests arrive on time, their replies
// late. It applies to current and new connections until [Proxy.Restore];
// setting it again replaces it.
func (p *Proxy) SetReplyLatency(t testing.TB, d time.Duration) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	ms := int64((d + time.Millisecond - 1) / time.Millisecond)
	p.replaceLocked(t, replyToxic, []string{"downstream"}, "latency", fmt.Sprintf(`{"latency":%d}`, ms))
}

// ResetPeers resets (TCP RST) every connection as soon as it sends data,
// current and new ones, until [Proxy.Restore]: a connection is accepted, and
// its first request is answered with a reset.
func (p *Proxy) ResetPeers(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.replaceLocked(t, resetToxic, []string{"upstream"}, "reset_peer", `{"timeout":0}`)
}

// replaceLocked removes the toxic name on sts if it is there and adds it anew
// with attrs (replaced rather than updated, see SetLatency).
func (p *Proxy) replaceLocked(t testing.TB, name string, sts []string, typ, attrs string) {
	t.Helper()
	if err := p.startLocked(); err != nil {
		t.Fatalf("testenv: proxy %s: %v", p.Addr, err)
	}
	for _, st := range sts {
		_ = p.tp.Toxics.RemoveToxic(quietCtx(), name+"_"+st) // absent the first time
	}
	if err := p.addToxicsOn(sts, name, typ, attrs); err != nil {
		t.Fatalf("testenv: proxy %s: %v", p.Addr, err)
	}
}

// Cut closes all current connections and stops listening, so that new
// connections are refused, until [Proxy.Restore].
func (p *Proxy) Cut(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tp.Stop()
	p.cut = true
}

// Timeout turns the proxy into a black hole: connections are accepted (and
// current ones kept open) but no data is delivered in either direction until
// [Proxy.Restore], which closes the connections that were black-holed.
func (p *Proxy) Timeout(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.startLocked(); err != nil {
		t.Fatalf("testenv: proxy %s: %v", p.Addr, err)
	}
	if p.blackout {
		return
	}
	if err := p.addToxics(timeoutToxic, "timeout", `{"timeout":0}`); err != nil {
		t.Fatalf("testenv: proxy %s: %v", p.Addr, err)
	}
	p.blackout = true
}

// Restore removes all faults: latency, bandwidth, resets, cut and black hole.
func (p *Proxy) Restore(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tp.Toxics.ResetToxics(quietCtx())
	p.latency, p.blackout = false, false
	if err := p.startLocked(); err != nil {
		t.Fatalf("testenv: proxy %s: %v", p.Addr, err)
	}
}

// startLocked listens again after a cut, on the same address.
func (p *Proxy) startLocked() error {
	if !p.cut {
		return nil
	}
	if err := p.tp.Start(); err != nil {
		return fmt.Errorf("listen again on %s: %w", p.Addr, err)
	}
	p.cut = false
	return nil
}
