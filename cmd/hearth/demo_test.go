package main_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hearth-dev/hearth/internal/e2e"
)

// TestDaemonLinksNoHarness: the production binary links neither the demo's
// embedded servers (miniredis and its Lua VM) nor any test harness; the demo
// is a binary of its own, cmd/hearth-demo.
func TestDaemonLinksNoHarness(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/hearth: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 || !contains(deps, "github.com/hearth-dev/hearth/daemon") {
		t.Fatalf("go list -deps ./cmd/hearth printed %d packages, no daemon: not the daemon's list", len(deps))
	}
	banned := []string{
		"github.com/alicebob/miniredis", "github.com/yuin/gopher-lua",
		"github.com/hearth-dev/hearth/demo",
		"github.com/hearth-dev/hearth/internal/testenv", "github.com/hearth-dev/hearth/internal/e2e",
		"github.com/hearth-dev/hearth/internal/leadertest", "github.com/hearth-dev/hearth/internal/origintest",
		"github.com/hearth-dev/hearth/internal/connflood", "github.com/hearth-dev/hearth/internal/promtest",
		"github.com/hearth-dev/hearth/internal/sourcetest",
		"github.com/hearth-dev/hearth/readside/internal/rstest",
	}
	for _, dep := range deps {
		for _, b := range banned {
			if dep == b || strings.HasPrefix(dep, b+"/") {
				t.Errorf("the daemon's binary links %s", dep)
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestDemoRunsHearthDemo: `hearth demo` runs hearth-demo from hearth's own
// directory with its flags, passes on its output, exit code and shell
// completions, and without it says exactly how to get it.
func TestDemoRunsHearthDemo(t *testing.T) {
	t.Parallel()
	bin := e2e.Binary(t)
	e2e.WithDemo(t, bin)
	hearth := func(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
		t.Helper()
		var o, e bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("hearth %v: %v", args, err)
		}
		return o.String(), e.String(), cmd.ProcessState.ExitCode()
	}

	t.Run("installed", func(t *testing.T) {
		out, errOut, code := hearth(t, bin, "demo", "--help")
		if code != 0 || !strings.Contains(out, "--origin-latency duration") || !strings.Contains(out, "hearth-demo [flags]") {
			t.Errorf("hearth demo --help: exit %d, want 0 and the demo's flags\n%s%s", code, out, errOut)
		}
		_, errOut, code = hearth(t, bin, "demo", "--readers", "0")
		if code != 2 || !strings.Contains(errOut, "--readers: must be between 1 and 1000") {
			t.Errorf("hearth demo --readers 0: exit %d, stderr %q; want 2 and the demo's message", code, errOut)
		}
		// A runtime failure of the demo is its exit code 1, through hearth.
		_, errOut, code = hearth(t, bin, "demo", "--redis", e2e.FreeAddr(t), "--duration", "1s")
		if code != 1 || !strings.Contains(errOut, "unreachable") {
			t.Errorf("hearth demo --redis <nothing there>: exit %d, stderr %q; want 1 and the demo's error", code, errOut)
		}
		// hearth's global --config before the command is the demo's to ignore.
		if _, errOut, code = hearth(t, bin, "--config", "nowhere.yaml", "demo", "--help"); code != 0 {
			t.Errorf("hearth --config nowhere.yaml demo --help: exit %d\n%s", code, errOut)
		}
		out, _, _ = hearth(t, bin, "__complete", "demo", "--log-level", "")
		if !strings.Contains(out, "debug\ninfo\nwarn\nerror\n:4\n") {
			t.Errorf("completion of hearth demo --log-level = %q, want the demo's levels and directive 4 (no files)", out)
		}
	})

	t.Run("not installed", func(t *testing.T) {
		alone := filepath.Join(t.TempDir(), "hearth")
		copyFile(t, bin, alone)
		_, errOut, code := hearth(t, alone, "demo")
		if code != 1 || !strings.Contains(errOut, "hearth-demo is not installed next to hearth") ||
			!strings.Contains(errOut, "make demo") || !strings.Contains(errOut, "go build -o "+filepath.Join(filepath.Dir(alone), "hearth-demo")+" ./cmd/hearth-demo") {
			t.Errorf("hearth demo without hearth-demo: exit %d, stderr %q; want 1 and how to build it", code, errOut)
		}
		out, errOut, code := hearth(t, alone, "demo", "--help")
		if code != 0 || !strings.Contains(out, "Demo runs hearth-demo") || !strings.Contains(errOut, "not installed") {
			t.Errorf("hearth demo --help without hearth-demo: exit %d, want 0, hearth's own help and why\n%s%s", code, out, errOut)
		}
	})
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
