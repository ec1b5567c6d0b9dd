package warmer_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/origintest"
	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	httpsrc "github.com/hearth-dev/hearth/sources/http"
	"github.com/hearth-dev/hearth/sources/protect"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// TestBreakerProbeRecovers cuts the connection to a real HTTP origin (the
// testenv proxy refuses connections) until the breaker opens, then restores
// it. The breaker's open_for is an hour and nothing calls Refresh after the
// origin is back: only the probe can bring the values back. A separate client
// sees them fresh (the origin's new answer) while the breaker would still be
// open, and the stale declaration was refreshed, the healthy one not.
func TestBreakerProbeRecovers(t *testing.T) {
	origintest.NoLeaks(t)
	rd := testenv.Redis(t)
	ctx := context.Background()
	var version atomic.Value
	version.Store("v1")
	u := origintest.New(t, func(m string, _ int) (int, string) {
		return http.StatusOK, m + "@" + version.Load().(string)
	})
	proxy := testenv.NewProxy(t, strings.TrimPrefix(u.URL, "http://"))
	src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: "http://" + proxy.Addr, Timeout: time.Second, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	greg := prometheus.NewRegistry()
	guard := protect.Guard(src, protect.GuardConfig{Name: "api", BreakerFailures: 2, BreakerOpenFor: time.Hour,
		ProbeInterval: 100 * time.Millisecond, Metrics: protect.NewGuardMetrics(greg), Logger: zerolog.Nop()})
	t.Cleanup(guard.(interface{ Close() }).Close)

	s := origintest.Spec(t, "p", rd.Prefix+"p:{id}", "/v/{id}")
	s.Members, s.MaxStale, s.TTL = []string{"a", "b"}, time.Hour, time.Hour
	w, err := warmer.New(warmer.Options{Store: &store.RedisStore{Client: rd.Client}, Sources: map[string]warmer.Source{"api": guard},
		Specs: []*warmer.Spec{s}, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Refresh(ctx, "p", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := get(t, rd.Client, rd.Prefix+"p:a"); got != "a@v1" {
		t.Fatalf("p:a = %q before the outage", got)
	}

	proxy.Cut(t)
	version.Store("v2")
	for i := 0; promtest.Sum(t, greg, "hearth_origin_breaker_state", "source", "api") != 2; i++ {
		if i == 10 {
			t.Fatal("breaker not open after 10 refreshes through a cut connection")
		}
		if _, err := w.Refresh(ctx, "p", warmer.RunOptions{}); err == nil {
			t.Fatal("refresh through a cut connection succeeded")
		}
	}
	if got, _ := get(t, rd.Client, rd.Prefix+"p:a"); got != "a@v1" {
		t.Fatalf("p:a = %q during the outage, want the stale a@v1 kept", got)
	}
	if _, err := w.Refresh(ctx, "p", warmer.RunOptions{}); !errors.Is(err, warmer.ErrBreakerOpen) {
		t.Fatalf("refresh with the breaker open: %v, want ErrBreakerOpen", err)
	}

	proxy.Restore(t)
	testenv.Eventually(t, 30*time.Second, "values fresh again after the origin returned", func() bool {
		a, _ := get(t, rd.Client, rd.Prefix+"p:a")
		b, _ := get(t, rd.Client, rd.Prefix+"p:b")
		return a == "a@v2" && b == "b@v2"
	})
	if got := promtest.Sum(t, greg, "hearth_origin_probes_total", "source", "api", "result", "ok"); got != 1 {
		t.Errorf("hearth_origin_probes_total{result=ok} = %g, want 1", got)
	}
	if got := promtest.Sum(t, greg, "hearth_origin_breaker_state", "source", "api"); got != 0 {
		t.Errorf("breaker state %g after the probe, want 0 (closed)", got)
	}
	if n := w.RefreshFailing(ctx, "api"); n != 0 {
		t.Errorf("RefreshFailing after the recovery refreshed %d declarations, want 0 (none failing)", n)
	}
}

// TestBreakerProbeFalseRecovery: an origin that answers its health check but
// fails every load. A probe closes the breaker half-open style: the first
// failed load re-opens it (not breaker.failures of them), and the next probe
// waits twice as long, so the origin sees about one load per probe, not a
// refresh's worth.
func TestBreakerProbeFalseRecovery(t *testing.T) {
	origintest.NoLeaks(t)
	rd := testenv.Redis(t)
	ctx := context.Background()
	u := origintest.New(t, func(m string, _ int) (int, string) {
		if m == "" || m == "/" {
			return http.StatusOK, "healthy"
		}
		return http.StatusServiceUnavailable, "down"
	})
	greg := prometheus.NewRegistry()
	guard := protect.Guard(u.Source(t, 2), protect.GuardConfig{Name: "api", BreakerFailures: 3, BreakerOpenFor: time.Hour,
		ProbeInterval: 100 * time.Millisecond, Metrics: protect.NewGuardMetrics(greg), Logger: zerolog.Nop()})
	t.Cleanup(guard.(interface{ Close() }).Close)
	s := origintest.Spec(t, "p", rd.Prefix+"p:{id}", "/v/{id}")
	s.Members = []string{"a"}
	w, err := warmer.New(warmer.Options{Store: &store.RedisStore{Client: rd.Client}, Sources: map[string]warmer.Source{"api": guard},
		Specs: []*warmer.Spec{s}, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, _ = w.Refresh(ctx, "p", warmer.RunOptions{})
	}
	if got := promtest.Sum(t, greg, "hearth_origin_breaker_state", "source", "api"); got != 2 {
		t.Fatalf("breaker state %g after 3 failed loads, want 2 (open)", got)
	}
	before := u.Count("a")
	// Each probe answers; its recovery refresh fails once and re-opens it.
	testenv.Eventually(t, 30*time.Second, "two probe recoveries", func() bool {
		return promtest.Sum(t, greg, "hearth_origin_probes_total", "source", "api", "result", "ok") >= 2
	})
	testenv.Eventually(t, 10*time.Second, "breaker open again", func() bool {
		return promtest.Sum(t, greg, "hearth_origin_breaker_state", "source", "api") == 2
	})
	probes := promtest.Sum(t, greg, "hearth_origin_probes_total", "source", "api", "result", "ok")
	loads := u.Count("a") - before
	if float64(loads) > probes {
		t.Errorf("%d loads of a for %g probe recoveries: a false recovery must re-open after one failed call", loads, probes)
	}
}
