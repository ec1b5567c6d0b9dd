package config

import (
	"time"
)

// AccessLog is where the application's cache reads are counted: the
// hearth_access_log table (see `hearth migrate`) in a postgres source, and the
// per-bucket Redis sorted sets that Hearth rolls up into it.
type AccessLog struct {
	// Source names the postgres source holding hearth_access_log; empty means
	// there is no access log, and pre-warm loads the declared single keys only.
	Source string `mapstructure:"source"`
	// Bucket is the width of a time bucket: reads are counted per key per bucket.
	// Applications compute a bucket's start as floor(unix seconds / bucket).
	Bucket time.Duration `mapstructure:"bucket"`
	// RollupInterval is how often the leader moves closed Redis buckets
	// (<namespace>:access:<bucket start>) into the table; 0 disables the roll-up.
	RollupInterval time.Duration `mapstructure:"rollup_interval"`
	// Retention is how long rows are kept in the table; 0 keeps them forever.
	Retention time.Duration `mapstructure:"retention"`
	// RankInterval is how often the leader stores the ranking of the top
	// prewarm.top_n keys over prewarm.window, which pre-warms then read at once
	// instead of ranking the whole window themselves; a ranking older than
	// three intervals is not used. 0 disables it: every pre-warm ranks live.
	RankInterval time.Duration `mapstructure:"rank_interval"`
}

// RankMaxAge is how old a stored ranking may be and still stand in for a live one.
func (a AccessLog) RankMaxAge() time.Duration { return 3 * a.RankInterval }

// Prewarm bounds the pre-warm: what it loads (declared single keys plus the
// top-N keys of the access log over a window) and how hard it may press the
// origin while doing so.
type Prewarm struct {
	// Enabled runs the pre-warm at start-up, before /readyz reports ready.
	Enabled bool `mapstructure:"enabled"`
	// TopN is how many access-log keys are loaded, hottest first.
	TopN int `mapstructure:"top_n"`
	// Window is how far back the access log is read.
	Window time.Duration `mapstructure:"window"`
	// Concurrency bounds the batch loads in flight during a pre-warm (within
	// refresh.max_concurrent_loads, which bounds everything together).
	Concurrency int `mapstructure:"concurrency"`
	// Rate bounds the batch loads started per second; 0 means no bound.
	Rate float64 `mapstructure:"rate"`
	// RewarmCheck is how often the leader checks whether Redis lost its data
	// (restarted or flushed), to re-run the pre-warm; 0 disables the check.
	RewarmCheck time.Duration `mapstructure:"rewarm_check"`
}

func defaultAccessLog() AccessLog {
	return AccessLog{
		Bucket:         time.Minute,
		RollupInterval: 15 * time.Second,
		Retention:      48 * time.Hour,
		RankInterval:   time.Minute,
	}
}

func defaultPrewarm() Prewarm {
	return Prewarm{
		Enabled:     true,
		TopN:        10_000,
		Window:      time.Hour,
		Concurrency: 4,
		Rate:        50,
		RewarmCheck: 2 * time.Second,
	}
}

// Bounds of the pre-warm settings.
const (
	maxTopN               = 1_000_000
	maxPrewarmConcurrency = 256
	minRewarmCheck        = 100 * time.Millisecond
	maxBucket             = 24 * time.Hour
)

func (cfg *Config) validatePrewarm(c *checker, sourceTypes map[string]string) {
	a, p := cfg.AccessLog, cfg.Prewarm
	if a.Source != "" {
		switch typ, ok := sourceTypes[a.Source]; {
		case !ok:
			c.add("access_log.source", "names no configured source (got %q)", a.Source)
		case typ != "postgres":
			c.add("access_log.source", "must name a postgres source (%q is %s)", a.Source, typ)
		}
	}
	if a.Retention > 0 && a.Retention < p.Window {
		c.add("access_log.retention", "must be 0 (keep every row) or at least prewarm.window %s (got %s)", p.Window, a.Retention)
	}

	if p.Window < a.Bucket {
		c.add("prewarm.window", "must be at least access_log.bucket %s (got %s)", a.Bucket, p.Window)
	}
}
