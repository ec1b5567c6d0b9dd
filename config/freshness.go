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
	// Gather is how long, under sustained change (the last refresh carried
	// more than one member and more arrived while it ran), a members refresh
	// waits from its first member's arrival to gather more, never past a
	// full batch. Zero is the default, DefaultGather.
	Gather time.Duration `mapstructure:"gather"`
}

// MaxCoalesce bounds notify.coalesce and notify.gather: longer belongs to
// the schedule.
const MaxCoalesce = 10 * time.Second

// DefaultGather is notify.gather's default. At 2,000 changes a second on a
// quiet 2-core machine (BenchmarkChangeLatency with HEARTH_BENCH_GATHER,
// docs/freshness.md): 1 ms loaded 2.2 members a load at 22 % of a core, p50
// 1.5 ms; 3 ms four members at 18 %, p50 3 ms, p99 7–11 ms; 5 ms seven at
// 15–19 %, p50 4.4–6 ms, p99 10–29 ms.
const DefaultGather = 3 * time.Millisecond

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
	spec.Notify, spec.Coalesce, spec.Gather = n.Channel, n.Coalesce, n.Gather
	if spec.Gather == 0 {
		spec.Gather = DefaultGather
	}
}
