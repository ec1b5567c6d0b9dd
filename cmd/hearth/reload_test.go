package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/testenv"
)

// reloadConfig is a config with the given declarations (short TTLs, so that a
// key that stops being refreshed would expire within the test).
func reloadConfig(rdb *opsRedis, upstream, level, keys string) string {
	return fmt.Sprintf(`
redis: {addrs: [%[5]q], namespace: %[1]q}
log: {level: %[3]s, format: json}
refresh: {load_timeout: 500ms, negative_ttl: 1s}
sources:
  - {name: up, type: http, base_url: %[2]q, timeout: 1s}
keys:
%[4]s`, rdb.Namespace, upstream, level, keys, rdb.Addr)
}

// swapLink points the symlink link at target atomically, as Kubernetes does
// when a ConfigMap changes (it renames a new ..data symlink over the old one).
func swapLink(t *testing.T, link, target string) {
	t.Helper()
	tmp := link + ".new"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

func TestReload(t *testing.T) {
	rdb := sharedRedis(t)
	id := rdb.Prefix
	up := newOrigin(t)
	keyA := fmt.Sprintf(`  - {name: a, key: "%sa", source: up, ttl: 3s, path: /a}`+"\n", id)
	keyB := fmt.Sprintf(`  - {name: b, key: "%sb", source: up, ttl: 3s, path: /b}`+"\n", id)
	keyBSlow := fmt.Sprintf(`  - {name: b, key: "%sb", source: up, ttl: 3s, interval: 1s, path: /b}`+"\n", id)

	// The config the daemon reads is a symlink into another directory, as with
	// a Kubernetes ConfigMap. Swapping the symlink is seen by the watcher;
	// editing the target in place is not (its directory is not watched), so
	// the later steps need SIGHUP.
	data := t.TempDir()
	v1, v2 := filepath.Join(data, "v1.yaml"), filepath.Join(data, "v2.yaml")
	if err := os.WriteFile(v1, []byte(reloadConfig(rdb, up.URL, "debug", keyA)), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.Symlink(v1, link); err != nil {
		t.Fatal(err)
	}
	d := startDaemonPath(t, link)

	// Key a must never disappear while Hearth reloads around it.
	var misses atomic.Int64
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if n, err := rdb.Exists(t.Context(), id+"a").Result(); err == nil && n == 0 {
				misses.Add(1)
			}
		}
	}()
	stopWatching := func() {
		select {
		case <-stop:
		default:
			close(stop)
			<-watched
		}
	}
	defer stopWatching()

	t.Run("admin API absent without a token", func(t *testing.T) {
		if code, _ := call(t, "GET", d.URL+"/admin/status", "Bearer x"); code != http.StatusNotFound {
			t.Errorf("GET /admin/status without HEARTH_ADMIN_TOKEN: %d, want 404", code)
		}
	})

	t.Run("valid file change adds a declaration", func(t *testing.T) {
		if err := os.WriteFile(v2, []byte(reloadConfig(rdb, up.URL, "debug", keyA+keyB)), 0o600); err != nil {
			t.Fatal(err)
		}
		swapLink(t, link, v2)
		testenv.Eventually(t, 20*time.Second, "reload applied and b written", func() bool {
			return d.metric(t, "hearth_config_reloads_total", `result="ok"`) == 1 && rdb.Exists(t.Context(), id+"b").Val() == 1
		})
		if got := d.metric(t, "hearth_config_last_reload_success"); got != 1 {
			t.Errorf("last reload success = %g, want 1", got)
		}
	})

	t.Run("invalid config is rejected and the old one keeps running", func(t *testing.T) {
		bad := reloadConfig(rdb, up.URL, "debug", keyA+keyB+"  - {name: c, key: \"x\", source: up, ttl: -1s, path: /c}\n")
		if err := os.WriteFile(v2, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(d.Cmd.Process.Pid, syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, "invalid reload counted", func() bool {
			return d.metric(t, "hearth_config_reloads_total", `result="invalid"`) == 1
		})
		if got := d.metric(t, "hearth_config_last_reload_success"); got != 0 {
			t.Errorf("last reload success = %g, want 0", got)
		}
		if out := d.Output(); !strings.Contains(out, "keys[c].ttl") || !strings.Contains(out, "config reload rejected") {
			t.Errorf("the rejection is not logged with its field:\n%s", out)
		}
		// b keeps being refreshed on the old config.
		calls := up.count("/b")
		testenv.Eventually(t, 20*time.Second, "b refreshed after the rejection", func() bool { return up.count("/b") > calls })
		if d.Exited() {
			t.Fatal("hearth exited on an invalid config")
		}
	})

	t.Run("SIGHUP removes, reschedules, and flags restart-only changes", func(t *testing.T) {
		if err := os.WriteFile(v2, []byte(reloadConfig(rdb, up.URL, "info", keyBSlow)), 0o600); err != nil {
			t.Fatal(err)
		}
		stopWatching() // a stops being refreshed from here on, by design
		if err := syscall.Kill(d.Cmd.Process.Pid, syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, "second valid reload", func() bool {
			return d.metric(t, "hearth_config_reloads_total", `result="ok"`) == 2
		})
		m := d.metric
		if got := m(t, "hearth_refresh_interval_seconds", `family="a"`); got != 0 {
			t.Errorf("removed a still exported (interval %g)", got)
		}
		if got := m(t, "hearth_refresh_interval_seconds", `family="b"`); got != 1 {
			t.Errorf("b's interval = %gs, want 1s", got)
		}
		if got := m(t, "hearth_config_restart_required"); got != 1 {
			t.Errorf("restart required = %g, want 1 (log.level changed)", got)
		}
		if out := d.Output(); !strings.Contains(out, `"sections":["log"]`) {
			t.Errorf("the restart-only change to log is not named in the logs:\n%s", out)
		}
		if d.Exited() {
			t.Fatal("hearth exited on SIGHUP")
		}
	})

	if n := misses.Load(); n > 0 {
		t.Errorf("key a was missing %d times while the config was reloaded", n)
	}
}

// jsonText is s as it appears inside a JSON log string.
func jsonText(s string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(strings.TrimSpace(b.String()), `"`)[1:]
}

// TestReloadRejectsBadValues: every value `validate` refuses is refused by a
// hot reload too, each refusal counted, logged with its field and value, and
// the running config keeps refreshing. A config file that cannot be read
// (deleted, or replaced by a dangling link) is reported, never waited on in
// silence, and the same file coming back is applied again.
func TestReloadRejectsBadValues(t *testing.T) {
	t.Parallel() // its own prefix, daemon and origin: it only waits
	rdb := sharedRedis(t)
	id := rdb.Prefix
	up := newOrigin(t)
	keyA := fmt.Sprintf(`  - {name: a, key: "%sa", source: up, ttl: 3s, path: /a}`+"\n", id)
	good := reloadConfig(rdb, up.URL, "info", keyA)

	// As in TestReload, the file is a symlink into a directory that is not
	// watched: editing the target needs SIGHUP, and each SIGHUP is one reload.
	data := t.TempDir()
	target := filepath.Join(data, "v1.yaml")
	if err := os.WriteFile(target, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	d := startDaemonPath(t, link)
	hup := func() {
		t.Helper()
		if err := syscall.Kill(d.Cmd.Process.Pid, syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	ns := rdb.Namespace
	for i, tc := range []struct{ name, config, want string }{
		{"jitter NaN", strings.Replace(good, "refresh: {", "refresh: {jitter: .nan, ", 1),
			"refresh.jitter: must be a finite number (got NaN)"},
		{"jitter Inf per key", strings.Replace(good, "ttl: 3s,", "ttl: 3s, jitter: .inf,", 1),
			"keys[a].jitter: must be a finite number (got +Inf)"},
		{"ttl overflowing the jittered ttl", strings.Replace(good, "ttl: 3s", "ttl: 2562047h", 1),
			"keys[a].ttl: must be at most 8760h0m0s, a year (got 2562047h0m0s)"},
		{"source timeout zero", strings.Replace(good, "timeout: 1s}", "timeout: 0s}", 1),
			"sources[up].timeout: is required for an http source, e.g. 5s"},
		{"interval as a bare number", strings.Replace(good, "ttl: 3s,", "ttl: 3s, interval: 1,", 1),
			`config.yaml:8: keys[a].interval: a duration needs a unit, e.g. "1s" (got 1)`},
		{"interval of 1ns", strings.Replace(good, "ttl: 3s,", "ttl: 3s, interval: 1ns,", 1),
			"keys[a].interval: must be 0 (ttl/2) or at least 100ms (got 1ns)"},
		{"load_timeout as a bare string", strings.Replace(good, "load_timeout: 500ms", `load_timeout: "1"`, 1),
			`refresh.load_timeout: a duration needs a unit, e.g. "1s" (got 1)`},
		{"template inside the namespace", good + fmt.Sprintf(`  - {name: c, key: "%s:{id}", source: up, ttl: 3s, path: "/c/{id}", members: [warm]}`+"\n", ns),
			fmt.Sprintf(`keys[c].key: template "%s:{id}" can name a key inside Hearth's own namespace (%s or %s:…, redis.namespace)`, ns, ns, ns)},
		{"template inside the running namespace, with a new namespace",
			strings.Replace(good, fmt.Sprintf("namespace: %q", ns), `namespace: "elsewhere"`, 1) +
				fmt.Sprintf(`  - {name: c, key: "%s:{id}", source: up, ttl: 3s, path: "/c/{id}", members: [fence]}`+"\n", ns),
			fmt.Sprintf(`redis.namespace %q stays in use until a restart: %s: keys[c].key: template "%s:{id}" can name a key inside Hearth's own namespace`, ns, link, ns)},
		{"invalid header name", strings.Replace(good, "timeout: 1s}", `timeout: 1s, headers: {"x api": k}}`, 1),
			`sources[up].headers: "x api" is not a valid header name`},
		{"header value with CRLF", strings.Replace(good, "timeout: 1s}", `timeout: 1s, headers: {x-api: "k\r\nx-evil: 1"}}`, 1),
			"sources[up].headers.x-api: value must not contain CR, LF, NUL"},
		{"duplicate key", strings.Replace(good, "ttl: 3s,", "ttl: 3s, ttl: 4s,", 1),
			`config.yaml:8: keys[a]: duplicate key "ttl" (first at line 8)`},
		{"bad YAML", good + "keys: [\n", "not valid YAML"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(target, []byte(tc.config), 0o600); err != nil {
				t.Fatal(err)
			}
			hup()
			testenv.Eventually(t, 20*time.Second, "reload refused", func() bool {
				return d.metric(t, "hearth_config_reloads_total", `result="invalid"`) == float64(i+1)
			})
			if got := d.metric(t, "hearth_config_last_reload_success"); got != 0 {
				t.Errorf("last reload success = %g, want 0", got)
			}
			if out := d.Output(); !strings.Contains(out, jsonText(tc.want)) {
				t.Errorf("the refusal is not logged with %q:\n%s", tc.want, out)
			}
		})
	}
	if t.Failed() {
		return
	}
	calls := up.count("/a")
	testenv.Eventually(t, 20*time.Second, "a refreshed on the old config after the refusals", func() bool { return up.count("/a") > calls })
	if n := rdb.Exists(t.Context(), id+"a").Val(); n != 1 {
		t.Errorf("key a is gone after refused reloads")
	}

	t.Run("the good file applies again", func(t *testing.T) {
		if err := os.WriteFile(target, []byte(good), 0o600); err != nil {
			t.Fatal(err)
		}
		hup()
		testenv.Eventually(t, 20*time.Second, "reload applied", func() bool {
			return d.metric(t, "hearth_config_reloads_total", `result="ok"`) == 1
		})
	})
	t.Run("deleted file on SIGHUP", func(t *testing.T) {
		if err := os.Remove(target); err != nil {
			t.Fatal(err)
		}
		hup()
		testenv.Eventually(t, 20*time.Second, "unreadable reload counted", func() bool {
			return d.metric(t, "hearth_config_reloads_total", `result="unreadable"`) == 1
		})
		if got := d.metric(t, "hearth_config_last_reload_success"); got != 0 {
			t.Errorf("last reload success = %g, want 0", got)
		}
		if out := d.Output(); !strings.Contains(out, "read config: open "+link+": no such file or directory") {
			t.Errorf("the read error is not logged with the file:\n%s", out)
		}
	})
	t.Run("link swapped to a file that never appears", func(t *testing.T) {
		swapLink(t, link, filepath.Join(data, "never.yaml"))
		testenv.Eventually(t, 20*time.Second, "watcher reports the missing file", func() bool {
			return d.metric(t, "hearth_config_reloads_total", `result="unreadable"`) == 2
		})
	})
	t.Run("the same file back is applied, not taken for unchanged", func(t *testing.T) {
		if err := os.WriteFile(target, []byte(good), 0o600); err != nil {
			t.Fatal(err)
		}
		swapLink(t, link, target)
		testenv.Eventually(t, 20*time.Second, "reload applied", func() bool {
			return d.metric(t, "hearth_config_reloads_total", `result="ok"`) == 2 &&
				d.metric(t, "hearth_config_last_reload_success") == 1
		})
	})
	if d.Exited() {
		t.Fatalf("hearth exited during the reloads:\n%s", d.Output())
	}
}
