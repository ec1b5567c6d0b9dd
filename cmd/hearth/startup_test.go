package main_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/jobs"
)

// slowLoadOrigin is an HTTP upstream answering "<member>" at /s/<member>.
// Requests for "a…" members (the family's first batch) wait until aAt; those
// for "b…" members wait bStep each, until the test calls openB. So the start-up
// load writes its first batch at a time the test chooses and then goes on for
// as long as the test wants, without any one request outlasting the load
// timeout.
type slowLoadOrigin struct {
	*httptest.Server
	aAt    time.Time
	bStep  time.Duration
	bOpen  chan struct{}
	once   sync.Once
	mu     sync.Mutex
	served map[string][]time.Time
}

func newSlowLoadOrigin(t *testing.T, aAt time.Time, bStep time.Duration) *slowLoadOrigin {
	t.Helper()
	o := &slowLoadOrigin{aAt: aAt, bStep: bStep, bOpen: make(chan struct{}), served: map[string][]time.Time{}}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := strings.TrimPrefix(r.URL.Path, "/s/")
		if m == "" {
			http.NotFound(w, r)
			return
		}
		var wait <-chan time.Time
		switch m[0] {
		case 'a':
			wait = time.After(time.Until(o.aAt))
		case 'b':
			wait = time.After(o.bStep)
		}
		if wait != nil {
			select {
			case <-wait:
			case <-o.bOpen:
			case <-r.Context().Done():
				return
			}
		}
		o.mu.Lock()
		o.served[m] = append(o.served[m], time.Now())
		o.mu.Unlock()
		fmt.Fprint(w, m)
	}))
	t.Cleanup(func() { o.openB(); o.Close() })
	return o
}

// openB lets every request through at once from now on.
func (o *slowLoadOrigin) openB() { o.once.Do(func() { close(o.bOpen) }) }

// servedSince reports whether m was answered at or after t.
func (o *slowLoadOrigin) servedSince(m string, t time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, at := range o.served[m] {
		if !at.Before(t) {
			return true
		}
	}
	return false
}

// boundaryAfter is the first run time of the declaration name strictly after
// t, as the scheduler places it (jobs.Offset within each interval).
func boundaryAfter(t time.Time, name string, interval time.Duration) time.Time {
	b := t.Truncate(interval).Add(jobs.Offset(name, interval))
	for !b.After(t) {
		b = b.Add(interval)
	}
	return b
}

