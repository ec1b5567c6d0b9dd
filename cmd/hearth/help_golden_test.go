package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var updateHelp = flag.Bool("update-help", false, "rewrite testdata/help from the current --help output")

// TestHelpUnchanged pins the --help output of every command to
// testdata/help/<command path>.txt (written from the binary before the daemon
// moved to its own package): the command line is an external contract, and a
// reshaping of the code behind it must not change a flag, a default or a line
// of help. A deliberate change reruns the test with -update-help.
func TestHelpUnchanged(t *testing.T) {
	paths := []string{"hearth"}
	for _, c := range newRoot(&bytes.Buffer{}, &bytes.Buffer{}).Commands() {
		if !c.Hidden {
			paths = append(paths, c.CommandPath())
		}
	}
	golden, err := filepath.Glob(filepath.Join("testdata", "help", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if !*updateHelp && len(golden) != len(paths) {
		t.Errorf("%d commands %v, %d help files %v: a command was added or removed", len(paths), paths, len(golden), golden)
	}
	for _, path := range paths {
		t.Run(path, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append(strings.Fields(path)[1:], "--help")
			if code := run(t.Context(), args, &stdout, &stderr); code != 0 {
				t.Fatalf("%s --help: exit %d: %s", path, code, stderr.String())
			}
			file := filepath.Join("testdata", "help", strings.ReplaceAll(path, " ", "-")+".txt")
			if *updateHelp {
				if err := os.WriteFile(file, stdout.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if got := stdout.String(); got != string(want) {
				t.Errorf("%s --help changed; got:\n%s\nwant (%s):\n%s", path, got, file, want)
			}
		})
	}
}
