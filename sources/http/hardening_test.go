package http_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	httpsrc "github.com/hearth-dev/hearth/sources/http"
	"github.com/hearth-dev/hearth/warmer"
)

// foreign is "another host": a server on a different port of 127.0.0.1 that
// records every request it receives and the X-Api-Key it was sent.
type foreign struct {
	*httptest.Server
	hits atomic.Int64
	mu   sync.Mutex
	keys []string
	refs []string
}

func newForeign(t *testing.T) *foreign {
	f := &foreign{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.hits.Add(1)
		f.mu.Lock()
		f.keys = append(f.keys, r.Header.Get("X-Api-Key"))
		f.refs = append(f.refs, r.Header.Get("Referer"))
		f.mu.Unlock()
		_, _ = w.Write([]byte(`{"v":"foreign"}`))
	}))
	t.Cleanup(f.Close)
	return f
}

// TestRedirects: same-host redirects are followed; another host is never asked
// under same-host (the default) or none, and with any it answers but never sees
// the configured header nor the base_url's query token (in a Referer).
func TestRedirects(t *testing.T) {
	far := newForeign(t)
	var (
		mu   sync.Mutex
		keys []string
	)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("X-Api-Key"))
		mu.Unlock()
		switch {
		case strings.HasPrefix(r.URL.Path, "/moved-"):
			http.Redirect(w, r, "/v/"+strings.TrimPrefix(r.URL.Path, "/moved-"), http.StatusFound)
		case strings.HasPrefix(r.URL.Path, "/away-"):
			http.Redirect(w, r, far.URL+"/steal", http.StatusFound)
		default:
			_, _ = fmt.Fprintf(w, `{"v":%q}`, r.URL.Path)
		}
	}))
	defer origin.Close()
	s := spec(t, "r:{id}", "/{id}", "/v")

	for _, tc := range []struct {
		policy       string
		sameFollowed bool
		awayLoads    bool
	}{
		{"", true, false},
		{"same-host", true, false},
		{"none", false, false},
		{"any", true, true},
	} {
		t.Run("policy="+tc.policy, func(t *testing.T) {
			before := far.hits.Load()
			reg := prometheus.NewRegistry()
			var logs bytes.Buffer
			src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: origin.URL + "?api_key=tok-s3cret", Timeout: 2 * time.Second,
				Headers: map[string]string{"X-Api-Key": "k-s3cret"}, Redirects: tc.policy,
				Metrics: httpsrc.NewMetrics(reg), Log: zerolog.New(zerolog.SyncWriter(&logs))})
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			rs, err := src.Load(context.Background(), s, []string{"moved-x", "away-y"})
			if err != nil {
				t.Fatal(err)
			}
			moved, away := rs[0], rs[1]
			if tc.sameFollowed {
				if moved.Err != nil || string(moved.Value) != "/v/x" {
					t.Errorf("same-host redirect: value %q err %v, want /v/x", moved.Value, moved.Err)
				}
			} else if !errors.Is(moved.Err, httpsrc.ErrRedirect) || !errors.Is(moved.Err, warmer.ErrOrigin) {
				t.Errorf("same-host redirect under none: err %v, want ErrRedirect (an origin error)", moved.Err)
			}
			refused := 0.0
			if !tc.sameFollowed {
				refused++
			}
			if tc.awayLoads {
				if away.Err != nil || string(away.Value) != "foreign" {
					t.Errorf("cross-host under any: value %q err %v", away.Value, away.Err)
				}
				if got := far.hits.Load() - before; got != 1 {
					t.Errorf("foreign host got %d requests, want 1", got)
				}
				far.mu.Lock()
				if k, ref := far.keys[len(far.keys)-1], far.refs[len(far.refs)-1]; k != "" || strings.Contains(ref, "s3cret") {
					t.Errorf("foreign host was sent X-Api-Key %q, Referer %q", k, ref)
				}
				far.mu.Unlock()
			} else {
				refused++
				if !errors.Is(away.Err, httpsrc.ErrRedirect) || away.Value != nil {
					t.Errorf("cross-host redirect: value %q err %v, want ErrRedirect and no value", away.Value, away.Err)
				}
				if got := far.hits.Load() - before; got != 0 {
					t.Errorf("foreign host got %d requests, want none", got)
				}
				if !strings.Contains(away.Err.Error(), strings.TrimPrefix(far.URL, "http://")) {
					t.Errorf("error %q does not name the target host", away.Err)
				}
				if !strings.Contains(logs.String(), `"to":"`+far.URL+`"`) {
					t.Errorf("refusal not logged with the target host:\n%s", logs.String())
				}
			}
			if err := testutil.GatherAndCompare(reg, strings.NewReader(redirectsRefused(refused)), "hearth_source_redirects_refused_total"); err != nil {
				t.Error(err)
			}
			for _, r := range rs {
				if r.Err != nil && strings.Contains(r.Err.Error(), "s3cret") {
					t.Errorf("error leaks a secret: %v", r.Err)
				}
			}
			if strings.Contains(logs.String(), "s3cret") {
				t.Errorf("log leaks a secret:\n%s", logs.String())
			}
			mu.Lock()
			for _, k := range keys {
				if k != "k-s3cret" {
					t.Errorf("the origin itself was sent X-Api-Key %q", k)
				}
			}
			mu.Unlock()
		})
	}
}

