// Package daemon is `hearth run` as a library: it wires config → Redis →
// sources → leadership → warmer → pre-warm → HTTP → jobs → reload, runs until
// its context ends, and undoes everything it set up in reverse order. The
// command line (cmd/hearth) only maps flags to Options and errors to exit codes.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/catchup"
	"github.com/hearth-dev/hearth/changes"
	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/warmer"
)

// Options are what the command line gives the daemon besides its config.
type Options struct {
	// Logger receives every log line; the zero value logs nothing.
	Logger zerolog.Logger
	// Version is logged at start-up.
	Version string
	// Reload asks for the config file to be reloaded (cmd/hearth feeds it
	// from SIGHUP); nil for none.
	Reload <-chan struct{}
	// Abort, once closed, abandons the drain that follows the end of Run's
	// context (cmd/hearth closes it on a second SIGTERM/SIGINT); nil for none.
	Abort <-chan struct{}
}

// Daemon is one `hearth run`.
type Daemon struct {
	cfg  *config.Config
	opts Options
	log  zerolog.Logger
}

// New checks that the daemon can be built from cfg; Run connects and runs it.
func New(cfg *config.Config, opts Options) (*Daemon, error) {
	if cfg == nil {
		return nil, errors.New("daemon: no config")
	}
	return &Daemon{cfg: cfg, opts: opts, log: opts.Logger}, nil
}

// cleanups is a LIFO stack of what setup must undo: pushed as each piece is
// set up, run in reverse on any return, so that a setup error half way closes
// exactly what was opened.
type cleanups struct {
	steps []func(context.Context) error
}

func (c *cleanups) push(f func(context.Context) error) { c.steps = append(c.steps, f) }

