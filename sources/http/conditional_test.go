package http_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	httpsrc "github.com/hearth-dev/hearth/sources/http"
)

// TestConditionalLoads: the second load of a member sends the validators of
// the first answer; a 304 returns the remembered value without a body; a
// changed value arrives whole; a 404 forgets the validators.
func TestConditionalLoads(t *testing.T) {
	var (
		mu      sync.Mutex
		body    = `{"v":1}`
		etag    = `"v1"`
		gone    bool
		gotINM  []string
		gotIMS  []string
		bodies  int
		lastMod = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		gotINM = append(gotINM, r.Header.Get("If-None-Match"))
		gotIMS = append(gotIMS, r.Header.Get("If-Modified-Since"))
		if gone {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("ETag", etag)
		w.Header().Set("Last-Modified", lastMod.Format(http.TimeFormat))
		bodies++
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	reg := prometheus.NewRegistry()
	src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: srv.URL, Timeout: 2 * time.Second, Metrics: httpsrc.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	s := spec(t, "item:{id}", "/items/{id}", "")
	load := func() string {
		t.Helper()
		rs, err := src.Load(context.Background(), s, []string{"1"})
		if err != nil || len(rs) != 1 {
			t.Fatalf("Load: %v %v", rs, err)
		}
		if rs[0].Err != nil {
			t.Fatalf("Load: %v", rs[0].Err)
		}
		if rs[0].Missing {
			return "<missing>"
		}
		return string(rs[0].Value)
	}
	if got := load(); got != `{"v":1}` {
		t.Fatalf("first load %q", got)
	}
	if got := load(); got != `{"v":1}` {
		t.Fatalf("304 load %q, want the remembered value", got)
	}
	mu.Lock()
	if gotINM[1] != `"v1"` || gotIMS[1] != lastMod.Format(http.TimeFormat) {
		t.Errorf("second request sent If-None-Match %q, If-Modified-Since %q", gotINM[1], gotIMS[1])
	}
	if bodies != 1 {
		t.Errorf("bodies sent %d, want 1", bodies)
	}
	body, etag = `{"v":2}`, `"v2"`
	mu.Unlock()
	if got := counterSum(t, reg, "hearth_source_not_modified_total"); got != 1 {
		t.Errorf("not modified = %v, want 1", got)
	}
	if got := load(); got != `{"v":2}` {
		t.Fatalf("changed load %q", got)
	}
	mu.Lock()
	gone = true
	mu.Unlock()
	if got := load(); got != "<missing>" {
		t.Fatalf("gone load %q", got)
	}
	mu.Lock()
	gone = false
	mu.Unlock()
	load()
	mu.Lock()
	defer mu.Unlock()
	if last := gotINM[len(gotINM)-1]; last != "" {
		t.Errorf("after a 404 the request still sent If-None-Match %q", last)
	}
}

func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
