package bench

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// handoverTrials is how many handovers of each kind one benchmark run makes.
const handoverTrials = 5

// BenchmarkHandover measures how long the keys go without a writer when the
// leader dies (kill -9) or stops (SIGTERM), with the default lease settings
// (lease 5s, renew every lease/3, retry period 1s), and counts hot keys that
// expired meanwhile, polling Redis every 10ms. Each trial kills the leader of
// the previous one; a fresh standby joins every time.
func BenchmarkHandover(b *testing.B) {
	env := testenv.Redis(b)
	h := newHandover(b, env.Addr, env.Client, env.Prefix)
	for range b.N {
		kill := h.trials(b, syscall.SIGKILL)
		term := h.trials(b, syscall.SIGTERM)
		report(b, "kill -9", kill)
		report(b, "SIGTERM", term)
	}
}

type trial struct {
	took     time.Duration // signal to the new leader's first write
	expiries int           // declared keys found missing during the trial
}

func report(b *testing.B, kind string, ts []trial) {
	durs := make([]time.Duration, len(ts))
	var each, exp []string
	expired := 0
	for i, t := range ts {
		durs[i] = t.took
		expired += t.expiries
		each = append(each, t.took.Round(time.Millisecond).String())
		exp = append(exp, fmt.Sprint(t.expiries))
	}
	slices.Sort(durs)
	med, mx := durs[len(durs)/2], durs[len(durs)-1]
	b.Logf("%s: %d trials, new leader's first write after %s; hot keys expired per trial: %s",
		kind, len(ts), strings.Join(each, " "), strings.Join(exp, " "))
	b.Logf("%s handover: median %s, max %s, hot-key expiries %d", kind, med.Round(time.Millisecond), mx.Round(time.Millisecond), expired)
	unit := map[string]string{"kill -9": "kill9", "SIGTERM": "sigterm"}[kind]
	b.ReportMetric(med.Seconds(), unit+"-median-s")
	b.ReportMetric(mx.Seconds(), unit+"-max-s")
	b.ReportMetric(float64(expired), unit+"-expiries")
}

type handover struct {
	client *redis.Client
	config string
	keys   []string
	leader *node
	n      int
}

type node struct {
	proc *e2e.Proc
	url  string
}

func newHandover(b *testing.B, addr string, client *redis.Client, prefix string) *handover {
	var n atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "v%d", n.Add(1))
	}))
	b.Cleanup(up.Close)
	ns := e2e.Namespace(b, client)
	// No leader section: the default lease settings. TTL 16s, interval 8s,
	// load timeout 1s leave a 7s refresh margin: a handover slower than the
	// lease + retry period (6s) would soon show as expired keys.
	cfg := fmt.Sprintf(`redis:
  addrs: [%q]
  namespace: %s
log:
  format: json
refresh:
  load_timeout: 1s
  jitter: 0
  negative_ttl: 1s
sources:
  - name: up
    type: http
    base_url: %s
    timeout: 1s
keys:
  - name: banner
    key: "%[4]sbanner"
    source: up
    ttl: 16s
    path: /banner
  - name: product
    key: "%[4]sproduct:{id}"
    source: up
    ttl: 16s
    members: ["1", "2", "3"]
    path: /product/{id}
`, addr, ns, up.URL, prefix)
	h := &handover{client: client, config: filepath.Join(b.TempDir(), "config.yaml")}
	h.keys = []string{prefix + "banner", prefix + "product:1", prefix + "product:2", prefix + "product:3"}
	if err := os.WriteFile(h.config, []byte(cfg), 0o600); err != nil {
		b.Fatal(err)
	}
	h.leader = h.start(b)
	h.wait(b, h.leader, "/readyz", time.Minute)
	for _, line := range strings.Split(h.leader.proc.Output(), "\n") {
		if strings.Contains(line, "leader election enabled") {
			b.Logf("settings: %s", line)
		}
	}
	return h
}

func (h *handover) start(b *testing.B) *node {
	addr := e2e.FreeAddr(b)
	n := &node{proc: e2e.Start(b, []string{"run", "--config", h.config, "--listen", addr}), url: "http://" + addr}
	h.wait(b, n, "/healthz", time.Minute)
	return n
}

func (h *handover) wait(b *testing.B, n *node, path string, d time.Duration) {
	e2e.WaitHTTP(b, n.url+path, http.StatusOK, d)
}

// trials runs handoverTrials handovers by sig.
func (h *handover) trials(b *testing.B, sig syscall.Signal) []trial {
	var out []trial
	for range handoverTrials {
		standby := h.start(b)
		// Let the standby campaign once, then signal at a random point of
		// the leader's renew cycle.
		time.Sleep(time.Second + mrand.N(2*time.Second))
		w := h.watch()
		signalled := time.Now()
		h.leader.proc.Signal(b, sig)
		first := standby.firstWrite(b, 30*time.Second)
		h.wait(b, standby, "/readyz", 30*time.Second)
		out = append(out, trial{took: first.Sub(signalled), expiries: w.finish()})
		if sig == syscall.SIGTERM {
			if code := h.leader.proc.Wait(b, 30*time.Second); code != 0 {
				b.Errorf("leader exited %d on SIGTERM", code)
			}
		}
		h.leader = standby
	}
	return out
}

// firstWrite polls the node's metrics until it has written a key.
func (n *node) firstWrite(b *testing.B, d time.Duration) time.Time {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if e2e.Sum(e2e.Metrics(b, n.url+"/metrics"), "hearth_keys_written_total") > 0 {
			return time.Now()
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.Fatalf("the standby did not write within %s", d)
	return time.Time{}
}

// watch polls the declared keys every 10ms and counts the missing ones.
type watch struct {
	stop    chan struct{}
	done    chan struct{}
	missing atomic.Int64
}

func (h *handover) watch() *watch {
	w := &watch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		ctx := context.Background()
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			vals, err := h.client.MGet(ctx, h.keys...).Result()
			if err != nil {
				continue
			}
			for _, v := range vals {
				if v == nil {
					w.missing.Add(1)
				}
			}
		}
	}()
	return w
}

func (w *watch) finish() int {
	close(w.stop)
	<-w.done
	return int(w.missing.Load())
}
