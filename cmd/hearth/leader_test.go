package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// Lease settings of the leader tests: short, so that handovers take about a
// second; the benchmark measures the defaults.
const (
	testLease = time.Second
	testRetry = 250 * time.Millisecond
)

// upstream is the HTTP origin of the leader tests. Every answer is a new
// value ("v17"); when held, the next request blocks until released and then
// answers "stale", which must never reach Redis once a newer leader wrote.
type upstream struct {
	*httptest.Server
	n       atomic.Int64
	mu      sync.Mutex
	hold    bool
	arrived chan struct{}
	release chan struct{}
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		held := u.hold
		u.hold = false
		arrived, release := u.arrived, u.release
		u.mu.Unlock()
		if held {
			close(arrived)
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			fmt.Fprint(w, "stale")
			return
		}
		fmt.Fprintf(w, "v%d", u.n.Add(1))
	}))
	t.Cleanup(u.Close)
	return u
}

// holdNext makes the next request block; arrived closes when it comes in.
func (u *upstream) holdNext() (arrived <-chan struct{}, release func()) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.hold = true
	u.arrived, u.release = make(chan struct{}), make(chan struct{})
	return u.arrived, sync.OnceFunc(func() { close(u.release) })
}

// setup is a config shared by the instances of one test.
type setup struct {
	redisAddr string
	client    *redis.Client
	ns        string
	keys      []string
	config    string
}

type timing struct {
	ttl, interval, loadTimeout, lease, retry time.Duration
}

var shortTiming = timing{ttl: 8 * time.Second, interval: 3 * time.Second, loadTimeout: time.Second, lease: testLease, retry: testRetry}

func newSetup(t *testing.T, redisAddr string, client *redis.Client, prefix string, up *upstream, tm timing) *setup {
	t.Helper()
	s := &setup{redisAddr: redisAddr, client: client, ns: e2e.Namespace(t, client)}
	s.keys = []string{prefix + "banner", prefix + "product:1", prefix + "product:2", prefix + "product:3"}
	cfg := fmt.Sprintf(`redis:
  addrs: [%q]
  namespace: %s
log:
  level: debug
  format: json
refresh:
  load_timeout: %s
  jitter: 0
  negative_ttl: 1s
  shutdown_timeout: 5s
leader:
  lease: %s
  retry_period: %s
sources:
  - name: up
    type: http
    base_url: %s
    timeout: %s
keys:
  - name: banner
    key: "%sbanner"
    source: up
    ttl: %s
    interval: %s
    path: /banner
  - name: product
    key: "%sproduct:{id}"
    source: up
    ttl: %s
    interval: %s
    members: ["1", "2", "3"]
    path: /product/{id}
`, redisAddr, s.ns, tm.loadTimeout, tm.lease, tm.retry, up.URL, tm.loadTimeout,
		prefix, tm.ttl, tm.interval, prefix, tm.ttl, tm.interval)
	s.config = filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(s.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// node is one running `hearth run`.
type node struct {
	name string
	proc *e2e.Proc
	url  string
}

func (s *setup) start(t *testing.T, name string) *node {
	t.Helper()
	addr := e2e.FreeAddr(t)
	n := &node{name: name, proc: e2e.Start(t, []string{"run", "--config", s.config, "--listen", addr}), url: "http://" + addr}
	n.proc.WaitHTTP(t, n.url+"/healthz", http.StatusOK, 30*time.Second)
	return n
}

func (n *node) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return e2e.Sum(e2e.Metrics(t, n.url+"/metrics"), name, labels...)
}

type health struct {
	Role        string `json:"role"`
	Epoch       int64  `json:"epoch"`
	Ready       bool   `json:"ready"`
	Instance    string `json:"instance"`
	Leader      string `json:"leader"`
	LeaderEpoch int64  `json:"leader_epoch"`
}

func (n *node) health(t *testing.T) health {
	t.Helper()
	resp, err := http.Get(n.url + "/healthz")
	if err != nil {
		t.Fatalf("%s /healthz: %v", n.name, err)
	}
	defer resp.Body.Close()
	var h health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatalf("%s /healthz: %v", n.name, err)
	}
	return h
}

