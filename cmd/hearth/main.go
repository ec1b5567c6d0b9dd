// Command hearth keeps an application's hot Redis keys permanently warm.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/hearth-dev/hearth/config"
)

// Set at build time with -ldflags "-X main.version=… -X main.commit=…".
var (
	version = "dev"
	commit  = "unknown"
)

// Exit codes, part of the external contract.
const (
	exitOK     = 0
	exitFail   = 1
	exitConfig = 2
	// exitCoverage: `hearth prewarm` loaded less than --min-coverage of the keys.
	exitCoverage = 3
)

// exitError carries an exit code out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func fail(code int, err error) error { return &exitError{code: code, err: err} }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "hearth:", err)
	var ee *exitError
	var ce *config.Error
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ce):
		return exitConfig
	default:
		return exitFail
	}
}

type globals struct {
	configPath string
	stdout     io.Writer
	stderr     io.Writer
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "hearth",
		Short: "Keep hot Redis keys permanently warm",
		Long: `Hearth keeps an application's hot Redis keys permanently warm: it refreshes every
declared key from PostgreSQL or an HTTP upstream at half its TTL, so readers never
miss on it and the database never sees a cache stampede.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.PersistentFlags().StringVarP(&g.configPath, "config", "c", "config.yaml", "path of the config file")
	root.AddCommand(newRunCmd(g), newValidateCmd(g), newVersionCmd(g), newDemoCmd(g))
	root.AddCommand(newPrewarmCmd(g), newMigrateCmd(g))
	root.AddCommand(newNotifySQLCmd(g))
	polishHelp(root)
	return root
}

func (g *globals) load() (*config.Config, error) {
	cfg, err := config.Load(g.configPath)
	if err != nil {
		return nil, fail(exitConfig, err)
	}
	return cfg, nil
}

func newValidateCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "validate",
		Short:   "Check a config file and exit",
		Long:    "Validate loads the config, expands ${VAR} references and HEARTH_… overrides, and\nreports every problem with its field path. Exit code 0 if valid, 2 if not.",
		Example: `  hearth validate --config /etc/hearth/config.yaml`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "%s: ok (%d sources, %d declarations)\n", g.configPath, len(cfg.Sources), len(cfg.Keys))
			return nil
		},
	}
}
