package admin

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// panicky is an origin whose loader panics until told otherwise.
type panicky struct{ calm atomic.Bool }

func (p *panicky) Load(_ context.Context, _ *warmer.Spec, _ []string) ([]warmer.Result, error) {
	if !p.calm.Load() {
		panic("loader bug")
	}
	return []warmer.Result{{Member: "", Value: []byte("v")}}, nil
}

func (p *panicky) Ping(context.Context) error { return nil }

// TestAdminRefreshSurvivesPanic: a panicking loader must neither crash the
// daemon (singleflight re-panics in a goroutine of its own) nor leave the
// other waiters hanging, and the next refresh of the key must load again.
func TestAdminRefreshSurvivesPanic(t *testing.T) {
	rd := testenv.Redis(t)
	cfg, err := config.Parse("t.yaml", []byte(`
sources: [{name: up, type: http, base_url: "http://127.0.0.1:1", timeout: 1s}]
keys: [{name: k, key: "`+rd.Prefix+`k", source: up, ttl: 1h, path: /k}]
`))
	if err != nil {
		t.Fatal(err)
	}
	rdb := rd.Client
	src := &panicky{}
	w, err := warmer.New(warmer.Options{Store: &store.RedisStore{Client: rdb}, Sources: map[string]warmer.Source{"up": src}, Specs: cfg.Specs()})
	if err != nil {
		t.Fatal(err)
	}
	a := New(Options{Token: "tok", Warmer: w, Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop()})
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	refresh := func() (int, string) {
		req := httptest.NewRequest("POST", "/admin/refresh?declaration=k", nil)
		req.Header.Set("Authorization", "Bearer tok")
		rec := httptest.NewRecorder()
		a.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}

	var wg sync.WaitGroup
	for range 5 {
		wg.Go(func() {
			if code, body := refresh(); code != http.StatusBadGateway || !strings.Contains(body, "panic: loader bug") {
				t.Errorf("refresh with a panicking loader: %d %s, want 502 naming the panic", code, body)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("waiters hang after a panic in the loader")
	}
	src.calm.Store(true)
	if code, body := refresh(); code != http.StatusOK {
		t.Errorf("refresh after the panic: %d %s, want 200", code, body)
	}
}

// TestAdminReload: POST /admin/reload answers 503 until a reloader is
// attached or once it is closing, 200 with what changed (lists, never null),
// and 422 with each problem of a rejected file as `hearth validate` prints it.
func TestAdminReload(t *testing.T) {
	a := New(Options{Token: "tok", Warmer: nil, Registerer: prometheus.NewRegistry(), Logger: zerolog.Nop()})
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	reload := func() (int, string) {
		req := httptest.NewRequest("POST", "/admin/reload", nil)
		req.Header.Set("Authorization", "Bearer tok")
		rec := httptest.NewRecorder()
		a.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	if code, body := reload(); code != http.StatusServiceUnavailable {
		t.Errorf("before Attach: %d %s, want 503", code, body)
	}
	var res ReloadResult
	var err error
	a.Attach(nil, nil, func() (ReloadResult, error) { return res, err })

	res = ReloadResult{Added: []string{"c"}}
	if code, body := reload(); code != http.StatusOK || !strings.Contains(body, `"added": [
    "c"
  ]`) || !strings.Contains(body, `"removed": []`) || !strings.Contains(body, `"restart_required": []`) {
		t.Errorf("reload: %d %s, want 200 naming c added and empty lists", code, body)
	}

	_, err = config.Parse("hearth.yaml", []byte("keys:\n  - {name: p, ttl: sixty}\n  - {name: q, tll: 1s}\n"))
	if err == nil {
		t.Fatal("the invalid config parsed")
	}
	code, body := reload()
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, `"hearth.yaml:2: keys[p].ttl: invalid duration`) ||
		!strings.Contains(body, `"hearth.yaml:3: keys[q]: unknown field(s): tll"`) {
		t.Errorf("rejected reload: %d %s, want 422 naming file, line and field of each problem", code, body)
	}

	err = ErrClosed
	if code, body := reload(); code != http.StatusServiceUnavailable {
		t.Errorf("reload while closing: %d %s, want 503", code, body)
	}
}
