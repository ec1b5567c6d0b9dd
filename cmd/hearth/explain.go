package main

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/daemon"
)

// explainPlans is `hearth validate --explain`.
func explainPlans(ctx context.Context, g *globals, cfg *config.Config, minRows int64) error {
	log := newLogger(g.stderr, cfg.Log)
	sources, err := daemon.OpenSources(ctx, cfg, prometheus.NewRegistry(), log)
	if err != nil {
		return fail(exitFail, err)
	}
	defer sources.Close()
	fs, errs := daemon.ExplainQueries(ctx, cfg, sources, minRows)
	for _, f := range fs {
		fmt.Fprintf(g.stdout, "plan: %s\n", f)
	}
	for _, err := range errs {
		fmt.Fprintf(g.stdout, "plan not checked: %v\n", err)
	}
	switch {
	case len(fs) > 0:
		return fail(exitFindings, fmt.Errorf("%d query plan finding(s)", len(fs)))
	case len(errs) > 0:
		return fail(exitFail, fmt.Errorf("%d query plan(s) not checked", len(errs)))
	}
	fmt.Fprintln(g.stdout, "query plans: ok")
	return nil
}