func (n *node) status(t *testing.T, path string) int {
	t.Helper()
	resp, err := http.Get(n.url + path)
	if err != nil {
		t.Fatalf("%s %s: %v", n.name, path, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (n *node) written(t *testing.T) float64 { return n.metric(t, "hearth_keys_written_total") }

// leading waits until n is the ready leader.
func leading(t *testing.T, n *node, d time.Duration) {
	t.Helper()
	testenv.Eventually(t, d, n.name+" leads and is ready", func() bool { return n.status(t, "/readyz") == http.StatusOK })
}

// watch polls the declared keys every 10ms until stopped, and reports every
// key it found missing and every value it saw.
type watch struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	missing []string
	values  map[string]bool
	changed map[string]time.Time // first time each key's value changed after mark
	base    map[string]string
}

func (s *setup) watch() *watch {
	w := &watch{stop: make(chan struct{}), done: make(chan struct{}), values: map[string]bool{}}
	go func() {
		defer close(w.done)
		ctx := context.Background()
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			pipe := s.client.Pipeline()
			cmds := make([]*redis.StringCmd, len(s.keys))
			for i, k := range s.keys {
				cmds[i] = pipe.Get(ctx, k)
			}
			_, _ = pipe.Exec(ctx)
			now := time.Now()
			w.mu.Lock()
			for i, c := range cmds {
				v, err := c.Result()
				switch {
				case err == redis.Nil:
					w.missing = append(w.missing, fmt.Sprintf("%s at %s", s.keys[i], now.Format("15:04:05.000")))
				case err == nil:
					w.values[v] = true
					if w.base != nil && w.changed[s.keys[i]].IsZero() && v != w.base[s.keys[i]] {
						w.changed[s.keys[i]] = now
					}
				}
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// mark records the current values; firstChange then tells when any key first
// took another value.
func (w *watch) mark(t *testing.T, s *setup) {
	t.Helper()
	ctx := context.Background()
	base := map[string]string{}
	for _, k := range s.keys {
		base[k] = s.client.Get(ctx, k).Val()
	}
	w.mu.Lock()
	w.base, w.changed = base, map[string]time.Time{}
	w.mu.Unlock()
}

func (w *watch) firstChange() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	var first time.Time
	for _, c := range w.changed {
		if first.IsZero() || c.Before(first) {
			first = c
		}
	}
	return first
}

func (w *watch) finish() (missing []string, values map[string]bool) {
	close(w.stop)
	<-w.done
	return w.missing, w.values
}

func TestLeaderOneWriter(t *testing.T) {
	env := testenv.Redis(t)
	up := newUpstream(t)
	s := newSetup(t, env.Addr, env.Client, env.Prefix, up, shortTiming)
	a := s.start(t, "a")
	leading(t, a, 30*time.Second)
	b := s.start(t, "b")
	testenv.Eventually(t, 10*time.Second, "b stands by", func() bool { return b.health(t).Role == "standby" })

	// Two scheduled runs of every declaration after b joined.
	base := a.written(t)
	testenv.Eventually(t, 4*shortTiming.interval, "a keeps writing", func() bool { return a.written(t) >= base+2*float64(len(s.keys)) })

	t.Run("only the leader writes", func(t *testing.T) {
		if got := b.written(t); got != 0 {
			t.Errorf("standby wrote %g keys", got)
		}
		if got, want := a.metric(t, "hearth_leader"), 1.0; got != want {
			t.Errorf("a hearth_leader = %g, want %g", got, want)
		}
		if got, want := b.metric(t, "hearth_leader"), 0.0; got != want {
			t.Errorf("b hearth_leader = %g, want %g", got, want)
		}
	})
	t.Run("the writer marker is the leader's", func(t *testing.T) {
		ha := a.health(t)
		lease := env.Client.Get(context.Background(), s.ns+":{lease}").Val()
		if !strings.HasPrefix(lease, fmt.Sprintf("%d:%s/", ha.Epoch, ha.Instance)) {
			t.Errorf("lease %q is not a's (epoch %d, instance %s)", lease, ha.Epoch, ha.Instance)
		}
		if got, want := env.Client.Get(context.Background(), s.ns+":fence").Val(), fmt.Sprint(ha.Epoch); got != want {
			t.Errorf("fence = %s, want a's epoch %s", got, want)
		}
		if got := a.metric(t, "hearth_leader_epoch"); got != float64(ha.Epoch) {
			t.Errorf("hearth_leader_epoch = %g, want %d", got, ha.Epoch)
		}
	})
	t.Run("readyz picks the leader, healthz passes both", func(t *testing.T) {
		if got, want := a.status(t, "/readyz"), http.StatusOK; got != want {
			t.Errorf("a /readyz = %d, want %d", got, want)
		}
		if got, want := b.status(t, "/readyz"), http.StatusServiceUnavailable; got != want {
			t.Errorf("b /readyz = %d, want %d", got, want)
		}
		if got, want := b.status(t, "/healthz"), http.StatusOK; got != want {
			t.Errorf("b /healthz = %d, want %d", got, want)
		}
		if h := a.health(t); h.Role != "leader" || !h.Ready {
			t.Errorf("a /healthz = %+v, want a ready leader", h)
		}
	})
	t.Run("the standby says who leads", func(t *testing.T) {
		ha := a.health(t)
		var hb health
		testenv.Eventually(t, 10*time.Second, "b's /healthz names the leader", func() bool {
			hb = b.health(t)
			return hb.Leader != ""
		})
		if hb.Epoch != 0 || hb.Leader != ha.Instance || hb.LeaderEpoch != ha.Epoch {
			t.Errorf("b /healthz = %+v, want epoch 0 and leader %s at epoch %d", hb, ha.Instance, ha.Epoch)
		}
		resp, err := http.Get(b.url + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(raw), `"epoch":0`) {
			t.Errorf("b /healthz %s: no epoch field", raw)
		}
		want := fmt.Sprintf("standby: leader is %s (epoch %d)", ha.Instance, ha.Epoch)
		if !strings.Contains(b.proc.Output(), want) {
			t.Errorf("b's log lacks %q:\n%s", want, b.proc.Output())
		}
	})
}

func TestLeaderKilled(t *testing.T) {
	env := testenv.Redis(t)
	up := newUpstream(t)
	s := newSetup(t, env.Addr, env.Client, env.Prefix, up, shortTiming)
	a := s.start(t, "a")
	leading(t, a, 30*time.Second)
	b := s.start(t, "b")
	testenv.Eventually(t, 10*time.Second, "b stands by", func() bool { return b.health(t).Role == "standby" })

	w := s.watch()
	killed := time.Now()
	a.proc.Signal(t, syscall.SIGKILL)
	// a is dead and its lease still runs: the values change next by b's hand.
	w.mark(t, s)
	leading(t, b, 30*time.Second)
	testenv.Eventually(t, 5*time.Second, "b writes", func() bool { return !w.firstChange().IsZero() })
	took := w.firstChange().Sub(killed)
	// Watch a full TTL after the handover: a key the catch-up missed would
	// expire within it.
	testenv.Eventually(t, 2*shortTiming.ttl, "b refreshes on schedule", func() bool { return b.written(t) >= 3*float64(len(s.keys)) })
	missing, _ := w.finish()

	t.Logf("kill -9: first write by the standby %s after the kill (lease %s + retry %s)", took.Round(time.Millisecond), testLease, testRetry)
	// The lease lapses at most a lease after a's last renewal (before the
	// kill); b tries every retry period (±10%). The slack covers loading
	// and writing the values and this test's 10ms polling.
	if limit := testLease + testRetry*11/10 + 750*time.Millisecond; took > limit {
		t.Errorf("standby wrote %s after the kill, want within lease + retry period (+ slack) = %s", took, limit)
	}
	if len(missing) > 0 {
		t.Errorf("declared keys expired during the handover: %v", missing)
	}
	if h := b.health(t); h.Role != "leader" {
		t.Errorf("b role = %q after the kill", h.Role)
	}
}

func TestLeaderPausedIsFenced(t *testing.T) {
	env := testenv.Redis(t)
	up := newUpstream(t)
	// The pause below must not outlast the load timeout: the paused leader's
	// load has to complete and reach Redis for the fence to be tested.
	tm := timing{ttl: 22 * time.Second, interval: 2 * time.Second, loadTimeout: 8 * time.Second, lease: testLease, retry: testRetry}
	s := newSetup(t, env.Addr, env.Client, env.Prefix, up, tm)
	a := s.start(t, "a")
	leading(t, a, 30*time.Second)
	b := s.start(t, "b")
	testenv.Eventually(t, 10*time.Second, "b stands by", func() bool { return b.health(t).Role == "standby" })
	epochA := a.health(t).Epoch

	// Freeze a in the middle of a refresh: admitted by the in-memory gate,
	// its load in flight, its write not yet sent.
	arrived, release := up.holdNext()
	defer release()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("a did not refresh")
	}
	a.proc.Signal(t, syscall.SIGSTOP)
	paused := true
	defer func() {
		if paused {
			_ = a.proc.Cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	w := s.watch()

	// b takes over once a's lease lapses, and writes newer values.
	leading(t, b, 30*time.Second)
	if eb := b.health(t).Epoch; eb <= epochA {
		t.Fatalf("b's epoch %d is not above a's %d", eb, epochA)
	}
	testenv.Eventually(t, 10*time.Second, "b writes", func() bool { return b.written(t) >= float64(len(s.keys)) })

	// a wakes up and sends the write it was about to send.
	release()
	a.proc.Signal(t, syscall.SIGCONT)
	paused = false
	testenv.Eventually(t, 10*time.Second, "a's stale write is fenced", func() bool { return a.metric(t, "hearth_fenced_writes_total") > 0 })
	testenv.Eventually(t, 10*time.Second, "a stands by", func() bool { return a.health(t).Role == "standby" })
	// Another run of b's, then look at what Redis held throughout.
	base := b.written(t)
	testenv.Eventually(t, 3*tm.interval, "b keeps writing", func() bool { return b.written(t) > base })
	missing, values := w.finish()

	if values["stale"] {
		t.Error("the paused leader's stale value reached Redis")
	}
	for _, k := range s.keys {
		if v := env.Client.Get(context.Background(), k).Val(); v == "stale" || !strings.HasPrefix(v, "v") {
			t.Errorf("%s = %q, want the new leader's value", k, v)
		}
	}
	if len(missing) > 0 {
		t.Errorf("keys expired: %v", missing)
	}
	if got := a.metric(t, "hearth_leader"); got != 0 {
		t.Errorf("a hearth_leader = %g after being fenced", got)
	}
	if got := a.status(t, "/readyz"); got != http.StatusServiceUnavailable {
		t.Errorf("a /readyz = %d, want 503", got)
	}
	if got := b.metric(t, "hearth_fenced_writes_total"); got != 0 {
		t.Errorf("the new leader had %g writes fenced", got)
	}
}

func TestLeaderSIGTERMHandsOver(t *testing.T) {
	env := testenv.Redis(t)
	up := newUpstream(t)
	// A retry period far longer than the handover allowed: a standby that
	// only polled would miss it; the release announcement makes it.
	tm := shortTiming
	tm.retry = 900 * time.Millisecond
	// A takeover after a crash may wait 1s + 4 × 900ms × 1.2: the TTL leaves
	// room for it, or validation refuses the explicit retry period.
	tm.ttl = 12 * time.Second
	s := newSetup(t, env.Addr, env.Client, env.Prefix, up, tm)
	a := s.start(t, "a")
	leading(t, a, 30*time.Second)
	b := s.start(t, "b")
	testenv.Eventually(t, 10*time.Second, "b stands by", func() bool { return b.health(t).Role == "standby" })

	w := s.watch()
	stopped := time.Now()
	a.proc.Signal(t, syscall.SIGTERM)
	leading(t, b, 30*time.Second)
	took := time.Since(stopped)
	if code := a.proc.Wait(t, 15*time.Second); code != 0 {
		t.Errorf("a exited %d on SIGTERM, want 0", code)
	}
	missing, _ := w.finish()
	t.Logf("SIGTERM: standby ready %s after the signal (retry period %s)", took.Round(time.Millisecond), tm.retry)
	if limit := tm.retry + time.Second; took > limit {
		t.Errorf("standby led %s after SIGTERM, want within retry period + 1s = %s", took, limit)
	}
	if len(missing) > 0 {
		t.Errorf("keys expired: %v", missing)
	}
	if !strings.Contains(a.proc.Output(), "lease released") {
		t.Error("a did not log releasing the lease")
	}
}

func TestLeaderRedisRestart(t *testing.T) {
	srv := testenv.PrivateRedis(t)
	client := srv.Client(t)
	up := newUpstream(t)
	s := newSetup(t, srv.Addr, client, "", up, shortTiming)
	a := s.start(t, "a")
	leading(t, a, 30*time.Second)
	b := s.start(t, "b")
	testenv.Eventually(t, 10*time.Second, "b stands by", func() bool { return b.health(t).Role == "standby" })
	epoch := a.health(t).Epoch

	srv.Restart(t) // empty: no lease, no epoch, no fence, no values, no scripts

	// One of them leads again, under a newer epoch, and refills Redis.
	var leader, standby *node
	testenv.Eventually(t, 30*time.Second, "leadership re-established", func() bool {
		ra, rb := a.status(t, "/readyz") == http.StatusOK, b.status(t, "/readyz") == http.StatusOK
		switch {
		case ra && !rb:
			leader, standby = a, b
		case rb && !ra:
			leader, standby = b, a
		default:
			return false
		}
		return leader.health(t).Epoch > epoch
	})
	testenv.Eventually(t, 10*time.Second, "keys written again", func() bool {
		return client.Exists(context.Background(), s.keys...).Val() == int64(len(s.keys))
	})

	// Over two intervals, only the leader writes.
	before := standby.written(t)
	lb := leader.written(t)
	testenv.Eventually(t, 4*shortTiming.interval, "leader writes", func() bool { return leader.written(t) >= lb+2*float64(len(s.keys)) })
	if got := standby.written(t); got != before {
		t.Errorf("%s wrote %g keys as a standby", standby.name, got-before)
	}
	if standby.metric(t, "hearth_leader")+leader.metric(t, "hearth_leader") != 1 {
		t.Error("not exactly one leader")
	}
	if a.proc.Exited() || b.proc.Exited() {
		t.Error("an instance exited after the Redis restart")
	}
}
