package main_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLogDurationsSayTheirUnit: every duration Hearth logs is a zerolog Dur
// field, written in milliseconds (cmd/hearth/log.go), and its name ends in
// _ms, so that "took_ms":17.98 says what "took":17.98 did not
// (docs/operations.md#logs). It reads the sources, tests excluded.
func TestLogDurationsSayTheirUnit(t *testing.T) {
	dur := regexp.MustCompile(`\bDurs?\("([^"]*)"`)
	root := filepath.Join("..", "..")
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range dur.FindAllSubmatch(src, -1) {
			checked++
			if name := string(m[1]); !strings.HasSuffix(name, "_ms") {
				t.Errorf("%s: log field %q is a duration in milliseconds: name it %s_ms", path, name, name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 10 {
		t.Fatalf("found %d Dur fields: the pattern no longer matches how durations are logged", checked)
	}
}