// TestPingRedirect: a health path that redirects elsewhere is an answer
// (reachable), and the other host is not asked.
func TestPingRedirect(t *testing.T) {
	far := newForeign(t)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, far.URL+"/login", http.StatusFound)
	}))
	defer origin.Close()
	src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: origin.URL, Timeout: 2 * time.Second, Headers: map[string]string{"X-Api-Key": "k"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Ping(context.Background()); err != nil {
		t.Fatalf("ping: %v", err)
	}
	if got := far.hits.Load(); got != 0 {
		t.Errorf("foreign host got %d requests from ping", got)
	}
}

func TestRedirectsPolicyRejected(t *testing.T) {
	if _, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: "http://127.0.0.1:1", Redirects: "follow"}); err == nil || !strings.Contains(err.Error(), `"follow"`) {
		t.Errorf("New with redirects: follow: err %v", err)
	}
}

// pathRecorder is a source "api" at an origin (base path /v1) that answers
// "ok" to everything; seen returns the escaped paths it was asked, so far.
func pathRecorder(t *testing.T) (src *httpsrc.Source, seen func() []string) {
	t.Helper()
	var (
		mu    sync.Mutex
		paths []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.EscapedPath())
		mu.Unlock()
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(srv.Close)
	src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: srv.URL + "/v1", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return src, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(paths)
	}
}

// TestDotMembers: members that are, or unescape to, "." or ".." fail alone as
// bad members and never reach the origin; the other members load.
func TestDotMembers(t *testing.T) {
	src, seen := pathRecorder(t)
	bad := []string{".", "..", "%2e", "%2E%2e", "%252e%252e", ".%2e"}
	good := []string{"a.b", "...", ".x", "x.."}
	rs, err := src.Load(context.Background(), spec(t, "item:{id}", "/items/{id}", ""), append(append([]string{}, bad...), good...))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs[:len(bad)] {
		if !errors.Is(r.Err, warmer.ErrBadMember) || !errors.Is(r.Err, httpsrc.ErrDotSegment) {
			t.Errorf("member %q: err %v, want ErrBadMember/ErrDotSegment", r.Member, r.Err)
		} else if !strings.Contains(r.Err.Error(), fmt.Sprintf("%q", r.Member)) {
			t.Errorf("member %q: error %q does not name it", r.Member, r.Err)
		}
	}
	for _, r := range rs[len(bad):] {
		if r.Err != nil || string(r.Value) != "ok" {
			t.Errorf("good member %q: %q %v", r.Member, r.Value, r.Err)
		}
	}
	if got := seen(); len(got) != len(good) {
		t.Errorf("origin saw %d requests %q, want %d (the good members only)", len(got), got, len(good))
	}
	// In the query string a dot is just a value.
	rs, err = src.Load(context.Background(), spec(t, "q:{id}", "/items?id={id}", ""), []string{".."})
	if err != nil || rs[0].Err != nil {
		t.Errorf("'..' in the query string: %v %v", err, rs[0].Err)
	}
}

