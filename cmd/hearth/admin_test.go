package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/hearth-dev/hearth/internal/testenv"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/e2e"
)

const adminToken = "s3cret-admin-token"

func TestAdminAPI(t *testing.T) {
	rdb := sharedRedis(t)
	id := rdb.Prefix
	up := newOrigin(t)
	config := fmt.Sprintf(`
redis: {addrs: [%[3]q], namespace: %[4]q}
log: {level: debug, format: json}
sources:
  - {name: up, type: http, base_url: %[2]q, timeout: 10s}
keys:
  - {name: single, key: "%[1]ssingle", source: up, ttl: 1h, path: /single}
  - {name: fam, key: "%[1]sfam:{id}", source: up, ttl: 1h, path: "/fam/{id}", members: ["1", "2"], param_pattern: "[0-9a-z]{1,8}"}
`, id, up.URL, rdb.Addr, rdb.Namespace)
	d := startDaemon(t, config, "HEARTH_ADMIN_TOKEN="+adminToken)
	bearer := "Bearer " + adminToken

	t.Run("401 without a valid token, and no hint", func(t *testing.T) {
		before := up.count("/single")
		for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer wrong", "Basic " + adminToken, "Bearer " + adminToken + "x", adminToken, "Bearer " + adminToken[:len(adminToken)-1]} {
			for _, r := range []struct{ method, path string }{
				{"GET", "/admin/status"}, {"POST", "/admin/refresh?declaration=single"}, {"POST", "/admin/prewarm"}, {"POST", "/admin/reload"}, {"GET", "/admin/nope"},
			} {
				code, body := call(t, r.method, d.URL+r.path, auth)
				if code != http.StatusUnauthorized || body != "unauthorized\n" {
					t.Errorf("%s %s with %q: %d %q, want 401 \"unauthorized\\n\" whatever the route or the token", r.method, r.path, auth, code, body)
				}
			}
		}
		if got := up.count("/single"); got != before {
			t.Errorf("unauthorized refreshes reached the origin %d times", got-before)
		}
		if out := d.Output(); strings.Contains(out, adminToken) {
			t.Error("the admin token appears in the logs")
		}
	})

	t.Run("status", func(t *testing.T) {
		code, body := call(t, "GET", d.URL+"/admin/status", bearer)
		if code != http.StatusOK {
			t.Fatalf("status: %d %s", code, body)
		}
		var st struct {
			Declarations []struct {
				Name        string     `json:"name"`
				Key         string     `json:"key"`
				LastSuccess time.Time  `json:"last_success"`
				NextRun     *time.Time `json:"next_run"`
				Errors      int        `json:"errors"`
				Staleness   string     `json:"staleness"`
				Members     int        `json:"members"`
			} `json:"declarations"`
			Config struct {
				File         string `json:"file"`
				LastReloadOK bool   `json:"last_reload_ok"`
			} `json:"config"`
		}
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("%v in %s", err, body)
		}
		if len(st.Declarations) != 2 {
			t.Fatalf("declarations: %s", body)
		}
		for i, want := range []struct {
			name    string
			members int
		}{{"single", 1}, {"fam", 2}} {
			s := st.Declarations[i]
			if s.Name != want.name || s.Members != want.members || s.Errors != 0 || s.Staleness != "0s" {
				t.Errorf("declaration %d = %+v, want %s with %d members, no errors, 0s stale", i, s, want.name, want.members)
			}
			if time.Since(s.LastSuccess) > time.Minute {
				t.Errorf("%s: last success %v, want the start-up load", s.Name, s.LastSuccess)
			}
			if s.NextRun == nil || !s.NextRun.After(time.Now()) || s.NextRun.After(time.Now().Add(30*time.Minute)) {
				t.Errorf("%s: next run %v, want within the 30m interval", s.Name, s.NextRun)
			}
		}
		if st.Config.File != d.Config || !st.Config.LastReloadOK {
			t.Errorf("config = %+v, want file %s, last reload ok", st.Config, d.Config)
		}
	})

	t.Run("refresh a single key", func(t *testing.T) {
		before := up.count("/single")
		code, body := call(t, "POST", d.URL+"/admin/refresh?declaration=single", bearer)
		if code != http.StatusOK || !strings.Contains(body, `"written": 1`) {
			t.Fatalf("refresh: %d %s", code, body)
		}
		if got := up.count("/single") - before; got != 1 {
			t.Errorf("origin calls = %d, want 1", got)
		}
		if got, want := rdb.Get(t.Context(), id+"single").Val(), "value of /single"; got != want {
			t.Errorf("value = %q, want %q", got, want)
		}
	})

	t.Run("refresh a whole family", func(t *testing.T) {
		code, body := call(t, "POST", d.URL+"/admin/refresh?declaration=fam", bearer)
		if code != http.StatusOK || !strings.Contains(body, `"written": 2`) {
			t.Fatalf("refresh: %d %s", code, body)
		}
	})

	t.Run("bad requests", func(t *testing.T) {
		for _, c := range []struct {
			method, query string
			code          int
			msg           string
		}{
			{"POST", "", 400, "declaration: required"},
			{"POST", "declaration=nope", 404, `declaration \"nope\": not declared`},
			{"POST", "declaration=single&member=1", 400, "single key"},
			{"POST", "declaration=fam&member=a%20b", 400, "member of \\\"fam\\\""},
			{"POST", "declaration=fam&member=%7Bx%7D", 400, "member of \\\"fam\\\""},
			{"POST", "declaration=fam&member=" + strings.Repeat("9", 9), 400, "pattern"},
			{"GET", "declaration=single", 405, ""},
		} {
			code, body := call(t, c.method, d.URL+"/admin/refresh?"+c.query, bearer)
			if code != c.code || !strings.Contains(body, c.msg) {
				t.Errorf("%s refresh?%s: %d %s, want %d with %q", c.method, c.query, code, body, c.code, c.msg)
			}
		}
	})

	t.Run("concurrent refreshes of one key share one load", func(t *testing.T) {
		const n = 20
		path := "/fam/adhoc" // a member no schedule loads: every call is ours
		loads := d.metric(t, "hearth_admin_refresh_loads_total")
		release := up.holdPath(path)
		defer release()
		var wg sync.WaitGroup
		codes := make([]int, n)
		bodies := make([]string, n)
		for i := range n {
			wg.Go(func() {
				codes[i], bodies[i] = call(t, "POST", d.URL+"/admin/refresh?declaration=fam&member=adhoc", bearer)
			})
		}
		// Every request has joined the load once the gauge reads n, and the
		// load cannot finish before the origin is released.
		testenv.Eventually(t, 20*time.Second, "all requests waiting on one load", func() bool {
			return d.metric(t, "hearth_admin_refresh_waiting") == n
		})
		release()
		wg.Wait()
		for i := range n {
			if codes[i] != http.StatusOK || !strings.Contains(bodies[i], `"written": 1`) || !strings.Contains(bodies[i], `"shared": true`) {
				t.Errorf("request %d: %d %s", i, codes[i], bodies[i])
			}
		}
		// The load waited for the held origin: its duration cannot be 0s.
		var res struct {
			Duration string `json:"duration"`
		}
		if err := json.Unmarshal([]byte(bodies[0]), &res); err != nil {
			t.Fatalf("%v: %s", err, bodies[0])
		}
		if d, err := time.ParseDuration(res.Duration); err != nil || d <= 0 {
			t.Errorf("a one-member refresh reports duration %q, want the load's wall time", res.Duration)
		}
		if got := up.count(path); got != 1 {
			t.Errorf("origin calls for %d concurrent refreshes = %d, want 1", n, got)
		}
		if got := d.metric(t, "hearth_admin_refresh_loads_total") - loads; got != 1 {
			t.Errorf("loads = %g, want 1", got)
		}
		if got, want := rdb.Get(t.Context(), id+"fam:adhoc").Val(), "value of "+path; got != want {
			t.Errorf("value = %q, want %q", got, want)
		}
	})

	t.Run("a client that leaves does not cancel the shared load", func(t *testing.T) {
		path := "/fam/leaver"
		release := up.holdPath(path)
		defer release()
		ctx, cancel := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, "POST", d.URL+"/admin/refresh?declaration=fam&member=leaver", nil)
		req.Header.Set("Authorization", bearer)
		errc := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		testenv.Eventually(t, 20*time.Second, "the load reaches the origin", func() bool { return up.count(path) == 1 })
		cancel()
		<-errc
		release()
		testenv.Eventually(t, 20*time.Second, "the load finishes and writes", func() bool {
			return rdb.Get(t.Context(), id+"fam:leaver").Val() == "value of "+path
		})
	})

	t.Run("pre-warm", func(t *testing.T) {
		// No access log is configured: a pre-warm loads the declared single key.
		before := up.count("/single")
		code, body := call(t, "POST", d.URL+"/admin/prewarm", bearer)
		if code != http.StatusAccepted {
			t.Fatalf("POST /admin/prewarm: %d %s, want 202", code, body)
		}
		var st struct {
			Running bool   `json:"running"`
			Error   string `json:"error"`
			Report  *struct {
				Reason   string  `json:"reason"`
				Wanted   int     `json:"wanted"`
				Written  int     `json:"written"`
				Coverage float64 `json:"coverage"`
			} `json:"report"`
		}
		testenv.Eventually(t, 20*time.Second, "the pre-warm finishes", func() bool {
			code, body = call(t, "GET", d.URL+"/admin/prewarm", bearer)
			st.Report = nil
			return code == http.StatusOK && json.Unmarshal([]byte(body), &st) == nil && !st.Running && st.Report != nil
		})
		if r := st.Report; r.Reason != "admin" || r.Wanted != 1 || r.Written != 1 || r.Coverage != 1 || st.Error != "" {
			t.Errorf("GET /admin/prewarm = %s, want the admin pre-warm of the single key, coverage 1", body)
		}
		if got := up.count("/single") - before; got != 1 {
			t.Errorf("origin calls = %d, want 1", got)
		}
	})

	// Last: it changes the declarations the subtests above use.
	t.Run("reload", func(t *testing.T) {
		bad := config + fmt.Sprintf("  - {name: extra, key: \"%sextra\", source: up, ttl: sixty, path: /extra}\n", id)
		if err := os.WriteFile(d.Config, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		code, body := call(t, "POST", d.URL+"/admin/reload", bearer)
		var rej struct {
			Problems []string `json:"problems"`
		}
		if code != http.StatusUnprocessableEntity || json.Unmarshal([]byte(body), &rej) != nil || len(rej.Problems) != 1 {
			t.Fatalf("POST /admin/reload of an invalid file: %d %s, want 422 with one problem", code, body)
		}
		// As `hearth validate` prints it: file, line, field.
		if want := d.Config + ":9: keys[extra].ttl: invalid duration \"sixty\""; !strings.HasPrefix(rej.Problems[0], want) {
			t.Errorf("problem %q, want it to start with %q", rej.Problems[0], want)
		}
		if _, body := call(t, "GET", d.URL+"/admin/status", bearer); strings.Contains(body, `"extra"`) {
			t.Errorf("the rejected declaration is running: %s", body)
		}

		good := config + fmt.Sprintf("  - {name: extra, key: \"%sextra\", source: up, ttl: 1h, path: /extra}\n", id)
		if err := os.WriteFile(d.Config, []byte(good), 0o600); err != nil {
			t.Fatal(err)
		}
		// The file watcher may have applied it first: then nothing is left to add.
		code, body = call(t, "POST", d.URL+"/admin/reload", bearer)
		var res struct {
			Added           []string `json:"added"`
			Removed         []string `json:"removed"`
			RestartRequired []string `json:"restart_required"`
		}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &res) != nil || res.Removed == nil || len(res.Removed) != 0 ||
			res.RestartRequired == nil || len(res.Added) > 1 {
			t.Fatalf("POST /admin/reload: %d %s, want 200 with the changes", code, body)
		}
		if _, body := call(t, "GET", d.URL+"/admin/status", bearer); !strings.Contains(body, `"name": "extra"`) {
			t.Errorf("the reloaded declaration is not running: %s", body)
		}
		testenv.Eventually(t, 20*time.Second, "the added declaration loads", func() bool { return up.count("/extra") >= 1 })
	})
}

