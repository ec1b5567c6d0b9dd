package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

// demoBinary is the demo's own binary: the demo embeds a Redis (miniredis,
// with a Lua VM) and an origin that the daemon must not link, so `hearth
// demo` runs it from hearth's own directory, where make demo and go install
// put both.
const demoBinary = "hearth-demo"

func newDemoCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "demo [flags]",
		Short: "Show a cache stampede, then Hearth preventing it (needs no Redis or PostgreSQL)",
		Long: `Demo runs hearth-demo, the demo's own binary, from the directory hearth is in,
with the same flags; its output and exit code are the demo's. 'hearth demo --help'
prints the demo's flags.

The demo runs concurrent cache-aside readers against an embedded Redis and a
deliberately slow embedded origin, first without Hearth (a stampede at every
TTL) and then with Hearth's real warmer and scheduler (no miss). It is a binary
of its own so that the daemon links none of its embedded servers.

'make demo' builds both binaries into bin/ and runs the demo; 'go build -o bin/
./cmd/hearth-demo' builds the demo alone, 'go install ./cmd/...' installs both.`,
		Example: `  hearth demo
  hearth demo --duration 10s --readers 64 --keys 50 --ttl 4s
  hearth demo --help                           # the demo's flags`,
		// Every flag is the demo's: hearth-demo parses them.
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := findDemo()
			if err != nil {
				if len(args) == 1 && (args[0] == "--help" || args[0] == "-h") {
					fmt.Fprintf(g.stderr, "hearth: %v\n\n", err)
					return cmd.Help()
				}
				return fail(exitFail, err)
			}
			return fail(exitFail, execDemo(path, args))
		},
		ValidArgsFunction: func(_ *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			path, err := findDemo()
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return completeDemo(path, args, toComplete)
		},
	}
	// hearth's global --config goes on to the demo, which ignores it: hide
	// it from this help (a local flag of the same name shadows it).
	cmd.Flags().StringP("config", "c", "", "ignored: the demo runs on an embedded config")
	_ = cmd.Flags().MarkHidden("config")
	return cmd
}

// findDemo returns the path of hearth-demo next to the running hearth.
func findDemo() (string, error) {
	self, err := os.Executable()
	if err == nil {
		self, err = filepath.EvalSymlinks(self)
	}
	if err != nil {
		return "", fmt.Errorf("demo: find %s: the path of hearth itself: %w", demoBinary, err)
	}
	path := filepath.Join(filepath.Dir(self), demoBinary)
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("demo: %s is not installed next to hearth (no %s): the demo is a binary of its own; 'make demo' builds both into bin/ and runs it, 'go build -o %s ./cmd/hearth-demo' builds it where hearth is", demoBinary, path, path)
		}
		return "", fmt.Errorf("demo: %w", err)
	}
	return path, nil
}

// completeDemo asks hearth-demo for the completions of its own command line
// (cobra's __complete protocol: one completion a line, then ":directive").
func completeDemo(path string, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	out, err := exec.Command(path, append(append([]string{cobra.ShellCompRequestCmd}, args...), toComplete)...).Output()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	lines := strings.Split(strings.TrimSuffix(string(bytes.TrimSpace(out)), "\n"), "\n")
	last := len(lines) - 1
	d, err := strconv.Atoi(strings.TrimPrefix(lines[last], ":"))
	if !strings.HasPrefix(lines[last], ":") || err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return lines[:last], cobra.ShellCompDirective(d)
}
