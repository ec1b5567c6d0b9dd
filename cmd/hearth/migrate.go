package main

import (
	"context"
	"fmt"
	"io"
	"path"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/spf13/cobra"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/daemon"
	"github.com/hearth-dev/hearth/migrations"
	"github.com/hearth-dev/hearth/sources/postgres"
)

func newMigrateCmd(g *globals) *cobra.Command {
	var source string
	cmd := &cobra.Command{
		Use:   "migrate up|down|status",
		Short: "Create, drop or show Hearth's tables (the access log) and hearth_notify()",
		Long: `Migrate runs Hearth's own SQL migrations (embedded in the binary, run by goose)
against the postgres source named by access_log.source, or by --source:

  up      apply every pending migration
  down    roll back the last applied migration
  status  list the migrations and when each was applied

They create the access-log tables and the trigger function hearth_notify() that
change notifications use (attach it to a table with ` + "`hearth notify-sql`" + `).

Exit codes: 0 done, 1 the database is unreachable or a migration failed, 2 a bad
config, action or flag.

Hearth records its history in the table ` + migrations.VersionTable + `, so an
application's own goose table is never touched. Two migrations started at once
run one after the other (advisory lock).`,
		Example: `  hearth migrate up --config config.yaml
  hearth migrate status --source catalog`,
		ValidArgs: []string{"up", "down", "status"},
		Args: func(cmd *cobra.Command, args []string) error {
			if err := cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs)(cmd, args); err != nil {
				return fail(exitConfig, fmt.Errorf("migrate: %w (want up, down or status)", err))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			dsn, err := migrateDSN(cfg, source)
			if err != nil {
				return fail(exitConfig, err)
			}
			return migrate(cmd.Context(), g.stdout, dsn, args[0])
		},
	}
	cmd.Flags().StringVar(&source, "source", "", "postgres source to migrate (default access_log.source)")
	return cmd
}

// migrateDSN finds the DSN of the postgres source that holds the access log.
func migrateDSN(cfg *config.Config, name string) (string, error) {
	field := "--source"
	if name == "" {
		name, field = cfg.AccessLog.Source, "access_log.source"
	}
	if name == "" {
		return "", fmt.Errorf("no database to migrate: set access_log.source or pass --source NAME (a postgres source)")
	}
	for _, s := range cfg.Sources {
		if s.Name != name {
			continue
		}
		if s.Type != "postgres" {
			return "", fmt.Errorf("%s: must name a postgres source (%q is %s)", field, name, s.Type)
		}
		return s.DSN, nil
	}
	return "", fmt.Errorf("%s: names no configured source (got %q)", field, name)
}

func migrate(ctx context.Context, out io.Writer, dsn, action string) error {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return fail(exitConfig, fmt.Errorf("migrate: parse dsn: %w", postgres.RedactError(err, dsn)))
	}
	cc.RuntimeParams["application_name"] = "hearth-migrate"
	db := stdlib.OpenDB(*cc)
	defer db.Close()
	pctx, cancel := context.WithTimeout(ctx, daemon.ConnectTimeout)
	err = db.PingContext(pctx)
	cancel()
	if err != nil {
		return fail(exitFail, fmt.Errorf("migrate: %s unreachable: %w", postgres.Redact(dsn), postgres.RedactError(err, dsn)))
	}
	p, err := migrations.NewProvider(db)
	if err != nil {
		return fail(exitFail, err)
	}
	switch action {
	case "up":
		res, err := p.Up(ctx)
		printResults(out, res)
		if err != nil {
			return fail(exitFail, fmt.Errorf("migrate up: %w", err))
		}
		if len(res) == 0 {
			fmt.Fprintln(out, "up to date")
		}
	case "down":
		res, err := p.Down(ctx)
		if res != nil {
			printResults(out, []*goose.MigrationResult{res})
		}
		if err != nil {
			return fail(exitFail, fmt.Errorf("migrate down: %w", err))
		}
	case "status":
		return migrateStatus(ctx, out, p)
	}
	return nil
}

func printResults(out io.Writer, res []*goose.MigrationResult) {
	for _, r := range res {
		fmt.Fprintln(out, r.String())
	}
}

func migrateStatus(ctx context.Context, out io.Writer, p *goose.Provider) error {
	st, err := p.Status(ctx)
	if err != nil {
		return fail(exitFail, fmt.Errorf("migrate status: %w", err))
	}
	fmt.Fprintf(out, "%-8s %-22s %s\n", "version", "applied", "migration")
	for _, s := range st {
		applied := "pending"
		if s.State == goose.StateApplied {
			applied = s.AppliedAt.UTC().Format(time.DateTime)
		}
		fmt.Fprintf(out, "%-8d %-22s %s\n", s.Source.Version, applied, path.Base(s.Source.Path))
	}
	return nil
}
