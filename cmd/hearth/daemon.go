package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

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
		Long: `Run connects to Redis and every source (exit 1 if one is unreachable) and campaigns
for the leader lease. The leader loads every declared key once, reports ready on
/readyz, then refreshes each declaration every interval (TTL/2 by default), every
write fenced by its epoch; a standby stays idle and takes over when the leader
goes. SIGTERM or SIGINT drain in-flight writes within refresh.shutdown_timeout,
release the lease and exit 0. A second signal aborts at once.

SIGHUP, or a change to the config file, reloads the config: declarations are
added, removed or rescheduled without a restart; an invalid file is rejected
(logged, hearth_config_reloads_total{result="invalid"}) and the old config stays.
With HEARTH_ADMIN_TOKEN set, the admin API answers under /admin/ (see README).`,
		Example: `  hearth run --config config.yaml
  HEARTH_REDIS_PASSWORD=secret hearth run -c /etc/hearth/config.yaml
  HEARTH_ADMIN_TOKEN=$(openssl rand -hex 32) hearth run --listen 127.0.0.1:9464
  kill -HUP $(pidof hearth)   # reload the config`,
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

// daemon wires config → Redis → sources → lease → warmer → pre-warm → HTTP →
// jobs, campaigns (the leader loads, pre-warms and reports ready), waits for a
// signal, and closes in reverse order: the lease is released after the last write.
func daemon(ctx context.Context, g *globals, cfg *config.Config) error {
	// A failed HTTP listener ends the run as a signal does, then exits 1.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	log := newLogger(g.stderr, cfg.Log)
	log.Info().Str("version", version).Str("config", cfg.File).Int("declarations", len(cfg.Keys)).Msg("starting")
	hup := notifyHUP()
	defer signal.Stop(hup)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	rdb := newRedis(cfg.Redis)
	defer rdb.Close()
	if err := pingRedis(ctx, rdb, cfg.Redis); err != nil {
		return fail(exitFail, err)
	}
	sources, closeSources, err := openSources(ctx, cfg, reg, log)
	if err != nil {
		return fail(exitFail, err)
	}
	defer closeSources()

	lead, err := newLeadership(cfg, rdb, reg, log)
	if err != nil {
		return fail(exitFail, err)
	}
	specs := cfg.Specs()
	w, err := warmer.New(warmer.Options{
		Store: lead.store, Gate: lead.gate, Sources: sources, Specs: specs,
		MaxConcurrentLoads: cfg.Refresh.MaxConcurrentLoads, Registerer: reg, Logger: log,
	})
	if err != nil {
		return fail(exitFail, err)
	}
	pw, err := newDaemonPrewarm(cfg, w, sources, rdb, lead.leading, reg, log) // see prewarm.go
	if err != nil {
		return fail(exitFail, err)
	}
	srv, err := listen(cfg.HTTP.Listen, reg, log)
	if err != nil {
		return fail(exitFail, err)
	}
	srv.instance = lead.instance()
	adm := openAdmin(srv, w, lead.leading, reg, log)
	if adm != nil {
		adm.prewarm = pw.adminHooks()
	}
	srv.serve()
	go func() {
		select {
		case <-srv.failed():
			if err := srv.failure(); err != nil {
				log.Error().Err(err).Msg("http server failed: probes and metrics are gone; shutting down")
				stop(err)
			}
		case <-ctx.Done():
		}
	}()

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

	lead.prewarm = pw.startup
	if err := pw.open(ctx); err != nil {
		return fail(exitFail, err)
	}

	// Campaign; as leader: start-up load and pre-warm (or takeover catch-up), ready, jobs.
	sched, err := jobs.New(jobs.Options{Refresher: w, Specs: specs, Spread: cfg.Refresh.Spread, Elector: lead.elector, Logger: log})
	if err != nil {
		return fail(exitFail, err)
	}
	rl := openReloader(cfg, hup, w, sched, reg, log)
	adm.attach(sched, rl)
	go lead.run(ctx, w, sched, srv)

	<-ctx.Done()
	rl.close()
	log.Info().Dur("deadline", cfg.Refresh.ShutdownTimeout).Msg("shutting down: draining in-flight writes")
	srv.ready.Store(false)
	dctx, cancel := context.WithTimeout(runCtx, cfg.Refresh.ShutdownTimeout)
	defer cancel()
	var errs []error
	lead.wait()
	pw.close(dctx)
	if err := sched.Close(dctx); err != nil {
		errs = append(errs, fmt.Errorf("close scheduler: %w", err))
	}
	if err := adm.close(dctx); err != nil {
		errs = append(errs, err)
	}
	// After the last write: a standby takes over at once.
	if err := lead.release(dctx); err != nil {
		errs = append(errs, fmt.Errorf("release lease: %w", err))
	}
	if err := srv.shutdown(dctx); err != nil {
		errs = append(errs, fmt.Errorf("close http: %w", err))
	}
	if cause := context.Cause(runCtx); cause != nil {
		return fail(exitFail, cause)
	}
	if err := srv.failure(); err != nil {
		return fail(exitFail, err)
	}
	if len(errs) > 0 {
		log.Warn().Err(errors.Join(errs...)).Msg("shutdown incomplete")
	}
	log.Info().Msg("stopped")
	return nil
}
