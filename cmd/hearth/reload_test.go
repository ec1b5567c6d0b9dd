package main_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
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
		eventually(t, 20*time.Second, "reload applied and b written", func() bool {
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
		eventually(t, 20*time.Second, "invalid reload counted", func() bool {
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
		eventually(t, 20*time.Second, "b refreshed after the rejection", func() bool { return up.count("/b") > calls })
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
		eventually(t, 20*time.Second, "second valid reload", func() bool {
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
