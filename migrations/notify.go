package migrations

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// channelRe is a LISTEN channel Hearth accepts (the same rule as the config's
// notify.channel).
var channelRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// maxIdentifier is PostgreSQL's identifier length (NAMEDATALEN - 1): a longer
// name is silently truncated by the server.
const maxIdentifier = 63

// ErrIdentifier is a name notify-sql will not put into SQL.
var ErrIdentifier = errors.New("not a usable identifier")

// CheckIdentifier reports whether s can be a PostgreSQL identifier in the SQL
// notify-sql prints: 1-63 bytes of valid UTF-8 without control characters
// (any rune below 0x20, DEL, C1 controls, U+2028/U+2029). Quoting alone would
// make any such name safe for the server, but a control character in a script
// piped into psql is a trap (a newline ends a comment, starts a meta-command)
// and is never a real table's name: it is refused, naming the character.
func CheckIdentifier(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty", ErrIdentifier)
	case len(s) > maxIdentifier:
		return fmt.Errorf("%w: %d bytes, PostgreSQL allows %d", ErrIdentifier, len(s), maxIdentifier)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: not valid UTF-8", ErrIdentifier)
	}
	for i, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u2028' || r == '\u2029' {
			return fmt.Errorf("%w: control character %U at byte %d", ErrIdentifier, r, i)
		}
	}
	return nil
}

// SplitTable splits table into its schema (may be empty) and name, each
// checked by CheckIdentifier. A name with a dot in it cannot be given.
func SplitTable(table string) ([]string, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%w: %q is not a table or schema.table name", ErrIdentifier, table)
	}
	for _, p := range parts {
		if err := CheckIdentifier(p); err != nil {
			if len(parts) == 2 {
				return nil, fmt.Errorf("%q of schema.table: %w", p, err)
			}
			return nil, err
		}
	}
	return parts, nil
}

// NotifyTriggerSQL returns the SQL that attaches hearth_notify() (migration
// 00005, `hearth migrate up`) to table for one declaration: three
// statement-level AFTER triggers (INSERT, UPDATE, DELETE; PostgreSQL allows
// transition tables on single-event triggers only) that send the changed
// values of column on channel. table may be schema-qualified (schema.table).
// Every name is checked by CheckIdentifier and appears only quoted, as an
// identifier or a string literal, comments included; nothing is spliced.
// Rerunning it replaces the triggers.
func NotifyTriggerSQL(declaration, table, column, channel string) (string, error) {
	if err := CheckIdentifier(declaration); err != nil {
		return "", fmt.Errorf("notify sql: declaration %q: %w", declaration, err)
	}
	parts, err := SplitTable(table)
	if err != nil {
		return "", fmt.Errorf("notify sql: table %q: %w", table, err)
	}
	if err := CheckIdentifier(column); err != nil {
		return "", fmt.Errorf("notify sql: column %q: %w", column, err)
	}
	if !channelRe.MatchString(channel) {
		return "", fmt.Errorf("notify sql: channel: must be a lower-case identifier (got %q)", channel)
	}
	tbl := pgx.Identifier(parts).Sanitize()
	args := Literal(channel) + ", " + Literal(column)
	var b strings.Builder
	fmt.Fprintf(&b, "-- Change notifications of %s for declaration %s (channel %s, member column %s).\n",
		tbl, pgx.Identifier{declaration}.Sanitize(), Literal(channel), pgx.Identifier{column}.Sanitize())
	b.WriteString("BEGIN;\n")
	for _, t := range []struct{ suffix, event, ref string }{
		{"ins", "INSERT", "NEW TABLE AS hearth_new"},
		{"upd", "UPDATE", "OLD TABLE AS hearth_old NEW TABLE AS hearth_new"},
		{"del", "DELETE", "OLD TABLE AS hearth_old"},
	} {
		name := pgx.Identifier{triggerName(declaration, t.suffix)}.Sanitize()
		fmt.Fprintf(&b, "DROP TRIGGER IF EXISTS %s ON %s;\n", name, tbl)
		fmt.Fprintf(&b, "CREATE TRIGGER %s AFTER %s ON %s REFERENCING %s\n  FOR EACH STATEMENT EXECUTE FUNCTION hearth_notify(%s);\n", name, t.event, tbl, t.ref, args)
	}
	b.WriteString("COMMIT;\n")
	return b.String(), nil
}

// triggerName is hearth_<declaration>_<suffix>, shortened with a hash of the
// declaration when it would pass 63 bytes: the server would truncate the
// three names to the same one.
func triggerName(declaration, suffix string) string {
	name := "hearth_" + declaration + "_" + suffix
	if len(name) <= maxIdentifier {
		return name
	}
	sum := sha256.Sum256([]byte(declaration))
	keep := maxIdentifier - len("hearth_") - 1 - 12 - 1 - len(suffix)
	prefix := declaration[:keep]
	for !utf8.ValidString(prefix) {
		prefix = prefix[:len(prefix)-1]
	}
	return "hearth_" + prefix + "_" + hex.EncodeToString(sum[:6]) + "_" + suffix
}

// Literal quotes s as a PostgreSQL string literal the way quote_literal does:
// quotes doubled, and a value with a backslash written as an E-string with
// the backslashes doubled, so that it means the same whatever the session's
// standard_conforming_strings.
func Literal(s string) string {
	s = strings.ReplaceAll(s, "'", "''")
	if strings.Contains(s, `\`) {
		return `E'` + strings.ReplaceAll(s, `\`, `\\`) + "'"
	}
	return "'" + s + "'"
}
