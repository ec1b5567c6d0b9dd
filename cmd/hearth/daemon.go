package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/warmer"
)

func newRunCmd(g *globals) *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon: load every declared key, then keep it warm",
		Long: `Run connects to Redis and every source (exit 1 if one is unreachable), loads every
declared key once, reports ready on /readyz, then refreshes each declaration every
interval (TTL/2 by default) until SIGTERM or SIGINT, which drain in-flight writes
within refresh.shutdown_timeout and exit 0. A second signal aborts at once.`,
		Example: `  hearth run --config config.yaml
  HEARTH_REDIS_PASSWORD=secret hearth run -c /etc/hearth/config.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			if listen != "" {
				cfg.HTTP.Listen = listen
			}
			return daemon(cmd.Context(), g, cfg)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "override http.listen (host:port)")
	return cmd
}

// daemon wires config → Redis → sources → warmer → HTTP → start-up load → jobs,
// waits for a signal, and closes in reverse order.
func daemon(ctx context.Context, g *globals, cfg *config.Config) error {
	log := newLogger(g.stderr, cfg.Log)
	log.Info().Str("version", version).Str("config", cfg.File).Int("declarations", len(cfg.Keys)).Msg("starting")

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	rdb := newRedis(cfg.Redis)
	defer rdb.Close()
	if err := pingRedis(ctx, rdb, cfg.Redis); err != nil {
		return fail(exitFail, err)
	}
	sources, closeSources, err := openSources(ctx, cfg)
	if err != nil {
		return fail(exitFail, err)
	}
	defer closeSources()

	specs := cfg.Specs()
	w, err := warmer.New(warmer.Options{
		Store: &warmer.RedisStore{Client: rdb}, Sources: sources, Specs: specs,
		MaxConcurrentLoads: cfg.Refresh.MaxConcurrentLoads, Registerer: reg, Logger: log,
	})
	if err != nil {
		return fail(exitFail, err)
	}
	srv, err := listen(cfg.HTTP.Listen, reg, log)
	if err != nil {
		return fail(exitFail, err)
	}
	srv.serve()

	// The drain context outlives the first signal: a second one aborts.
	runCtx, abort := context.WithCancelCause(context.WithoutCancel(ctx))
	defer abort(nil)
	go func() {
		<-ctx.Done()
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		defer signal.Stop(sig)
		select {
		case <-sig:
			log.Warn().Msg("second signal: aborting")
			abort(errors.New("aborted by a second signal"))
		case <-runCtx.Done():
		}
	}()

	t0 := time.Now()
	if err := w.RefreshAll(ctx); err != nil {
		log.Error().Err(err).Msg("start-up load incomplete; the failed declarations are retried on schedule")
	}
	log.Info().Dur("took", time.Since(t0)).Msg("start-up load finished")
	stopPrewarm, err := startPrewarm(ctx, cfg, w, sources, rdb, reg, log) // before ready; see prewarm.go
	if err != nil {
		return fail(exitFail, err)
	}
	defer stopPrewarm(context.WithoutCancel(runCtx))

	sched, err := jobs.New(jobs.Options{Refresher: w, Specs: specs, Spread: cfg.Refresh.Spread, Logger: log})
	if err != nil {
		return fail(exitFail, err)
	}
	if err := sched.Open(ctx); err != nil {
		return fail(exitFail, err)
	}
	srv.ready.Store(ctx.Err() == nil)
	log.Info().Msg("ready")

	<-ctx.Done()
	log.Info().Dur("deadline", cfg.Refresh.ShutdownTimeout).Msg("shutting down: draining in-flight writes")
	srv.ready.Store(false)
	dctx, cancel := context.WithTimeout(runCtx, cfg.Refresh.ShutdownTimeout)
	defer cancel()
	var errs []error
	if err := sched.Close(dctx); err != nil {
		errs = append(errs, fmt.Errorf("close scheduler: %w", err))
	}
	if err := srv.shutdown(dctx); err != nil {
		errs = append(errs, fmt.Errorf("close http: %w", err))
	}
	if cause := context.Cause(runCtx); cause != nil {
		return fail(exitFail, cause)
	}
	if len(errs) > 0 {
		log.Warn().Err(errors.Join(errs...)).Msg("shutdown incomplete")
	}
	log.Info().Msg("stopped")
	return nil
}