// TestNormalizedMembers: a server or framework that applies Unicode
// compatibility normalization (NFKC) after decoding reads U+FF0E as '.',
// U+2025 as "..", U+FF0F as '/', and a lenient decoder reads the overlong
// %C0%AE as '.': each of these was sent with the configured headers, a
// traversal behind such a server. They are refused unsent, naming the
// member; look-alikes that normalize to neither (U+2215, a zero-width
// space) and other Unicode still load.
func TestNormalizedMembers(t *testing.T) {
	src, seen := pathRecorder(t)
	for _, tc := range []struct {
		member string
		want   error
	}{
		{"\uff0e\uff0e", httpsrc.ErrDotSegment},
		{"\uff0e", httpsrc.ErrDotSegment},
		{"\u2025", httpsrc.ErrDotSegment},
		{"\u2024\u2024", httpsrc.ErrDotSegment},
		{"%EF%BC%8E%EF%BC%8E", httpsrc.ErrDotSegment},
		{"\uff41\uff0f\uff42", httpsrc.ErrPathSeparator},
		{"a\uff3cb", httpsrc.ErrPathSeparator},
		{"%C0%AE%C0%AE", httpsrc.ErrInvalidUTF8},
		{"a%FFb", httpsrc.ErrInvalidUTF8},
		{"a\xffb", httpsrc.ErrInvalidUTF8},
	} {
		rs, err := src.Load(context.Background(), spec(t, "item:{id}", "/items/{id}", ""), []string{tc.member})
		if err != nil {
			t.Fatal(err)
		}
		if r := rs[0]; !errors.Is(r.Err, warmer.ErrBadMember) || !errors.Is(r.Err, tc.want) {
			t.Errorf("member %q: err %v, want ErrBadMember and %v", tc.member, r.Err, tc.want)
		} else if !strings.Contains(r.Err.Error(), fmt.Sprintf("%q", tc.member)) {
			t.Errorf("member %q: error %q does not name it", tc.member, r.Err)
		}
	}
	if got := seen(); len(got) != 0 {
		t.Errorf("origin saw %q, want no request", got)
	}
	good := []string{"a\u2215b", "a\u200bb", "caf\u00e9", "\u65e5\u672c", "%E2%82%AC"}
	rs, err := src.Load(context.Background(), spec(t, "item:{id}", "/items/{id}", ""), good)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Err != nil || string(r.Value) != "ok" {
			t.Errorf("good member %q: %q %v", r.Member, r.Value, r.Err)
		}
	}
}

// TestBaseURLQuery: the base_url's own query (a token) is kept on every request,
// before the template's.
func TestBaseURLQuery(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.URL.RawQuery)
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: srv.URL + "/v1?api_key=t0k", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Load(context.Background(), spec(t, "q:{id}", "/items?id={id}", ""), []string{"a&b"}); err != nil {
		t.Fatal(err)
	}
	if q, want := got.Load(), "api_key=t0k&id=a%26b"; q != want {
		t.Errorf("query = %q, want %q", q, want)
	}
}

// TestPingRedactsToken: a base_url query token and password never appear in a
// ping error, which still unwraps to its cause.
func TestPingRedactsToken(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	addr := srv.URL
	srv.Close() // nothing listens any more: the ping fails with a dial error
	for _, base := range []string{addr + "/v1?api_key=tok-s3cret-value", strings.Replace(addr, "http://", "http://u:pw-s3cret@", 1) + "/?k=s3cret",
		addr + "/v1?SECRETs3cretTOKEN", addr + "/v1?region=eu&SECRETs3cretTOKEN"} {
		src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: base, Timeout: time.Second, HealthPath: "/health"})
		if err != nil {
			t.Fatal(err)
		}
		err = src.Ping(context.Background())
		if err == nil {
			t.Fatal("ping of a closed server succeeded")
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ping error leaks a secret: %v", err)
		}
		if !strings.Contains(err.Error(), "xxxxx") {
			t.Errorf("ping error does not show the redacted URL: %v", err)
		}
		var oe interface{ Timeout() bool }
		if !errors.As(err, &oe) {
			t.Errorf("ping error %v no longer unwraps to the net error (%T)", err, err)
		}
	}
}

// redirectsRefused is the exposition of n refused redirects of source api.
func redirectsRefused(n float64) string {
	return fmt.Sprintf(`# HELP hearth_source_redirects_refused_total Redirects an HTTP source refused to follow (policy redirects: same-host or none); the member's old value is kept.
# TYPE hearth_source_redirects_refused_total counter
hearth_source_redirects_refused_total{source="api"} %g
`, n)
}
