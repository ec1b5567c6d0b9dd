package main_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/origintest"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// TestReloadedPointerWithConditionalOrigin runs the binary against an origin
// that answers 304 whenever If-None-Match matches: after SIGHUP reloads a
// json_pointer changed from /v to /w, Redis gets the /w field within a few
// refreshes, though the origin keeps answering 304 to validators it knows.
func TestReloadedPointerWithConditionalOrigin(t *testing.T) {
	rdb := sharedRedis(t)
	up := origintest.New(t, func(string, int) (int, string) { return http.StatusOK, `{"v":"old-field","w":"new-field"}` })
	up.SetETags(true)
	key := rdb.Prefix + "p:1"
	decl := func(ptr string) string {
		return fmt.Sprintf(`  - {name: p, key: "%sp:{id}", source: up, ttl: 2s, path: "/v/{id}", json_pointer: %s, members: ["1"]}`+"\n", rdb.Prefix, ptr)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(reloadConfig(rdb, up.URL, "info", decl("/v"))), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemonPath(t, path)
	testenv.Eventually(t, 20*time.Second, "the /v field written and a 304 answered", func() bool {
		return rdb.Get(t.Context(), key).Val() == "old-field" && up.NotModified() > 0
	})
	if err := os.WriteFile(path, []byte(reloadConfig(rdb, up.URL, "info", decl("/w"))), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(d.Cmd.Process.Pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "reload applied", func() bool {
		return d.metric(t, "hearth_config_reloads_total", `result="ok"`) >= 1
	})
	testenv.Eventually(t, 20*time.Second, "the /w field written after the reload", func() bool {
		return rdb.Get(t.Context(), key).Val() == "new-field"
	})
	before := up.NotModified()
	testenv.Eventually(t, 20*time.Second, "304s answered for the new pointer", func() bool { return up.NotModified() > before })
	if got := rdb.Get(t.Context(), key).Val(); got != "new-field" {
		t.Errorf("after more 304s %s = %q, want new-field", key, got)
	}
}
