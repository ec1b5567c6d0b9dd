package main_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestMakeFuzzRunsEveryTarget: every Fuzz function in the module is run by
// `make fuzz`, in its own package: a fuzz target nobody runs proves nothing.
func TestMakeFuzzRunsEveryTarget(t *testing.T) {
	t.Parallel() // it only reads the sources
	root := filepath.Join("..", "..")
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	fuzzFunc := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(\w+ \*testing\.F\)`)
	found := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		// A nested module (readside/) is run from its own folder:
		// "cd readside && go test ... ./" for readside/*_test.go.
		mod, pkg := nestedModule(root, rel)
		for _, m := range fuzzFunc.FindAllSubmatch(src, -1) {
			found++
			want := "-fuzz '^" + string(m[1]) + "$$' -fuzztime $(FUZZTIME) ./" + filepath.ToSlash(rel) + "/"
			if mod != "" {
				want = "cd " + mod + " && $(GO) test -run '^$$' -fuzz '^" + string(m[1]) + "$$' -fuzztime $(FUZZTIME) ./" + pkg
			}
			if !strings.Contains(string(makefile), want) {
				t.Errorf("%s: make fuzz does not run %s (want a line with %q)", path, m[1], want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Fatal("no fuzz target found: the pattern no longer matches")
	}
}

// nestedModule returns the folder (relative to root) of the nested module
// that holds the package folder rel, and rel within it ("" or "sub/"); ""
// when rel is in the root module.
func nestedModule(root, rel string) (mod, pkg string) {
	for dir := rel; dir != "." && dir != ""; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(root, dir, "go.mod")); err == nil {
			inner, _ := filepath.Rel(dir, rel)
			if inner == "." {
				return filepath.ToSlash(dir), ""
			}
			return filepath.ToSlash(dir), filepath.ToSlash(inner) + "/"
		}
	}
	return "", ""
}