// TestAdminOnStandby: only the leader refreshes through the admin API; a
// standby says so instead of attempting writes the fence would refuse.
func TestAdminOnStandby(t *testing.T) {
	rdb := sharedRedis(t)
	up := newOrigin(t)
	config := fmt.Sprintf(`
redis: {addrs: [%[3]q], namespace: %[4]q}
log: {level: debug, format: json}
sources:
  - {name: up, type: http, base_url: %[2]q, timeout: 10s}
keys:
  - {name: single, key: "%[1]ssingle", source: up, ttl: 1h, path: /single}
`, rdb.Prefix, up.URL, rdb.Addr, rdb.Namespace)
	leader := startDaemon(t, config, "HEARTH_ADMIN_TOKEN="+adminToken)
	addr := e2e.FreeAddr(t)
	p := e2e.Start(t, []string{"run", "--config", leader.Config, "--listen", addr}, "HEARTH_ADMIN_TOKEN="+adminToken)
	standby := "http://" + addr
	testenv.Eventually(t, 30*time.Second, "the second instance stands by", func() bool {
		resp, err := http.Get(standby + "/healthz")
		if err != nil {
			return false // not listening yet
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"standby"`)
	})
	bearer := "Bearer " + adminToken
	before := up.count("/single")
	if code, body := call(t, "POST", standby+"/admin/refresh?declaration=single", bearer); code != http.StatusServiceUnavailable || !strings.Contains(body, "not the leader") {
		t.Errorf("refresh on the standby: %d %s, want 503 not the leader", code, body)
	}
	if got := up.count("/single"); got != before {
		t.Errorf("the standby's refresh reached the origin %d times", got-before)
	}
	if code, body := call(t, "GET", standby+"/admin/status", bearer); code != http.StatusOK || !strings.Contains(body, `"leader": false`) {
		t.Errorf("status on the standby: %d %s, want leader false", code, body)
	}
	if code, body := call(t, "POST", leader.URL+"/admin/refresh?declaration=single", bearer); code != http.StatusOK {
		t.Errorf("refresh on the leader: %d %s", code, body)
	}
	if p.Exited() {
		t.Fatalf("standby exited:\n%s", p.Output())
	}
}
