package warmer_test

// Helpers shared by the warmer's tests against a scripted HTTP origin (the
// origin protection's own tests, in sources/protect, have their copy).

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	httpsrc "github.com/hearth-dev/hearth/sources/http"
	"github.com/hearth-dev/hearth/warmer"
)

// upstream is an HTTP origin whose answer per member the test scripts; it
// counts requests per member.
type upstream struct {
	*httptest.Server
	mu     sync.Mutex
	hits   map[string]int
	answer func(member string, n int) (int, string)
}

func newUpstream(t *testing.T, answer func(member string, n int) (int, string)) *upstream {
	t.Helper()
	u := &upstream{hits: map[string]int{}, answer: answer}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := strings.TrimPrefix(r.URL.Path, "/v/")
		u.mu.Lock()
		u.hits[m]++
		n := u.hits[m]
		u.mu.Unlock()
		code, body := u.answer(m, n)
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) count(m string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[m]
}

func (u *upstream) total() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, h := range u.hits {
		n += h
	}
	return n
}

func (u *upstream) source(t *testing.T, concurrency int) *httpsrc.Source {
	t.Helper()
	src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: u.URL, Timeout: 5 * time.Second, Concurrency: concurrency})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	return src
}

func guardSpec(t *testing.T, name, key, path string) *warmer.Spec {
	t.Helper()
	tp, err := warmer.ParseTemplate(key)
	if err != nil {
		t.Fatal(err)
	}
	return &warmer.Spec{Name: name, Template: tp, Source: "api", Path: path, TTL: 4 * time.Second,
		Interval: 2 * time.Second, LoadTimeout: time.Second, NegativeTTL: time.Second, MaxValueBytes: 1 << 20,
		NegativeValue: []byte{}, BatchSize: 100, MaxMembers: 1000}
}

// noLeaks fails the test if a goroutine started during it outlives its
// cleanups (servers, clients, sources): it runs after all of them.
func noLeaks(t *testing.T) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}
