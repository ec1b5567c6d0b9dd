package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// budgetHugeBytes is the pointed string of the huge members: 6 MB.
const budgetHugeBytes = 6 << 20

// budgetRSSBound is the daemon's peak RSS (VmHWM) the test allows for 4
// families × 8 members of huge pointed strings loaded together, with
// refresh.max_inflight_bytes at 16 MiB: measured 92 MB (a race build: 294 MB,
// its shadow memory); without the budget 652 MB. The daemon runs without the
// race detector (startPlainDaemon).
const budgetRSSBound = 200 << 20

// vmHWM is a process's peak resident set, from /proc/<pid>/status.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/<pid>/status")
	return 0
}

// TestPayloadBudgetBoundsMemory: an HTTP origin answers 4 families × 8
// members, each member a JSON body whose json_pointer selects a string:
// members 0-5 a 6 MB one (half with a Content-Length, half chunked), member 6
// a small one, member 7 a 20 MB body, over the whole 16 MiB budget. All four
// families are refreshed at once, three times. The daemon's peak RSS stays
// under 200 MB; member 7 fails at once as over the budget (counted), the
// 6 MB values fail as over max_value_bytes, both keep their old values, and
// every small member loads. Before the budget, the 32 bodies were read and
// decoded at once: ~500 MB.
func TestPayloadBudgetBoundsMemory(t *testing.T) {
	rdb := sharedRedis(t)
	huge := `{"meta":{"n":1},"data":"` + strings.Repeat("a", budgetHugeBytes) + `"}`
	over := `{"data":"` + strings.Repeat("b", 20<<20) + `"}`
	var mu sync.Mutex
	served := map[string]int{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// /f<F>/<m>
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
		if len(parts) != 2 {
			http.NotFound(w, r)
			return
		}
		m, _ := strconv.Atoi(parts[1])
		mu.Lock()
		served[parts[1]]++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case m == 6:
			fmt.Fprintf(w, `{"data":"small-%s-%d"}`, parts[0], m)
		case m == 7:
			w.Header().Set("Content-Length", strconv.Itoa(len(over)))
			_, _ = w.Write([]byte(over))
		case m%2 == 0:
			w.Header().Set("Content-Length", strconv.Itoa(len(huge)))
			_, _ = w.Write([]byte(huge))
		default: // chunked: no Content-Length
			for i := 0; i < len(huge); i += 1 << 20 {
				_, _ = w.Write([]byte(huge[i:min(i+1<<20, len(huge))]))
				w.(http.Flusher).Flush()
			}
		}
	}))
	t.Cleanup(up.Close)

	var keys strings.Builder
	for f := range 4 {
		fmt.Fprintf(&keys, "  - {name: f%[2]d, key: \"%[1]sf%[2]d:{id}\", source: up, ttl: 1h, load_timeout: 60s, path: \"/f%[2]d/{id}\", json_pointer: /data, members: [\"0\",\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\"]}\n", rdb.Prefix, f)
	}
	// The old values the failing members must keep.
	for f := range 4 {
		for m := range 8 {
			if m != 6 {
				rdb.Set(t.Context(), fmt.Sprintf("%sf%d:%d", rdb.Prefix, f, m), "old", time.Hour)
			}
		}
	}
	const token = "budget-test-token"
	d := startPlainDaemon(t, fmt.Sprintf(`
redis: {addrs: [%[3]q], namespace: %[4]q}
log: {level: warn, format: json}
sources:
  - {name: up, type: http, base_url: %[2]q, timeout: 20s, concurrency: 8, max_body_bytes: 33554432}
keys:
%[1]s`, keys.String(), up.URL, rdb.Addr, rdb.Namespace), "HEARTH_ADMIN_TOKEN="+token, "HEARTH_REFRESH_MAX_INFLIGHT_BYTES=16777216")
	pid := d.Cmd.Process.Pid
	t.Logf("daemon ready: VmHWM %d MB", vmHWM(t, pid)>>20)

	for round := range 3 {
		var wg sync.WaitGroup
		results := make([]map[string]any, 4)
		for f := range 4 {
			wg.Go(func() {
				req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/admin/refresh?declaration=f%d", d.URL, f), nil)
				req.Header.Set("Authorization", "Bearer "+token)
				resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
				if err != nil {
					t.Errorf("refresh f%d: %v", f, err)
					return
				}
				defer resp.Body.Close()
				var out map[string]any
				_ = json.NewDecoder(resp.Body).Decode(&out)
				results[f] = out
			})
		}
		wg.Wait()
		for f, out := range results {
			// 1 written (member 6); 7 failed (0-5 too large for max_value_bytes, 7 over the budget).
			if out["written"] != float64(1) || out["failed"] != float64(7) {
				t.Errorf("round %d: refresh f%d = %v, want written 1, failed 7", round, f, out)
			}
		}
		t.Logf("round %d: VmHWM %d MB", round, vmHWM(t, pid)>>20)
	}
	if d.Exited() {
		t.Fatalf("hearth exited:\n%s", d.Output())
	}
	peak := vmHWM(t, pid)
	bound := int64(budgetRSSBound)
	t.Logf("daemon peak RSS (VmHWM) after 3 rounds of 4 families × 8 members: %d MB (bound %d MB)", peak>>20, bound>>20)
	if peak > bound {
		t.Errorf("daemon peak RSS %d MB, want ≤ %d MB", peak>>20, bound>>20)
	}
	for f := range 4 {
		for m := range 8 {
			key := fmt.Sprintf("%sf%d:%d", rdb.Prefix, f, m)
			got, err := rdb.Get(t.Context(), key).Result()
			want := "old"
			if m == 6 {
				want = fmt.Sprintf("small-f%d-6", f)
			}
			if err != nil || got != want {
				t.Errorf("%s = %.40q (%v), want %q", key, got, err, want)
			}
		}
	}
	if over := d.metric(t, "hearth_payload_budget_refused_total", `reason="over"`); over < 12 {
		t.Errorf("hearth_payload_budget_refused_total{reason=over} = %g, want ≥ 12 (member 7 of 4 families, 3 rounds)", over)
	}
	if n := d.metric(t, "hearth_payload_inflight_bytes"); n != 0 {
		t.Errorf("hearth_payload_inflight_bytes = %g after the loads, want 0 (every acquisition released)", n)
	}
}
