package store

import (
	"context"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hearth-dev/hearth/internal/testenv"
)

// Every embedded file is part of some script, and every script compiles in
// a real Redis (SCRIPT LOAD parses the Lua without running it).
func TestScriptsLoad(t *testing.T) {
	files, err := fs.Glob(luaFiles, "lua/*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("embedded scripts: %v, %d files", err, len(files))
	}
	for _, f := range files {
		body := lua(strings.TrimPrefix(f, "lua/"))
		used := false
		for _, src := range sources {
			used = used || strings.Contains(src, body)
		}
		if !used {
			t.Errorf("%s is embedded but no script uses it", f)
		}
	}
	env := testenv.Redis(t)
	ctx := context.Background()
	for name, src := range sources {
		if err := env.Client.ScriptLoad(ctx, src).Err(); err != nil {
			t.Errorf("SCRIPT LOAD %s: %v", name, err)
		}
	}
	if len(sources) != 15 {
		t.Errorf("%d scripts, want 15 (update this count with the list in scripts.go)", len(sources))
	}
}

// The numbers the scripts use are the Go constants, and a script that uses
// one of them is composed with the constants (a Lua global that is nil would
// fail only when the branch runs).
func TestScriptConstants(t *testing.T) {
	for name, want := range map[string]int64{
		"HEARTH_AHEAD_MS":           MaxEpochAhead.Milliseconds(),
		"HEARTH_FOUND_MAX":          FoundMax,
		"HEARTH_LEASE_TTL_FACTOR":   LeaseTTLFactor,
		"HEARTH_RENEW_TOLERANCE_MS": RenewTolerance,
	} {
		m := regexp.MustCompile(`(?m)^local ` + name + ` = (\d+)$`).FindStringSubmatch(constants)
		if m == nil {
			t.Errorf("constants do not define %s", name)
			continue
		}
		if got, _ := strconv.ParseInt(m[1], 10, 64); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
		for script, src := range sources {
			if strings.Contains(src, name) && !strings.HasPrefix(src, constants) {
				t.Errorf("%s uses %s but is not composed with the constants", script, name)
			}
		}
	}
	for script, src := range sources {
		if strings.Contains(src, "hearth_") && !strings.Contains(src, lua("lib_prelude.lua")) {
			t.Errorf("%s calls a hearth_ helper but has no prelude", script)
		}
	}
}
