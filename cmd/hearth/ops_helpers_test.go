package main_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// opsRedis is the shared Redis (or testenv's fallback) with a key prefix of the
// test's own, and a redis.namespace of its own for Hearth's keys.
type opsRedis struct {
	*redis.Client
	Addr      string
	Prefix    string
	Namespace string
}

func sharedRedis(t *testing.T) *opsRedis {
	t.Helper()
	env := testenv.Redis(t)
	return &opsRedis{Client: env.Client, Addr: env.Addr, Prefix: env.Prefix, Namespace: e2e.Namespace(t, env.Client)}
}

// origin is an HTTP upstream that counts calls per path and can hold the calls
// to one path until released.
type origin struct {
	*httptest.Server
	mu    sync.Mutex
	calls map[string]int
	hold  string
	gate  chan struct{}
}

func newOrigin(t *testing.T) *origin {
	t.Helper()
	o := &origin{calls: map[string]int{}}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.calls[r.URL.Path]++
		gate := o.gate
		held := gate != nil && r.URL.Path == o.hold
		o.mu.Unlock()
		if held {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintf(w, "value of %s", r.URL.Path)
	}))
	t.Cleanup(o.Close)
	return o
}

func (o *origin) count(path string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.calls[path]
}

// holdPath makes calls to path wait until the returned release is called.
func (o *origin) holdPath(path string) (release func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.hold, o.gate = path, make(chan struct{})
	gate := o.gate
	var once sync.Once
	return func() {
		once.Do(func() {
			close(gate)
			o.mu.Lock()
			o.gate = nil
			o.mu.Unlock()
		})
	}
}

// daemon is a running `hearth run`.
type daemon struct {
	*e2e.Proc
	URL    string
	Config string
}

// startDaemon writes the config into a directory of its own and runs hearth on
// it until /readyz answers 200.
func startDaemon(t *testing.T, config string, env ...string) *daemon {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	return startDaemonPath(t, path, env...)
}

// startDaemonPath runs hearth on the config file at path until /readyz answers 200.
func startDaemonPath(t *testing.T, path string, env ...string) *daemon {
	t.Helper()
	addr := e2e.FreeAddr(t)
	p := e2e.Start(t, []string{"run", "--config", path, "--listen", addr}, env...)
	d := &daemon{Proc: p, URL: "http://" + addr, Config: path}
	eventually(t, 30*time.Second, "hearth ready", func() bool {
		if p.Exited() {
			t.Fatalf("hearth exited before it was ready:\n%s", p.Output())
		}
		resp, err := http.Get(d.URL + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return d
}

// call makes one request and returns the status and the body.
func call(t *testing.T, method, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// eventually polls cond until it holds or fails the test after d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metric sums a metric's series on the daemon's /metrics.
func (d *daemon) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return e2e.Sum(e2e.Metrics(t, d.URL+"/metrics"), name, labels...)
}
