package config

import (
	"regexp"
	"time"

	"github.com/hearth-dev/hearth/warmer"
)

// Notify subscribes a declaration to PostgreSQL change notifications: the
// trigger Hearth ships (`hearth notify-sql`) sends the changed members on
// Channel, and the leader refreshes exactly those.
type Notify struct {
	// Channel is the LISTEN channel, a plain identifier.
	Channel string `mapstructure:"channel"`
	// Coalesce is an extra wait before each change-driven refresh, to gather
	// more changes into it. Zero (the default) waits for nothing: a change
	// after an idle spell is refreshed at once, and the changes that arrive
	// while a refresh runs are gathered into the next.
	Coalesce time.Duration `mapstructure:"coalesce"`
}

// MaxCoalesce bounds notify.coalesce: longer belongs to the schedule.
const MaxCoalesce = 10 * time.Second

// identRe is a PostgreSQL identifier Hearth accepts as written (lower case,
// no quoting needed): a column or channel name.
var identRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// checkFreshness validates version_column and notify, and copies them into
// the declaration's spec.
func checkFreshness(c *checker, path, typ string, k Key, spec *warmer.Spec) {
	if k.VersionColumn != "" {
		switch {
		case typ != "postgres":
			c.add(path+".version_column", "needs a postgres source")
		case !identRe.MatchString(k.VersionColumn):
			c.add(path+".version_column", "must be a lower-case column name of the query (letters, digits, '_', at most 63; got %q)", truncate(k.VersionColumn))
		default:
			spec.VersionColumn = k.VersionColumn
		}
	}
	if k.Notify == nil {
		return
	}
	n := *k.Notify
	if typ != "postgres" {
		c.add(path+".notify", "needs a postgres source")
		return
	}
	if !identRe.MatchString(n.Channel) {
		c.add(path+".notify.channel", "must be a lower-case identifier (letters, digits, '_', at most 63; got %q)", truncate(n.Channel))
	}
	spec.Notify, spec.Coalesce = n.Channel, n.Coalesce
}
