// Package origintest is a scripted HTTP origin for tests of the HTTP source,
// its protection and the warmer: the test decides each member's answer, and
// the origin counts requests per member and the most it had in flight.
package origintest

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hearth-dev/hearth/keytmpl"
	httpsrc "github.com/hearth-dev/hearth/sources/http"
	"github.com/hearth-dev/hearth/warmer"
)

// Upstream answers GET /v/<member> with what Answer returns for the member
// and its request count n (1 for the first request).
type Upstream struct {
	*httptest.Server
	mu      sync.Mutex
	hits    map[string]int
	answer  func(member string, n int) (int, string)
	delay   time.Duration
	running int
	peak    int
	// etags: answers carry an ETag of their body, and a request whose
	// If-None-Match names the body it would get is answered 304.
	etags       bool
	notModified int
}

// New starts an origin, closed when the test ends.
func New(t testing.TB, answer func(member string, n int) (code int, body string)) *Upstream {
	t.Helper()
	u := &Upstream{hits: map[string]int{}, answer: answer}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := strings.TrimPrefix(r.URL.Path, "/v/")
		u.mu.Lock()
		u.hits[m]++
		n := u.hits[m]
		u.running++
		u.peak = max(u.peak, u.running)
		delay := u.delay
		u.mu.Unlock()
		defer func() {
			u.mu.Lock()
			u.running--
			u.mu.Unlock()
		}()
		if delay > 0 {
			select {
			case <-time.After(delay):
			case <-r.Context().Done():
				return
			}
		}
		code, body := u.answer(m, n)
		if u.conditional() && code == http.StatusOK {
			sum := sha256.Sum256([]byte(body))
			etag := `"` + hex.EncodeToString(sum[:8]) + `"`
			w.Header().Set("ETag", etag)
			if r.Header.Get("If-None-Match") == etag {
				u.mu.Lock()
				u.notModified++
				u.mu.Unlock()
				w.WriteHeader(http.StatusNotModified)
				return
			}
		}
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(u.Close)
	return u
}

// SetETags makes the origin conditional from now on: every 200 answer has an
// ETag of its body, and a request whose If-None-Match is the ETag of the body
// it would get is answered 304 Not Modified, without a body.
func (u *Upstream) SetETags(on bool) {
	u.mu.Lock()
	u.etags = on
	u.mu.Unlock()
}

func (u *Upstream) conditional() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.etags
}

// NotModified is how many requests the origin answered 304.
func (u *Upstream) NotModified() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.notModified
}

// Count is how many requests member had.
func (u *Upstream) Count(member string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[member]
}

// Hits is a copy of the requests per member (by the path after /v/).
func (u *Upstream) Hits() map[string]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return maps.Clone(u.hits)
}

// Total is how many requests the origin had.
func (u *Upstream) Total() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, h := range u.hits {
		n += h
	}
	return n
}

// Peak is the most requests the origin had in flight at once.
func (u *Upstream) Peak() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.peak
}

// SetDelay holds every answer from now on for d (cut short when the client gives up).
func (u *Upstream) SetDelay(d time.Duration) {
	u.mu.Lock()
	u.delay = d
	u.mu.Unlock()
}

// Source is an HTTP source named "api" on the origin, closed when the test ends.
func (u *Upstream) Source(t testing.TB, concurrency int) *httpsrc.Source {
	t.Helper()
	src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: u.URL, Timeout: 5 * time.Second, Concurrency: concurrency})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	return src
}

// Spec is a declaration on source "api": key template key, request path
// path, TTL 4 s, interval 2 s, load timeout 1 s, batches of 100.
func Spec(t testing.TB, name, key, path string) *warmer.Spec {
	t.Helper()
	tp, err := keytmpl.Parse(key)
	if err != nil {
		t.Fatal(err)
	}
	return &warmer.Spec{Name: name, Template: tp, Source: "api", Path: path, TTL: 4 * time.Second,
		Interval: 2 * time.Second, LoadTimeout: time.Second, NegativeTTL: time.Second, MaxValueBytes: 1 << 20,
		NegativeValue: []byte{}, BatchSize: 100, MaxMembers: 1000}
}

// NoLeaks fails the test if a goroutine started during it outlives its
// cleanups (servers, clients, sources): it runs after all of them.
func NoLeaks(t testing.TB) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}
