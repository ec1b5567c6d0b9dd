package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hearth-dev/hearth/internal/testenv"
)

// appGo is the go line of the application module the test builds: readside's
// own, so that importing readside raises no application's Go version.
const appGo = "1.24.0"

// TestBuildsAsAnApplication builds this example as an application would: in
// a module of its own that requires only github.com/hearth-dev/hearth/readside
// (replaced by the local copy, since it is not published from here), with no
// replace of the daemon's module. Its module graph holds none of the daemon's
// dependencies and its go line stays at appGo; then the binary runs against
// Redis.
func TestBuildsAsAnApplication(t *testing.T) {
	rs, err := filepath.Abs("../../readside")
	if err != nil {
		t.Fatal(err)
	}
	app := t.TempDir()
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(rs, "go.sum")) // the hashes readside's dependencies need
	if err != nil {
		t.Fatal(err)
	}
	mod := "module example.com/app\n\ngo " + appGo + "\n\nrequire github.com/hearth-dev/hearth/readside v0.0.0\n\n" +
		"replace github.com/hearth-dev/hearth/readside => " + rs + "\n"
	for name, data := range map[string][]byte{"main.go": src, "go.mod": []byte(mod), "go.sum": sum} {
		if err := os.WriteFile(filepath.Join(app, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goCmd := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// The module cache answers; the application's own go.mod decides.
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local")
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("go %s in %s: %v\n%s%s", strings.Join(args, " "), dir, err, out, stderr)
		}
		return string(out)
	}
	goCmd(app, "mod", "tidy")
	bin := filepath.Join(app, "app")
	goCmd(app, "build", "-o", bin, ".")

	var gomod struct{ Go string }
	if err := json.Unmarshal([]byte(goCmd(app, "mod", "edit", "-json")), &gomod); err != nil {
		t.Fatal(err)
	}
	if gomod.Go != appGo {
		t.Errorf("the application's go line became %s, want %s: readside raises its importers' Go version", gomod.Go, appGo)
	}
	modules := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(goCmd(app, "list", "-m", "all")), "\n") {
		modules[strings.Fields(line)[0]] = true
	}
	if !modules["github.com/hearth-dev/hearth/readside"] || !modules["github.com/redis/go-redis/v9"] {
		t.Fatalf("go list -m all lacks readside or go-redis: %v", modules)
	}
	if modules["github.com/hearth-dev/hearth"] {
		t.Error("the application's module graph holds the daemon's module github.com/hearth-dev/hearth")
	}
	// Every module the daemon requires that readside's own graph does not
	// hold (gocron, pgx, viper, zerolog, cobra, goose, ...) stays out.
	ownGraph := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(goCmd(rs, "list", "-mod=readonly", "-m", "all")), "\n") {
		ownGraph[strings.Fields(line)[0]] = true
	}
	var daemon struct{ Require []struct{ Path string } }
	if err := json.Unmarshal([]byte(goCmd("../..", "mod", "edit", "-json")), &daemon); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, r := range daemon.Require {
		if ownGraph[r.Path] || r.Path == "github.com/hearth-dev/hearth/readside" {
			continue
		}
		checked++
		if modules[r.Path] {
			t.Errorf("the application's module graph holds the daemon's dependency %s", r.Path)
		}
	}
	for _, m := range []string{"github.com/go-co-op/gocron/v2", "github.com/jackc/pgx/v5", "github.com/spf13/viper", "github.com/rs/zerolog"} {
		if ownGraph[m] {
			t.Errorf("readside's own module graph holds the daemon's dependency %s", m)
		}
	}
	if checked < 20 {
		t.Errorf("only %d of the daemon's requirements checked", checked)
	}

	env := testenv.Redis(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ns := "t-minimal-" + hex.EncodeToString(b)
	out, err := exec.Command(bin, "-addr", env.Addr, "-namespace", ns).CombinedOutput()
	if err != nil {
		t.Fatalf("the example: %v\n%s", err, out)
	}
	want := ns + `:product:42 = {"id":42}` + "\n"
	if string(out) != want+want {
		t.Errorf("the example printed %q, want %q twice", out, want)
	}
	if keys := env.Client.Keys(context.Background(), ns+":*").Val(); len(keys) > 0 {
		env.Client.Del(context.Background(), keys...)
		t.Errorf("the example left %v", keys)
	}
}
