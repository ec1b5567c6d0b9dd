package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// adminPrewarmState is GET /admin/prewarm.
type adminPrewarmState struct {
	Running  bool   `json:"running"`
	Reason   string `json:"reason"`
	Error    string `json:"error"`
	Progress *struct {
		Reason string `json:"reason"`
	} `json:"progress"`
	Report *struct {
		Reason   string `json:"reason"`
		Written  int    `json:"written"`
		Duration string `json:"duration"` // a duration string, as everywhere in the admin API
	} `json:"report"`
	Started  *time.Time `json:"started"`
	Finished *time.Time `json:"finished"`
}

// TestAdminPrewarmConflictsWithStartup: while the start-up pre-warm runs,
// POST /admin/prewarm answers 409 (it used to answer 202 and queue a second
// run behind it), and GET /admin/prewarm shows the start-up run, not an admin
// run that never started.
func TestAdminPrewarmConflictsWithStartup(t *testing.T) {
	t.Parallel() // its own prefix, daemon and origin: it only waits
	rdb := sharedRedis(t)
	// The start-up load calls /single once; the pre-warm's call is held.
	var (
		mu    sync.Mutex
		calls int
	)
	gate := make(chan struct{})
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	t.Cleanup(open)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/single" {
			return // the start-up ping
		}
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n >= 2 {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprint(w, "value")
	}))
	t.Cleanup(up.Close)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(`
redis: {addrs: [%[3]q], namespace: %[4]q}
log: {level: debug, format: json}
sources:
  - {name: up, type: http, base_url: %[2]q, timeout: 30s}
keys:
  - {name: single, key: "%[1]ssingle", source: up, ttl: 1h, path: /single}
`, rdb.Prefix, up.URL, rdb.Addr, rdb.Namespace)), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := e2e.FreeAddr(t)
	p := e2e.Start(t, []string{"run", "--config", path, "--listen", addr}, "HEARTH_ADMIN_TOKEN="+adminToken)
	base, bearer := "http://"+addr, "Bearer "+adminToken
	get := func() adminPrewarmState {
		t.Helper()
		code, body := call(t, "GET", base+"/admin/prewarm", bearer)
		var st adminPrewarmState
		if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil {
			t.Fatalf("GET /admin/prewarm: %d %s", code, body)
		}
		return st
	}
	testenv.Eventually(t, 30*time.Second, "the start-up pre-warm runs", func() bool {
		if p.Exited() {
			t.Fatalf("hearth exited:\n%s", p.Output())
		}
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		st := get()
		return st.Running && st.Reason == "startup"
	})

	code, body := call(t, "POST", base+"/admin/prewarm", bearer)
	var conflict adminPrewarmState
	if err := json.Unmarshal([]byte(body), &conflict); err != nil || code != http.StatusConflict {
		t.Fatalf("POST /admin/prewarm during the start-up pre-warm: %d %s, want 409", code, body)
	}
	if !conflict.Running || conflict.Reason != "startup" || conflict.Error == "" {
		t.Errorf("409 body = %s, want the running start-up pre-warm and an error", body)
	}
	if st := get(); !st.Running || st.Reason != "startup" || st.Progress == nil || st.Progress.Reason != "startup" || st.Started == nil {
		t.Errorf("GET during the start-up pre-warm = %+v, want it running, reason startup", st)
	}

	open()
	testenv.Eventually(t, 30*time.Second, "the start-up pre-warm finishes", func() bool {
		st := get()
		return !st.Running && st.Report != nil
	})
	if st := get(); st.Reason != "startup" || st.Report.Reason != "startup" || st.Report.Written != 1 || st.Finished == nil || st.Started == nil || st.Finished.Before(*st.Started) {
		t.Errorf("GET after the start-up pre-warm = %+v, want its report (startup, 1 written) with start and finish", st)
	}
	e2e.WaitHTTP(t, base+"/readyz", http.StatusOK, 30*time.Second)
	mu.Lock()
	n := calls
	mu.Unlock()
	if n != 2 {
		t.Errorf("origin calls = %d, want 2 (start-up load and pre-warm; the refused admin run never ran)", n)
	}

	// Once it is over, an admin pre-warm starts, and GET shows it.
	if code, body := call(t, "POST", base+"/admin/prewarm", bearer); code != http.StatusAccepted {
		t.Fatalf("POST /admin/prewarm after the start-up pre-warm: %d %s, want 202", code, body)
	}
	testenv.Eventually(t, 30*time.Second, "the admin pre-warm finishes", func() bool {
		st := get()
		return !st.Running && st.Report != nil && st.Report.Reason == "admin"
	})
	if st := get(); st.Report == nil {
		t.Error("no report after the admin pre-warm")
	} else if d, err := time.ParseDuration(st.Report.Duration); err != nil || d <= 0 {
		t.Errorf("report duration %q, want a duration string", st.Report.Duration)
	}
}

// TestAdminRefreshStateIsPruned: admin refreshes of members no declaration
// lists do not grow what /admin/status counts as members, and the state kept
// for them (hearth_warmer_state_members{kind="one_off"}) drops once no value of
// theirs can be alive (TTL 4s, max_stale 4s).
func TestAdminRefreshStateIsPruned(t *testing.T) {
	t.Parallel() // its own prefix, daemon and origin: it only waits
	rdb := sharedRedis(t)
	up := newOrigin(t)
	d := startDaemon(t, fmt.Sprintf(`
redis: {addrs: [%[3]q], namespace: %[4]q}
log: {level: info, format: json}
refresh: {max_stale: 4s}
sources:
  - {name: up, type: http, base_url: %[2]q, timeout: 10s}
keys:
  - {name: fam, key: "%[1]sfam:{id}", source: up, ttl: 4s, load_timeout: 500ms, path: "/fam/{id}", members: ["1", "2"]}
`, rdb.Prefix, up.URL, rdb.Addr, rdb.Namespace), "HEARTH_ADMIN_TOKEN="+adminToken)
	bearer := "Bearer " + adminToken
	const n = 50
	for i := range n {
		if code, body := call(t, "POST", fmt.Sprintf("%s/admin/refresh?declaration=fam&member=x%d", d.URL, i), bearer); code != http.StatusOK {
			t.Fatalf("refresh x%d: %d %s", i, code, body)
		}
	}
	if got := d.metric(t, "hearth_warmer_state_members", `family="fam"`, `kind="one_off"`); got < 1 {
		t.Errorf("one_off state after %d admin refreshes = %g, want them counted", n, got)
	}
	code, body := call(t, "GET", d.URL+"/admin/status", bearer)
	var st struct {
		Declarations []struct {
			Members int `json:"members"`
		} `json:"declarations"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil || code != http.StatusOK || len(st.Declarations) != 1 {
		t.Fatalf("status: %d %s", code, body)
	}
	if got := st.Declarations[0].Members; got != 2 {
		t.Errorf("status members after %d admin refreshes of undeclared members = %d, want the 2 declared", n, got)
	}
	testenv.Eventually(t, 30*time.Second, "the one-off state is pruned", func() bool {
		return d.metric(t, "hearth_warmer_state_members", `family="fam"`, `kind="one_off"`) == 0
	})
	if got := d.metric(t, "hearth_warmer_state_pruned_total", `family="fam"`, `reason="expired"`); got != n {
		t.Errorf("pruned expired = %g, want %d", got, n)
	}
	if got := d.metric(t, "hearth_warmer_state_members", `family="fam"`, `kind="declared"`); got != 2 {
		t.Errorf("declared state = %g, want 2", got)
	}
}
