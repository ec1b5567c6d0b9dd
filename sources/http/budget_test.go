package http_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hearth-dev/hearth/sources/budget"
	httpsrc "github.com/hearth-dev/hearth/sources/http"
	"github.com/hearth-dev/hearth/warmer"
)

// TestBodiesTakeTheBudget: a body whose Content-Length is over the whole
// in-flight budget fails its member unread (too large); a chunked body longer
// than the budget fails once it passes it; a body within it loads, and a
// pointed value over max_value_bytes fails in the source. Other members of
// the batch load.
func TestBodiesTakeTheBudget(t *testing.T) {
	const max = 1 << 20
	big := `{"v":"` + strings.Repeat("a", 2*max) + `"}`
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/p/ok":
			_, _ = w.Write([]byte(`{"v":"fine"}`))
		case "/p/sized":
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			_, _ = w.Write([]byte(big))
		case "/p/chunked":
			for i := 0; i < len(big); i += 64 << 10 {
				_, _ = w.Write([]byte(big[i:min(i+64<<10, len(big))]))
				w.(http.Flusher).Flush()
			}
		case "/p/long": // within the budget, over max_value_bytes
			_, _ = w.Write([]byte(`{"v":"` + strings.Repeat("b", 1000) + `"}`))
		}
	}))
	t.Cleanup(up.Close)
	b := budget.New(max, prometheus.NewRegistry())
	src, err := httpsrc.New(httpsrc.Config{Name: "up", BaseURL: up.URL, Timeout: 5 * time.Second, Concurrency: 4, MaxBodyBytes: 8 * max, Budget: b})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	sp := spec(t, "p:{id}", "/p/{id}", "/v")
	sp.MaxValueBytes = 100
	res, err := src.Load(context.Background(), sp, []string{"ok", "sized", "chunked", "long"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]warmer.Result{}
	for _, r := range res {
		got[r.Member] = r
	}
	if r := got["ok"]; r.Err != nil || string(r.Value) != "fine" {
		t.Errorf("ok = %q, %v; want fine", r.Value, r.Err)
	}
	if r := got["sized"]; !errors.Is(r.Err, budget.ErrOverBudget) {
		t.Errorf("sized over the budget: err = %v, want ErrOverBudget", r.Err)
	}
	if r := got["chunked"]; !errors.Is(r.Err, warmer.ErrTooLarge) || !strings.Contains(r.Err.Error(), "refresh.max_inflight_bytes") {
		t.Errorf("chunked over the budget: err = %v, want too large, naming refresh.max_inflight_bytes", r.Err)
	}
	if r := got["long"]; !errors.Is(r.Err, warmer.ErrTooLarge) || !strings.Contains(r.Err.Error(), "max_value_bytes") {
		t.Errorf("pointed value over max_value_bytes: err = %v, want too large", r.Err)
	}
}
