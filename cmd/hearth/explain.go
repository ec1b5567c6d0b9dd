package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"

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
		f.Filter = shortenArrays(f.Filter)
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

// arrayLiteral is an array constant as EXPLAIN prints a bound parameter:
// '{1,2,3}'.
var arrayLiteral = regexp.MustCompile(`'\{[^'{}]*\}'`)

// shortenArrays cuts every array constant of a plan's filter (the sample
// batch, 500 members by default) to its first elements and a count, so that a
// finding fits a line.
func shortenArrays(filter string) string {
	const keep = 3
	return arrayLiteral.ReplaceAllStringFunc(filter, func(lit string) string {
		elems := strings.Split(lit[2:len(lit)-2], ",")
		if len(elems) <= keep+1 {
			return lit
		}
		return fmt.Sprintf("'{%s,… %d more}'", strings.Join(elems[:keep], ","), len(elems)-keep)
	})
}
