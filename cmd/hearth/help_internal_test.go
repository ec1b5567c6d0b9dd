package main

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestHelp: every command, including those added later, documents itself with
// a short line, a description and examples.
func TestHelp(t *testing.T) {
	var walk func(c *cobra.Command)
	var all []*cobra.Command
	walk = func(c *cobra.Command) {
		all = append(all, c)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot(&bytes.Buffer{}, &bytes.Buffer{}))
	for _, c := range all {
		if c.Name() == "help" || c.Hidden {
			continue
		}
		path := c.CommandPath()
		t.Run(path, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append(strings.Fields(path)[1:], "--help")
			if code := run(t.Context(), args, &stdout, &stderr); code != 0 {
				t.Fatalf("%s --help: exit %d: %s", path, code, stderr.String())
			}
			help := stdout.String()
			if c.Short == "" || !strings.Contains(help, "Examples:\n  ") {
				t.Errorf("%s --help lacks a short description or examples:\n%s", path, help)
			}
			if len(help) < 200 {
				t.Errorf("%s --help is only %d bytes:\n%s", path, len(help), help)
			}
		})
	}
}

func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{
		"bash": "__start_hearth", "zsh": "#compdef hearth", "fish": "complete -c hearth", "powershell": "Register-ArgumentCompleter",
	} {
		t.Run(shell, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(t.Context(), []string{"completion", shell}, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("hearth completion %s does not contain %q", shell, want)
			}
		})
	}
	t.Run("flag values", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		run(t.Context(), []string{"__complete", "prewarm", "--ranking", ""}, &stdout, &stderr)
		if got := stdout.String(); !strings.Contains(got, "auto\nlive\nstored\n") {
			t.Errorf("completion of --ranking = %q", got)
		}
	})
}

// TestShortenArrays: `validate --explain` prints a finding's filter with the
// sample batch cut to three elements and a count, not 500 on one line.
func TestShortenArrays(t *testing.T) {
	long := make([]string, 500)
	for i := range long {
		long[i] = strconv.Itoa(i + 1)
	}
	for _, c := range []struct{ in, want string }{
		{"((id)::text = ANY ('{" + strings.Join(long, ",") + "}'::text[]))", "((id)::text = ANY ('{1,2,3,… 497 more}'::text[]))"},
		{"(id = ANY ('{1,2,3,4}'::bigint[]))", "(id = ANY ('{1,2,3,4}'::bigint[]))"},
		{"(name = 'x')", "(name = 'x')"},
		{"", ""},
	} {
		if got := shortenArrays(c.in); got != c.want {
			t.Errorf("shortenArrays(%.60q…) = %q, want %q", c.in, got, c.want)
		}
	}
}
