package migrations

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// channelRe is a LISTEN channel Hearth accepts (the same rule as the config's
// notify.channel).
var channelRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// NotifyTriggerSQL returns the SQL that attaches hearth_notify() (migration
// 00005, `hearth migrate up`) to table for one declaration: three
// statement-level AFTER triggers (INSERT, UPDATE, DELETE; PostgreSQL allows
// transition tables on single-event triggers only) that send the changed
// values of column on channel. table may be schema-qualified (schema.table);
// every name is quoted as an identifier or a string literal, never spliced.
// Rerunning it replaces the triggers.
func NotifyTriggerSQL(declaration, table, column, channel string) (string, error) {
	if table == "" {
		return "", fmt.Errorf("notify sql: table: required")
	}
	if column == "" || len(column) > 63 || strings.ContainsRune(column, 0) {
		return "", fmt.Errorf("notify sql: column: must be 1-63 bytes without NUL (got %q)", column)
	}
	if !channelRe.MatchString(channel) {
		return "", fmt.Errorf("notify sql: channel: must be a lower-case identifier (got %q)", channel)
	}
	parts := strings.Split(table, ".")
	for _, p := range parts {
		if p == "" || len(p) > 63 || strings.ContainsRune(p, 0) {
			return "", fmt.Errorf("notify sql: table: %q is not a table or schema.table name", table)
		}
	}
	if len(parts) > 2 {
		return "", fmt.Errorf("notify sql: table: %q is not a table or schema.table name", table)
	}
	tbl := pgx.Identifier(parts).Sanitize()
	args := literal(channel) + ", " + literal(column)
	var b strings.Builder
	fmt.Fprintf(&b, "-- Change notifications of %s for declaration %s (channel %s, member column %s).\n", table, declaration, channel, column)
	b.WriteString("BEGIN;\n")
	for _, t := range []struct{ suffix, event, ref string }{
		{"ins", "INSERT", "NEW TABLE AS hearth_new"},
		{"upd", "UPDATE", "OLD TABLE AS hearth_old NEW TABLE AS hearth_new"},
		{"del", "DELETE", "OLD TABLE AS hearth_old"},
	} {
		name := pgx.Identifier{"hearth_" + declaration + "_" + t.suffix}.Sanitize()
		fmt.Fprintf(&b, "DROP TRIGGER IF EXISTS %s ON %s;\n", name, tbl)
		fmt.Fprintf(&b, "CREATE TRIGGER %s AFTER %s ON %s REFERENCING %s\n  FOR EACH STATEMENT EXECUTE FUNCTION hearth_notify(%s);\n", name, t.event, tbl, t.ref, args)
	}
	b.WriteString("COMMIT;\n")
	return b.String(), nil
}

// literal quotes s as a standard SQL string literal.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
