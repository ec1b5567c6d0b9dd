package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/hearth-dev/hearth/migrations"
)

func newNotifySQLCmd(g *globals) *cobra.Command {
	var table, column string
	cmd := &cobra.Command{
		Use:   "notify-sql DECLARATION --table TABLE [--column COLUMN]",
		Short: "Print the SQL that attaches change notifications to a table",
		Long: `Notify-sql prints the CREATE TRIGGER statements that make PostgreSQL notify the
declaration's notify.channel whenever rows of TABLE are inserted, updated or
deleted, naming the changed members (the values of COLUMN, by default the key
template's parameter). Run it with psql; the trigger function hearth_notify()
comes with ` + "`hearth migrate up`" + `. Nothing is executed: review the SQL first.
Every name is printed quoted (as an identifier or a string literal, comments
included); a name with a control character (a newline, a tab, DEL, U+2028…)
is refused.

Exit codes: 0 printed, 2 a bad config, declaration or flag.`,
		Example: `  hearth migrate up --source catalog
  hearth notify-sql product --table products | psql -h 127.0.0.1 -U postgres -d test`,
		Args: func(cmd *cobra.Command, args []string) error {
			if err := cobra.ExactArgs(1)(cmd, args); err != nil {
				return fail(exitConfig, fmt.Errorf("notify-sql: %w", err))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			for _, s := range cfg.Specs() {
				if s.Name != args[0] {
					continue
				}
				if s.Notify == "" {
					return fail(exitConfig, fmt.Errorf("notify-sql: keys[%s].notify.channel is not set", s.Name))
				}
				// The flags are checked first, so that a refusal names the
				// flag the bad character came from.
				if _, err := migrations.SplitTable(table); err != nil {
					return fail(exitConfig, fmt.Errorf("notify-sql: --table %q: %w", table, err))
				}
				if column != "" {
					if err := migrations.CheckIdentifier(column); err != nil {
						return fail(exitConfig, fmt.Errorf("notify-sql: --column %q: %w", column, err))
					}
				}
				col := column
				if col == "" {
					col = s.Template.Param()
				}
				if col == "" {
					return fail(exitConfig, fmt.Errorf("notify-sql: keys[%s] is a single key: pass --column (any column of the table)", s.Name))
				}
				sql, err := migrations.NotifyTriggerSQL(s.Name, table, col, s.Notify)
				if err != nil {
					return fail(exitConfig, err)
				}
				fmt.Fprint(g.stdout, sql)
				return nil
			}
			return fail(exitConfig, fmt.Errorf("notify-sql: no declaration named %q", args[0]))
		},
	}
	cmd.Flags().StringVar(&table, "table", "", "table (or schema.table) whose changes notify the declaration")
	cmd.Flags().StringVar(&column, "column", "", "column holding the member (default the key template's parameter)")
	return cmd
}
