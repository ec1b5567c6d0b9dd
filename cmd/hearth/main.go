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
	"time"

	"github.com/spf13/cobra"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/sources/postgres"
)

// Set at build time with -ldflags "-X main.version=… -X main.commit=…".
var (
	version = "dev"
	commit  = "unknown"
)

// Exit codes, part of the external contract (docs/commands.md#exit-codes).
const (
	exitOK = 0
	// exitFail: a runtime failure (a server unreachable, a write refused, an
	// unhealthy answer to `hearth healthcheck`).
	exitFail = 1
	// exitConfig: a usage or config error (unknown command or flag, a bad
	// flag value or argument, an invalid config), always found before any
	// connection is made.
	exitConfig = 2
	// exitCoverage: `hearth prewarm` loaded less than --min-coverage of the keys.
	exitCoverage = 3
	// exitFindings: `hearth validate --explain` found a query that scans a
	// large table sequentially.
	exitFindings = 4
)

// exitError carries an exit code out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func fail(code int, err error) error { return &exitError{code: code, err: err} }

// abortGrace is how long a second signal leaves the command to abort by
// itself (the daemon abandons its drain and exits) before the process ends
// regardless: a second SIGTERM or SIGINT always ends it, even when a
// component is stuck.
const abortGrace = time.Second

// main turns signals into what the commands take: a context that ends on the
// first SIGTERM or SIGINT, and an abort channel closed on the second (then the
// process exits after abortGrace, whatever still runs). `hearth run` turns
// SIGHUP into reload requests itself (notifyReload).
func main() {
	// Registered before the context's own handler sees a signal, so that no
	// signal is missed between the first and the second.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	abort := make(chan struct{})
	go exitOnSecondSignal(sigs, abort, abortGrace, os.Stderr, os.Exit)
	os.Exit(runWith(ctx, abort, os.Args[1:], os.Stdout, os.Stderr))
}

// exitOnSecondSignal lets the first signal drain (the command's context
// ends), and on the second closes abort, gives the command grace to abort by
// itself, then exits with exitFail whatever is still running.
func exitOnSecondSignal(sigs <-chan os.Signal, abort chan<- struct{}, grace time.Duration, stderr io.Writer, exit func(int)) {
	<-sigs
	<-sigs
	close(abort)
	time.Sleep(grace)
	fmt.Fprintln(stderr, "hearth: second signal: still not stopped after", grace, "- exiting")
	exit(exitFail)
}

// notifyReload turns SIGHUP into reload requests from now on, so that a
// SIGHUP sent while the daemon starts waits for it instead of ending the
// process. Requests sent while one is pending merge into it. stop ends the
// requests and SIGHUP's handling.
func notifyReload() (reload <-chan struct{}, stop func()) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGHUP)
	out := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-sig:
				select {
				case out <- struct{}{}:
				default:
				}
			case <-done:
				return
			}
		}
	}()
	return out, func() { signal.Stop(sig); close(done) }
}

// runWith executes the command line and returns the process exit code;
// closing abort (nil for none) abandons a command's drain.
func runWith(ctx context.Context, abort <-chan struct{}, args []string, stdout, stderr io.Writer) int {
	root := newRootOf(&globals{stdout: stdout, stderr: stderr, abort: abort})
	started := markStarts(root)
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
	case !*started:
		// cobra refused the command line before any command ran: an
		// unknown command or flag, a bad flag value, wrong arguments.
		fmt.Fprintf(stderr, "Run 'hearth --help' for usage.\n")
		return exitConfig
	default:
		return exitFail
	}
}

// markStarts wraps every command's run function so that the returned flag
// tells whether one started. An error returned before (cobra's own checks
// of the command line) is a usage error, whichever command it names.
func markStarts(root *cobra.Command) *bool {
	started := new(bool)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if run := c.RunE; run != nil {
			c.RunE = func(cmd *cobra.Command, args []string) error { *started = true; return run(cmd, args) }
		} else if run := c.Run; run != nil {
			c.Run = func(cmd *cobra.Command, args []string) { *started = true; run(cmd, args) }
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return started
}

type globals struct {
	configPath string
	stdout     io.Writer
	stderr     io.Writer
	// abort is closed on the second SIGTERM/SIGINT (nil for none).
	abort <-chan struct{}
}

func newRootOf(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "hearth",
		Short: "Keep hot Redis keys permanently warm",
		Long: `Hearth keeps an application's hot Redis keys permanently warm: it refreshes every
declared key from PostgreSQL or an HTTP upstream at half its TTL, so readers never
miss on it and the database never sees a cache stampede.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(g.stdout)
	root.SetErr(g.stderr)
	root.PersistentFlags().StringVarP(&g.configPath, "config", "c", "config.yaml", "path of the config file")
	root.AddCommand(newRunCmd(g), newValidateCmd(g), newVersionCmd(g), newDemoCmd(g))
	root.AddCommand(newPrewarmCmd(g), newMigrateCmd(g))
	root.AddCommand(newNotifySQLCmd(g), newHealthcheckCmd(g))
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return fail(exitConfig, err) })
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
	var (
		explain  bool
		minRows  int64
		capacity float64
	)
	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Check a config file and exit",
		Long: "Validate loads the config, expands ${VAR} references and HEARTH_… overrides, and\nreports every problem with its field path. Exit code 0 if valid, 2 if not." + `
A valid setting that weakens a guarantee (a source's breaker that notices the
origin's return less often than one of its declarations is refreshed) is
printed as a warning after "ok"; it does not change the exit code. So is a
declaration (or all of them together) whose key writes per second (members /
interval) need more than half of --capacity (default 40,000 keys/s, measured
on a 2-core machine; docs/performance.md).

With --explain it also connects to every postgres source and runs EXPLAIN of
each declaration's query (a family's with a sample batch of members, bound as
loads bind them; nothing is executed) and reports every sequential scan of a
table of at least --explain-min-rows rows, naming the declaration and the
index-friendly form (WHERE id = ANY($1::bigint[])). Exit code 4 when it found
one, 1 when a source is unreachable or a query could not be explained.`,
		Example: `  hearth validate --config /etc/hearth/config.yaml
  hearth validate --config config.yaml --explain`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "%s: ok (%d sources, %d declarations)\n", g.configPath, len(cfg.Sources), len(cfg.Keys))
			if !(capacity > 0) || capacity > 1e12 {
				return fail(exitConfig, fmt.Errorf("--capacity must be a number of key writes per second above 0 (got %g)", capacity))
			}
			for _, w := range append(cfg.Warnings(), cfg.WriteRateWarnings(capacity)...) {
				fmt.Fprintf(g.stdout, "warning: %s\n", w)
			}
			if !explain {
				return nil
			}
			if minRows < 1 {
				return fail(exitConfig, fmt.Errorf("--explain-min-rows must be >= 1 (got %d)", minRows))
			}
			return explainPlans(cmd.Context(), g, cfg, minRows)
		},
	}
	cmd.Flags().Float64Var(&capacity, "capacity", config.DefaultWriteCapacity, "key writes per second this machine sustains; a declaration (or all of them) needing more than half of it draws a warning")
	cmd.Flags().BoolVar(&explain, "explain", false, "check every postgres query's plan for sequential scans of large tables")
	cmd.Flags().Int64Var(&minRows, "explain-min-rows", postgres.DefaultExplainMinRows, "with --explain, the table size (rows) from which a sequential scan is reported")
	return cmd
}
