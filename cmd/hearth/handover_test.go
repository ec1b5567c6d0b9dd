package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/jobs"
)

// The handover test's timing. TTL 4s (jitter 0.1: 3.8s–4.2s) is less than two
// intervals, so a key whose write one run skipped expires before the next
// run reaches it unless the new leader's catch-up rewrites it. The lease is
// Hearth's own pick (1s, retry period 200ms): the takeover margin is too
// small for an explicit lease to pass validation, and the daemon only warns.
const (
	hoTTL      = 4 * time.Second
	hoInterval = 2 * time.Second
	hoLoad     = 300 * time.Millisecond
	hoSpread   = 0.5 // 6 batches paced over 1s, 167ms apart
	hoMembers  = 300
	hoBatch    = 50
	hoFamily   = "product"
)

// TestHandoverNoGap stops the leader at several points of a family run, by
// SIGTERM (it drains and releases the lease) and by kill -9 (the lease
// expires), while an outside poller reads every key every 50ms: no key may be
// absent at any time. The instance taking over has led before (it was paused
// and fenced, then stood by), so each takeover is the catch-up, not a
// start-up load: its horizon must reach this instance's own next write of
// each batch, and cover the batches the old leader skipped.
func TestHandoverNoGap(t *testing.T) {
	t.Parallel()
	rd := testenv.Redis(t)
	pg := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE items (id text PRIMARY KEY, body text NOT NULL);
		INSERT INTO items SELECT i::text, 'item-' || i FROM generate_series(1, %d) i;`, hoMembers)); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`redis:
  addrs: [%q]
  namespace: %s
log:
  level: info
  format: json
refresh:
  load_timeout: %s
  shutdown_timeout: 5s
  batch_size: %d
  spread: %g
sources:
  - name: db
    type: postgres
    dsn: %q
keys:
  - name: %s
    key: "%sproduct:{id}"
    source: db
    ttl: %s
    interval: %s
    jitter: 0.1
    param_pattern: "[0-9]+"
    members_query: "SELECT id FROM items ORDER BY id"
    query: "SELECT id, body FROM items WHERE id = ANY($1)"
`, rd.Addr, e2e.Namespace(t, rd.Client), hoLoad, hoBatch, hoSpread, pg.DSN, hoFamily, rd.Prefix, hoTTL, hoInterval)
	s := &setup{redisAddr: rd.Addr, client: rd.Client, config: filepath.Join(t.TempDir(), "config.yaml")}
	for i := 1; i <= hoMembers; i++ {
		s.keys = append(s.keys, fmt.Sprintf("%sproduct:%d", rd.Prefix, i))
	}
	if err := os.WriteFile(s.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}

	a := s.start(t, "a")
	leading(t, a, 30*time.Second)
	p := startPoller(t, rd.Client, s.keys)
	defer p.stop()

	gap := time.Duration(float64(hoInterval)*hoSpread) / (hoMembers / hoBatch)
	trials := []struct {
		name  string
		sig   syscall.Signal
		after time.Duration // from the planned start of the run
	}{
		{"SIGTERM at the start of a run", syscall.SIGTERM, 20 * time.Millisecond},
		{"SIGTERM in the middle of a run", syscall.SIGTERM, 3*gap - gap/3},
		{"SIGTERM before the last batch", syscall.SIGTERM, 5*gap - gap/3},
		{"kill -9 in the middle of a run", syscall.SIGKILL, 3*gap - gap/3},
	}
	for i, tr := range trials {
		// a, who has led, stands by; a fresh instance leads.
		leader := s.start(t, fmt.Sprintf("leader%d", i))
		testenv.Eventually(t, 10*time.Second, leader.name+" stands by", func() bool { return leader.health(t).Role == "standby" })
		p.phase("demote a")
		demote(t, a, leader)

		p.phase(tr.name)
		// A run of the new leader's after one full scheduled run of its own,
		// so that the keys' TTLs follow its schedule.
		run := nextRun(time.Now()).Add(hoInterval)
		catchUps := strings.Count(a.proc.Output(), "takeover catch-up finished")
		time.Sleep(time.Until(run.Add(tr.after)))
		leader.proc.Signal(t, tr.sig)
		leading(t, a, 10*time.Second)
		if tr.sig == syscall.SIGTERM {
			if code := leader.proc.Wait(t, 15*time.Second); code != 0 {
				t.Errorf("%s: the leader exited %d on SIGTERM", tr.name, code)
			}
		}
		testenv.Eventually(t, 5*time.Second, "a's catch-up", func() bool {
			return strings.Count(a.proc.Output(), "takeover catch-up finished") > catchUps
		})
		t.Logf("%s: %s", tr.name, lastLine(a.proc.Output(), "takeover catch-up finished"))
		if tr.sig == syscall.SIGTERM && tr.after > gap {
			// The drained run wrote some batches and skipped the rest: not ok.
			line := lastLine(leader.proc.Output(), "refresh incomplete")
			if !strings.Contains(line, `"result":"partial"`) || !strings.Contains(line, "cut short by shutdown") {
				t.Errorf("%s: the drained run was not recorded partial: %q", tr.name, line)
			}
		}
		// Watch until a's own schedule has rewritten every key: a key the
		// catch-up left would expire before then.
		testenv.Eventually(t, 4*hoInterval, "a's schedule rewrote every key", func() bool {
			return time.Now().After(run.Add(hoInterval + time.Duration(float64(hoInterval)*hoSpread) + 2*hoLoad))
		})
	}
	p.phase("done")
	gaps := p.stop()
	t.Logf("poller: %d polls of %d keys", p.polls.Load(), len(s.keys))
	for _, g := range gaps {
		t.Errorf("gap: %s", g)
	}
}

// demote pauses the leader a until next leads, then resumes it: a finds its
// lease gone and stands by, having led (its next term is a takeover catch-up).
func demote(t *testing.T, a, next *node) {
	t.Helper()
	// Pause a right after one of its runs, its keys at their freshest.
	run := nextRun(time.Now())
	time.Sleep(time.Until(run.Add(time.Duration(float64(hoInterval)*hoSpread) + 150*time.Millisecond)))
	a.proc.Signal(t, syscall.SIGSTOP)
	resumed := false
	defer func() {
		if !resumed {
			_ = a.proc.Cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	leading(t, next, 10*time.Second)
	a.proc.Signal(t, syscall.SIGCONT)
	resumed = true
	testenv.Eventually(t, 10*time.Second, a.name+" stands by", func() bool { return a.health(t).Role == "standby" })
}

// nextRun is the planned start of the family's next run after t: every
// instance's schedule has the same phase (jobs.Offset).
func nextRun(t time.Time) time.Time {
	r := t.Truncate(hoInterval).Add(jobs.Offset(hoFamily, hoInterval))
	for !r.After(t) {
		r = r.Add(hoInterval)
	}
	return r
}

// lastLine returns the last log line containing s, or "".
func lastLine(out, s string) string {
	lines := strings.Split(out, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return lines[i]
		}
	}
	return ""
}

// poller reads every key every 50ms with its own client and records each
// absent key with the time and the phase of the test.
type poller struct {
	client *redis.Client
	keys   []string
	cur    atomic.Pointer[string]
	polls  atomic.Int64
	done   chan struct{}
	quit   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	gaps   []string
}

func startPoller(t *testing.T, rd *redis.Client, keys []string) *poller {
	t.Helper()
	opts := *rd.Options()
	p := &poller{client: redis.NewClient(&opts), keys: keys, done: make(chan struct{}), quit: make(chan struct{})}
	t.Cleanup(func() { p.stop(); _ = p.client.Close() })
	p.phase("start")
	go func() {
		defer close(p.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.quit:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			vals, err := p.client.MGet(ctx, p.keys...).Result()
			cancel()
			if err != nil {
				continue
			}
			p.polls.Add(1)
			now := time.Now().Format("15:04:05.000")
			var missing []string
			for i, v := range vals {
				if v == nil {
					missing = append(missing, p.keys[i])
				}
			}
			if len(missing) > 0 {
				p.mu.Lock()
				p.gaps = append(p.gaps, fmt.Sprintf("%s (%s): %d keys absent, e.g. %s", now, *p.cur.Load(), len(missing), missing[0]))
				p.mu.Unlock()
			}
		}
	}()
	return p
}

func (p *poller) phase(name string) { p.cur.Store(&name) }

// stop ends the polling and returns the gaps seen.
func (p *poller) stop() []string {
	p.once.Do(func() { close(p.quit) })
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.gaps)
}
