package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/daemon"
	"github.com/hearth-dev/hearth/demo"
)

func newDemoCmd(g *globals) *cobra.Command {
	opts := demo.DefaultOptions()
	var listenAddr, logLevel string
	cmd := &cobra.Command{
		Use:   "demo",
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
lives in the schema hearth_demo_<run id>, dropped at the end. The demo ignores
--config.`,
		Example: `  hearth demo
  hearth demo --duration 10s --readers 64 --keys 50 --ttl 4s
  hearth demo --origin-latency 200ms --ttl 10s
  hearth demo --redis 127.0.0.1:6379 --postgres postgres://postgres@127.0.0.1:5432/test
  hearth demo --duration 5m --listen 127.0.0.1:9464   # scrape /metrics, watch the dashboard`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := zerolog.ParseLevel(logLevel); err != nil || logLevel == "" {
				return fail(exitConfig, fmt.Errorf("--log-level: must be debug, info, warn or error (got %q)", logLevel))
			}
			if listenAddr != "" {
				if err := checkListen(listenAddr); err != nil {
					return fail(exitConfig, fmt.Errorf("--listen: %w", err))
				}
			}
			log := newLogger(g.stderr, config.Log{Level: logLevel, Format: "auto"})
			reg := prometheus.NewRegistry()
			opts.Registerer, opts.Out, opts.Logger = reg, g.stdout, log
			if err := opts.Check(); err != nil {
				return fail(exitConfig, err)
			}
			if listenAddr != "" {
				shutdown, err := daemon.ServeMetrics(listenAddr, reg, log)
				if err != nil {
					return fail(exitFail, err)
				}
				defer func() { _ = shutdown(cmd.Context()) }()
			}
			if _, err := demo.Run(cmd.Context(), opts); err != nil {
				return fail(exitFail, err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&opts.Duration, "duration", demo.DefaultDuration, "length of each of the two phases")
	f.IntVar(&opts.Readers, "readers", demo.DefaultReaders, "concurrent cache-aside readers")
	f.IntVar(&opts.Keys, "keys", demo.DefaultKeys, "hot keys the readers read")
	f.DurationVar(&opts.TTL, "ttl", demo.DefaultTTL, "TTL of the keys; Hearth refreshes every TTL/2")
	f.DurationVar(&opts.OriginLatency, "origin-latency", demo.DefaultOriginLatency, "cost of one origin call (at most TTL/10)")
	f.DurationVar(&opts.ReadPause, "read-pause", demo.DefaultReadPause, "each reader's pause between two reads")
	f.StringVar(&opts.RedisAddr, "redis", "", "a real Redis to use instead of the embedded one: host:port or redis://[user:password@]host:port/db")
	f.StringVar(&opts.PostgresDSN, "postgres", "", "DSN of a real PostgreSQL to use as the origin instead of the embedded HTTP one")
	f.StringVar(&listenAddr, "listen", "", "serve /metrics on this host:port while the demo runs")
	f.StringVar(&logLevel, "log-level", "warn", "level of Hearth's own logs on stderr (debug, info, warn, error)")
	// The demo runs on an embedded config: hide the global --config (a
	// local flag of the same name shadows it) rather than offer what it ignores.
	f.StringP("config", "c", "", "ignored: the demo runs on an embedded config")
	_ = f.MarkHidden("config")
	_ = cmd.RegisterFlagCompletionFunc("log-level", cobra.FixedCompletions([]string{"debug", "info", "warn", "error"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}
