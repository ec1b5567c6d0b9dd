package daemon

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/sources/postgres"
)

// explainTimeout bounds the plan check of one declaration.
const explainTimeout = 5 * time.Second

// ExplainQueries checks the plan of every postgres declaration's query (see
// postgres.Source.Explain): a family's query is explained with a sample batch
// bound as loads bind it. It returns the findings, and the errors of the
// queries that could not be explained; it never stops at one.
func ExplainQueries(ctx context.Context, cfg *config.Config, sources *Sources, minRows int64) ([]postgres.PlanFinding, []error) {
	var (
		out  []postgres.PlanFinding
		errs []error
	)
	for _, s := range cfg.Specs() {
		src, ok := sources.postgres[s.Source]
		if !ok {
			continue
		}
		ectx, cancel := context.WithTimeout(ctx, explainTimeout)
		fs, err := src.Explain(ectx, s, postgres.ExplainSample(s), minRows)
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, fs...)
	}
	return out, errs
}

// warnPlans is the start-up plan check: each finding is a warning, never fatal.
func warnPlans(ctx context.Context, cfg *config.Config, sources *Sources, log zerolog.Logger) {
	fs, errs := ExplainQueries(ctx, cfg, sources, postgres.DefaultExplainMinRows)
	for _, f := range fs {
		log.Warn().Str("family", f.Declaration).Str("relation", f.Relation).Int64("rows", f.Rows).
			Str("filter", f.Filter).Str("advice", f.Advice).Msg("query plan: sequential scan on every refresh of this declaration")
	}
	for _, err := range errs {
		log.Warn().Err(err).Msg("query plan not checked")
	}
}
