// Command hearth-demo is `hearth demo`: a cache stampede shown live, then
// Hearth preventing it, on an embedded Redis and origin. It is a binary of its
// own so that the daemon links none of the demo's embedded servers (miniredis
// and its Lua VM); `hearth demo` runs it from the directory hearth is in.
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

	"github.com/mattn/go-isatty"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/hearth-dev/hearth/demo"
)

// Exit codes: hearth's contract (docs/commands.md#exit-codes), which
// `hearth demo` passes on.
const (
	exitOK     = 0
	exitFail   = 1 // a runtime failure: a server unreachable, a listener refused
	exitConfig = 2 // a usage error: unknown flag or argument, a bad flag value
)

// usageError marks an error found before the demo started.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal ends the demo's phases; a second one, unhandled, ends
	// the process.
	go func() { <-ctx.Done(); stop() }()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := newCmd(stdout, stderr)
	cmd.SetArgs(args)
	started := false
	runE := cmd.RunE
	cmd.RunE = func(c *cobra.Command, a []string) error { started = true; return runE(c, a) }
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "hearth:", err)
	var ue usageError
	switch {
	case errors.As(err, &ue):
		return exitConfig
	case !started:
		// cobra refused the command line: an unknown flag, wrong arguments.
		fmt.Fprintln(stderr, "Run 'hearth demo --help' for usage.")
		return exitConfig
	default:
		return exitFail
	}
}

func newCmd(stdout, stderr io.Writer) *cobra.Command {
	opts := demo.DefaultOptions()
	var logLevel string
	cmd := &cobra.Command{
		Use:   "hearth-demo",
		Short: "Show a cache stampede, then Hearth preventing it (needs no Redis or PostgreSQL)",
		Long: `Demo runs concurrent cache-aside readers (GET; on a miss, load from the origin and
SET with a TTL) against an embedded Redis (miniredis on loopback) and an embedded,
deliberately slow HTTP origin that counts its calls, in two phases:

  1. without Hearth: the keys, all loaded at once, expire at once every TTL, and
     every reader that reads one then misses and calls the origin (a stampede);
  2. with Hearth: the real warmer and scheduler load every key first, then
     refresh each one every TTL/2: no reader misses, and the origin only sees
     the refresh schedule.

It prints one line per second per phase (reads/s, misses/s, origin calls/s),
then a summary table, and exits 0. With the defaults it takes about 30 s.

--redis and --postgres point it at real servers instead: the demo's keys live
under the prefix hearth-demo:<run id>: and are deleted at the end; its table
lives in the schema hearth_demo_<run id>, dropped at the end.

hearth-demo is the demo's own binary, installed next to hearth; 'hearth demo'
runs it with the same flags.`,
		Example: `  hearth demo
  hearth demo --duration 10s --readers 64 --keys 50 --ttl 4s
  hearth demo --origin-latency 200ms --ttl 10s
  hearth demo --redis 127.0.0.1:6379 --postgres postgres://postgres@127.0.0.1:5432/test
  hearth demo --duration 5m --listen 127.0.0.1:9464   # scrape /metrics, watch the dashboard`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			level, err := zerolog.ParseLevel(logLevel)
			if err != nil || logLevel == "" {
				return usageError{fmt.Errorf("--log-level: must be debug, info, warn or error (got %q)", logLevel)}
			}
			opts.Registerer, opts.Out, opts.Logger = prometheus.NewRegistry(), stdout, newLogger(stderr, level)
			if err := opts.Check(); err != nil {
				return usageError{err}
			}
			_, err = demo.Run(cmd.Context(), opts)
			return err
		},
	}
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	f := cmd.Flags()
	f.DurationVar(&opts.Duration, "duration", demo.DefaultDuration, "length of each of the two phases")
	f.IntVar(&opts.Readers, "readers", demo.DefaultReaders, "concurrent cache-aside readers")
	f.IntVar(&opts.Keys, "keys", demo.DefaultKeys, "hot keys the readers read")
	f.DurationVar(&opts.TTL, "ttl", demo.DefaultTTL, "TTL of the keys; Hearth refreshes every TTL/2")
	f.DurationVar(&opts.OriginLatency, "origin-latency", demo.DefaultOriginLatency, "cost of one origin call (at most TTL/10)")
	f.DurationVar(&opts.ReadPause, "read-pause", demo.DefaultReadPause, "each reader's pause between two reads")
	f.StringVar(&opts.RedisAddr, "redis", "", "a real Redis to use instead of the embedded one: host:port or redis://[user:password@]host:port/db")
	f.StringVar(&opts.PostgresDSN, "postgres", "", "DSN of a real PostgreSQL to use as the origin instead of the embedded HTTP one")
	f.StringVar(&opts.Listen, "listen", "", "serve /metrics on this host:port while the demo runs")
	f.StringVar(&logLevel, "log-level", "warn", "level of Hearth's own logs on stderr (debug, info, warn, error)")
	// `hearth --config FILE demo` passes --config on: accept it, hidden, as
	// the demo runs on an embedded config and ignores it.
	f.StringP("config", "c", "", "ignored: the demo runs on an embedded config")
	_ = f.MarkHidden("config")
	_ = cmd.RegisterFlagCompletionFunc("log-level", cobra.FixedCompletions([]string{"debug", "info", "warn", "error"}, cobra.ShellCompDirectiveNoFileComp))
	cmd.CompletionOptions.DisableDefaultCmd = true
	return cmd
}

// newLogger writes Hearth's own logs to w: the console format on a terminal,
// JSON otherwise, as `hearth run` does with log.format auto.
func newLogger(w io.Writer, level zerolog.Level) zerolog.Logger {
	if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	}
	log := zerolog.New(w).Level(level).With().Timestamp().Logger()
	// go-redis prints its pool's dial failures in a format of its own; route
	// them to this logger, at debug.
	redis.SetLogger(redisLogger{log.With().Str("component", "go-redis").Logger()})
	return log
}

type redisLogger struct{ log zerolog.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug().Msgf(format, v...)
}