// TestStartupLoadSlowFirstBatchNoGap: a start-up load that takes longer than
// a TTL minus an interval must not leave the keys it wrote first to wait for
// their batch of the first scheduled run. The family's first batch is written
// lead before one of its run times ("phases"); its later batches (one load at
// a time) keep the start-up load going until after the next phase, the last
// one before the first batch's keys expire. So the first scheduled run (the
// phase after) comes only after they expired, and the start-up catch-up,
// after the load and once the schedule is open, must rewrite them. A separate
// client polls the first batch's keys from when they are written until the
// first scheduled run has rewritten them, and counts the polls that found one
// absent: none. Without the start-up catch-up they are absent for about lead
// (3s) before the first scheduled run writes them.
//
// The test waits on events (keys written, requests served) and on wall-clock
// points it computes from the schedule's phases and the keys' observed TTLs;
// it checks that the phases fall as intended around the observed expiry. It
// needs only that the end of the load and the catch-up take less than lead
// after the release of the load, and that no single origin request is held
// near the load timeout (each is held at most about 2s of 4s).
func TestStartupLoadSlowFirstBatchNoGap(t *testing.T) {
	t.Parallel()
	const (
		name     = "slowload"
		interval = 6 * time.Second
		ttl      = 2 * interval
		// lead is how long before a phase the first batch is written: its
		// keys then expire lead before the phase two intervals later.
		lead = interval / 2
		// startup is how long before the first batch is let through hearth
		// is started.
		startup = 2 * time.Second
	)
	rd := sharedRedis(t)
	aAt := boundaryAfter(time.Now().Add(startup+lead+100*time.Millisecond), name, interval).Add(-lead)
	o := newSlowLoadOrigin(t, aAt, time.Second)
	first := []string{"a0", "a1"}
	keys := make([]string, len(first))
	for i, m := range first {
		keys[i] = rd.Prefix + "s:" + m
	}
	members := slices.Clone(first)
	for i := range 40 {
		members = append(members, fmt.Sprintf("b%02d", i))
	}
	cfg := fmt.Sprintf(`
redis: {addrs: [%q], namespace: %q}
log: {level: debug, format: json}
refresh: {batch_size: 2, max_concurrent_loads: 1, spread: 0, jitter: 0, load_timeout: 4s, negative_ttl: 1s}
sources:
  - {name: api, type: http, base_url: %q, timeout: 4s}
keys:
  - {name: %s, key: "%ss:{id}", source: api, ttl: %s, interval: %s, members: [%s], path: "/s/{id}"}
`, rd.Addr, rd.Namespace, o.URL, name, rd.Prefix, ttl, interval, strings.Join(members, ", "))
	path := writeConfig(t, cfg)
	addr := e2e.FreeAddr(t)
	e2e.Binary(t) // built before the clock starts
	time.Sleep(time.Until(aAt.Add(-startup)))
	p := e2e.Start(t, []string{"run", "--config", path, "--listen", addr})

	ctx := context.Background()
	var expiry time.Time
	testenv.Eventually(t, 30*time.Second, "first batch written", func() bool {
		if p.Exited() {
			t.Fatalf("hearth exited:\n%s", p.Output())
		}
		before := time.Now()
		ttls := make([]time.Duration, len(keys))
		for i, k := range keys {
			d, err := rd.PTTL(ctx, k).Result()
			if err != nil || d <= 0 {
				return false
			}
			ttls[i] = d
		}
		expiry = before.Add(min(ttls[0], ttls[1]))
		return true
	})
	poll := startPoller(t, rd.Client, keys)
	poll.phase("start-up load")

	// The last phase before the keys expire; the next one (the first
	// scheduled run after the load) comes after they expired.
	last := boundaryAfter(expiry.Add(-interval), name, interval)
	firstRun := last.Add(interval)
	t.Logf("first batch let through %s, expires %s; the load is held until after the phase %s; first scheduled run %s",
		aAt.Format(time.StampMilli), expiry.Format(time.StampMilli), last.Format(time.StampMilli), firstRun.Format(time.StampMilli))
	if left := expiry.Sub(last); left < lead/2 {
		t.Fatalf("the first batch was written %s late: its keys expire %s after the last phase before, too little for the catch-up", aAt.Sub(expiry.Add(-ttl)), left)
	}
	time.Sleep(time.Until(last.Add(100 * time.Millisecond)))
	if p.Exited() {
		t.Fatalf("hearth exited:\n%s", p.Output())
	}
	if o.servedSince(members[len(members)-1], time.Time{}) {
		t.Fatalf("the start-up load ended before the phase %s: the test needs more members", last.Format(time.StampMilli))
	}
	poll.phase("load released: rest of the load, start-up catch-up")
	o.openB()
	p.WaitHTTP(t, "http://"+addr+"/readyz", http.StatusOK, 30*time.Second)
	poll.phase("ready, waiting for the first scheduled run")

	// Until the first scheduled run has rewritten the first batch's keys.
	testenv.Eventually(t, 3*interval, "first scheduled run", func() bool {
		for _, m := range first {
			if !o.servedSince(m, firstRun) {
				return false
			}
		}
		n, err := rd.Exists(ctx, keys...).Result()
		return err == nil && n == int64(len(keys))
	})
	// Two more polls after it.
	polls := poll.polls.Load()
	testenv.Eventually(t, 5*time.Second, "a poll after the first scheduled run", func() bool {
		return poll.polls.Load() > polls+1
	})
	gaps := poll.stop()
	if len(gaps) > 0 {
		t.Errorf("%d polls (of %d) found a key of the first batch absent:\n%s\n%s",
			len(gaps), poll.polls.Load(), strings.Join(gaps, "\n"), lastLine(p.Output(), "catch-up finished"))
	}
	if !strings.Contains(p.Output(), "start-up catch-up finished") {
		t.Errorf("no start-up catch-up logged")
	}
}