// run runs every step, last pushed first, and joins their errors.
func (c *cleanups) run(ctx context.Context) error {
	var errs []error
	for i := len(c.steps) - 1; i >= 0; i-- {
		if err := c.steps[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	c.steps = nil
	return errors.Join(errs...)
}

// Run connects to Redis and every source (failing fast), campaigns (the
// leader loads, pre-warms and reports ready, then its jobs run), reloads the
// config on Options.Reload, POST /admin/reload or a file change, and waits for
// ctx to end. Then it drains in-flight writes within refresh.shutdown_timeout
// (closing Options.Abort abandons the drain), releases the lease after the
// last write and closes the rest in reverse order. A listener that fails
// mid-run ends Run with its error. A close step that fails for another reason
// than running out of the drain deadline (see abandoned) makes Run return its
// error; abandoning in-flight writes at the deadline is only logged.
func (d *Daemon) Run(ctx context.Context) (err error) {
	cfg, log := d.cfg, d.log
	// A failed HTTP listener ends the run as a signal does, then Run fails.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	log.Info().Str("version", d.opts.Version).Str("config", cfg.File).Int("declarations", len(cfg.Keys)).Msg("starting")

	// The drain context outlives ctx: only Abort ends it early.
	runCtx, abort := context.WithCancelCause(context.WithoutCancel(ctx))
	defer abort(nil)
	var undo cleanups
	// Cleanup runs on every return; on a setup error it is bounded by the
	// shutdown timeout too, not by the ctx that may have ended.
	defer func() {
		dctx, cancel := context.WithTimeout(runCtx, cfg.Refresh.ShutdownTimeout)
		defer cancel()
		if cerr := undo.run(dctx); cerr != nil && err == nil {
			log.Warn().Err(cerr).Msg("shutdown incomplete")
		}
	}()

	// The watchers below live through the drain (Abort ends it)
	// and are the last to stop: this step is pushed first.
	quit := make(chan struct{})
	var watchers sync.WaitGroup
	undo.push(func(context.Context) error { close(quit); watchers.Wait(); return nil })

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	rdb := NewRedis(cfg.Redis)
	undo.push(func(context.Context) error { _ = rdb.Close(); return nil })
	if err := pingRedis(ctx, rdb, cfg.Redis); err != nil {
		return err
	}
	sources, err := OpenSources(ctx, cfg, reg, log)
	if err != nil {
		return err
	}
	undo.push(func(context.Context) error { sources.Close(); return nil })
	warnPlans(ctx, cfg, sources, log)
	for _, w := range cfg.Warnings() {
		log.Warn().Str("warning", w).Msg("config allows this, but it weakens a guarantee")
	}

	lead, err := newLeadership(cfg, rdb, reg, log)
	if err != nil {
		return err
	}
	undo.push(lead.close)
	specs := cfg.Specs()
	w, err := warmer.New(warmer.Options{
		Store: lead.store, Gate: lead.gate, Sources: sources.Guarded, Specs: specs,
		MaxConcurrentLoads: cfg.Refresh.MaxConcurrentLoads, Registerer: reg, Logger: log,
	})
	if err != nil {
		return err
	}
	pw, err := newDaemonPrewarm(cfg, w, sources, lead, rdb, reg, log)
	if err != nil {
		return err
	}
	srv, err := listen(cfg.HTTP.Listen, cfg.HTTP.ProbeListen, lead.instance(), reg, log)
	if err != nil {
		return err
	}
	if cfg.HTTP.Pprof {
		srv.servePprof()
	}
	// Mounted before the listener serves: a client that reaches /healthz
	// finds the admin routes too (it once saw 404 in between).
	adm := openAdmin(srv, w, lead.Leading, pw, reg, log)
	srv.serve()
	undo.push(func(ctx context.Context) error {
		if err := srv.shutdown(ctx); err != nil {
			return fmt.Errorf("close http: %w", err)
		}
		return nil
	})
	// After the last write (the steps pushed below run first): a standby takes over at once.
	undo.push(func(ctx context.Context) error {
		if err := lead.release(ctx); err != nil {
			return fmt.Errorf("release lease: %w", err)
		}
		return nil
	})
	// The warmer's own work (a refresh after an origin's recovery) ends
	// before the lease is released, after everything that asks it to refresh.
	undo.push(func(context.Context) error { w.Close(); return nil })
	undo.push(adm.Close)
	// Change-driven refresh (notify declarations): a service of the term.
	chg, err := changes.New(w, changes.Options{Specs: specs, DSNs: changeDSNs(cfg), Registerer: reg, Logger: log, ConnectTimeout: ConnectTimeout})
	if err != nil {
		return err
	}
	undo.push(chg.Close)
	watchers.Go(func() {
		select {
		case <-srv.failed():
			if err := srv.failure(); err != nil {
				log.Error().Err(err).Msg("http server failed: probes and metrics are gone; shutting down")
				stop(err)
			}
		case <-ctx.Done():
		case <-quit:
		}
	})
	watchers.Go(func() {
		select {
		case <-ctx.Done():
		case <-quit:
			return
		}
		select {
		case <-d.opts.Abort:
			log.Warn().Msg("second signal: aborting")
			abort(errors.New("aborted by a second signal"))
		case <-runCtx.Done():
		case <-quit:
		}
	})

	// Campaign; each term runs the leader's work (term.go).
	sched, err := jobs.New(jobs.Options{Refresher: w, Specs: specs, Spread: cfg.Refresh.Spread, Logger: log})
	if err != nil {
		return err
	}
	hot, err := newHotSets(cfg, w, sources, reg, log)
	if err != nil {
		return err
	}
	// The warmer takes each new snapshot first, so that a newly scheduled
	// declaration finds itself there on its first run.
	rl := newReloader(cfg, d.opts.Reload, w, reg, log)
	rl.subscribe(func(s *snapshot) { sched.Apply(s.specs()) })
	rl.subscribe(func(s *snapshot) { hot.sets.Declare(s.specs()) })
	rl.subscribe(func(s *snapshot) {
		if err := chg.Apply(s.specs()); err != nil {
			rl.log.Warn().Err(err).Msg("change listeners not updated: they keep listening as the last config they ran with")
		}
	})
	rl.open()
	adm.Attach(sched, rl.status, rl.adminReload)
	work := &termWork{
		w: w, sched: sched, srv: srv, prewarm: pw.startup,
		// The catch-up asks this instance's schedule when it will really
		// write each key next.
		catchUp:  catchup.Options{Schedule: sched, Spread: cfg.Refresh.Spread},
		services: append([]func(context.Context) error{chg.Run, hot.Run}, pw.services()...),
		standby:  func(ctx context.Context) { reportStandby(ctx, lead, srv, log) },
	}
	// The campaign's goroutine (and the term it runs) is waited for before
	// anything it uses closes, and after the schedule drained: the term's
	// group waits for the schedule's runs.
	lead.start(ctx, work)
	undo.push(func(context.Context) error { lead.wait(); return nil })
	undo.push(func(ctx context.Context) error {
		if err := sched.Close(ctx); err != nil {
			return fmt.Errorf("close scheduler: %w", err)
		}
		return nil
	})
	undo.push(func(context.Context) error { rl.close(); return nil })

	<-ctx.Done()
	log.Info().Dur("deadline_ms", cfg.Refresh.ShutdownTimeout).Msg("shutting down: draining in-flight writes")
	srv.ready.Store(false)
	dctx, cancel := context.WithTimeout(runCtx, cfg.Refresh.ShutdownTimeout)
	defer cancel()
	cerr := undo.run(dctx)
	if cause := context.Cause(runCtx); cause != nil {
		return cause
	}
	if err := srv.failure(); err != nil {
		return err
	}
	if cerr != nil {
		if !abandoned(cerr) {
			log.Error().Err(cerr).Msg("shutdown failed")
			return fmt.Errorf("shutdown: %w", cerr)
		}
		log.Warn().Err(cerr).Dur("deadline_ms", cfg.Refresh.ShutdownTimeout).
			Msg("shutdown deadline reached: in-flight writes abandoned")
	}
	log.Info().Msg("stopped")
	return nil
}

// abandoned reports whether a shutdown error only says that the drain
// deadline (refresh.shutdown_timeout, or the lease release's own bound) ran
// out: every error it joins is, or wraps nothing but, context.DeadlineExceeded.
// That is expected (in-flight writes abandoned; exit 0). Anything else, such
// as a lease release Redis refused, a listener that would not close or a
// scheduler that failed to stop, is a real failure (exit 1).
func abandoned(err error) bool {
	switch e := err.(type) {
	case nil:
		return true
	case interface{ Unwrap() []error }:
		for _, x := range e.Unwrap() {
			if !abandoned(x) {
				return false
			}
		}
		return true
	case interface{ Unwrap() error }:
		if inner := e.Unwrap(); inner != nil {
			return abandoned(inner)
		}
		return false
	default:
		return errors.Is(err, context.DeadlineExceeded)
	}
}
