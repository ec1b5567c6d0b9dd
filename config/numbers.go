package config

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// MaxDuration bounds every duration in the config (a year). Hearth multiplies
// and adds durations (ttl × (1 + jitter/2), interval + load_timeout, three rank
// intervals, now − retention); below this bound none of them can overflow
// int64 nanoseconds (292 years) or Redis's PX milliseconds, so a jittered TTL
// never wraps round to a negative or a 1 ms expiry.
const MaxDuration = 365 * 24 * time.Hour

// Smallest periods: below them a schedule or a loop spins rather than waits
// (gocron computing the next run of a 1 ns interval never returns).
const (
	// MinInterval is the shortest refresh interval (keys[].interval).
	MinInterval = 100 * time.Millisecond
	// MinPeriod is the shortest period of the lease's loops
	// (leader.renew_interval, leader.retry_period).
	MinPeriod = 10 * time.Millisecond
	// MinTimeout is the shortest timeout anywhere: Redis's expiries and
	// PostgreSQL's statement_timeout count whole milliseconds.
	MinTimeout = time.Millisecond
)

// Limits of a few sizes.
const (
	maxRedisValue = 512 << 20 // Redis's largest string
	maxBatchSize  = 100_000
	maxMembers    = 100_000_000
)

// Bound is the range one number or duration field of the config may take.
// Every such field has exactly one (TestEveryFieldBounded), docs/configuration.md
// prints them all (TestBoundsDocumented), and one walk checks them
// (checkNumbers).
type Bound struct {
	// Path names the field; a list item is written [] (keys[].ttl).
	Path string
	// Min and Max bound a duration, inclusive.
	Min, Max time.Duration
	// Lo and Hi bound a number, inclusive unless HiOpen.
	Lo, Hi float64
	HiOpen bool
	// Zero, when set, is what 0 means: 0 is then accepted below the minimum.
	Zero string
	// Step, for a duration, is the unit it must be a whole number of.
	Step time.Duration
}

// Bounds is the table. Cross-field rules (interval at most ttl/2, the timing
// rule, a window at least a bucket, ...) stay with the fields they relate, in
// validate.go; this table holds what each field may be on its own.
var Bounds = []Bound{
	{Path: "redis.db", Lo: 0, Hi: 65535},
	{Path: "redis.pool_size", Lo: 1, Hi: 10_000, Zero: "the client's default"},
	{Path: "redis.dial_timeout", Min: 10 * time.Millisecond, Max: 5 * time.Minute},
	{Path: "redis.read_timeout", Min: 10 * time.Millisecond, Max: 5 * time.Minute},
	{Path: "redis.write_timeout", Min: 10 * time.Millisecond, Max: 5 * time.Minute},

	{Path: "refresh.max_concurrent_loads", Lo: 1, Hi: 4096},
	{Path: "refresh.batch_size", Lo: 1, Hi: maxBatchSize},
	{Path: "refresh.load_timeout", Min: MinTimeout, Max: MaxDuration},
	{Path: "refresh.spread", Lo: 0, Hi: 0.9},
	{Path: "refresh.shutdown_timeout", Min: 100 * time.Millisecond, Max: time.Hour},
	{Path: "refresh.jitter", Lo: 0, Hi: 1, HiOpen: true},
	{Path: "refresh.negative_ttl", Min: 100 * time.Millisecond, Max: MaxDuration},
	{Path: "refresh.max_stale", Min: MinTimeout, Max: MaxDuration, Zero: "never extend a value"},
	{Path: "refresh.max_value_bytes", Lo: 1, Hi: maxRedisValue},
	{Path: "refresh.max_members", Lo: 1, Hi: maxMembers},
	{Path: "refresh.max_inflight_bytes", Lo: 1 << 20, Hi: 16 << 30},

	{Path: "leader.lease", Min: MinLease, Max: MaxDuration, Zero: "picked to fit the takeover margin"},
	{Path: "leader.renew_interval", Min: MinPeriod, Max: MaxDuration, Zero: "lease/3"},
	{Path: "leader.retry_period", Min: MinPeriod, Max: MaxDuration, Zero: "1s or lease/5"},
	{Path: "leader.failover_grace", Min: MinPeriod, Max: MaxFailoverGrace, Zero: "off; default 30s, a Cluster only"},

	{Path: "sources[].max_conns", Lo: 1, Hi: 10_000, Zero: "pgx's default"},
	{Path: "sources[].statement_timeout", Min: MinTimeout, Max: MaxDuration, Zero: "no timeout", Step: time.Millisecond},
	{Path: "sources[].timeout", Min: MinTimeout, Max: MaxDuration, Zero: "unset, for a postgres source"},
	{Path: "sources[].concurrency", Lo: 1, Hi: 1024, Zero: "the default"},
	{Path: "sources[].max_body_bytes", Lo: 1, Hi: maxRedisValue, Zero: "the default"},
	{Path: "sources[].max_in_flight", Lo: 1, Hi: 1024, Zero: "the default 4"},
	{Path: "sources[].rate", Lo: 0, Hi: 1e6, Zero: "unlimited"},
	{Path: "sources[].burst", Lo: 1, Hi: 1e6, Zero: "max_in_flight"},
	{Path: "sources[].attempt_timeout", Min: MinTimeout, Max: MaxDuration, Zero: "only load_timeout"},
	{Path: "sources[].retries", Lo: 0, Hi: 10},
	{Path: "sources[].retry_backoff", Min: MinTimeout, Max: time.Hour, Zero: "the default 100ms"},
	{Path: "sources[].retry_max_backoff", Min: MinTimeout, Max: time.Hour, Zero: "the default 2s"},
	{Path: "sources[].breaker.failures", Lo: 0, Hi: 1000, Zero: "no breaker"},
	{Path: "sources[].breaker.open_for", Min: 100 * time.Millisecond, Max: MaxDuration, Zero: "the default 30s"},
	{Path: "sources[].breaker.probe_interval", Min: 100 * time.Millisecond, Max: MaxDuration, Zero: "the default 1s"},

	{Path: "keys[].ttl", Min: 100 * time.Millisecond, Max: MaxDuration},
	{Path: "keys[].interval", Min: MinInterval, Max: MaxDuration, Zero: "ttl/2"},
	{Path: "keys[].load_timeout", Min: MinTimeout, Max: MaxDuration, Zero: "refresh.load_timeout"},
	{Path: "keys[].jitter", Lo: 0, Hi: 1, HiOpen: true},
	{Path: "keys[].max_members", Lo: 1, Hi: maxMembers, Zero: "refresh.max_members"},
	{Path: "keys[].batch_size", Lo: 1, Hi: maxBatchSize, Zero: "refresh.batch_size"},
	{Path: "keys[].max_param_len", Lo: 1, Hi: 1024, Zero: "the default"},
	{Path: "keys[].negative_ttl", Min: 100 * time.Millisecond, Max: MaxDuration, Zero: "refresh.negative_ttl, at most ttl"},
	{Path: "keys[].max_stale", Min: MinTimeout, Max: MaxDuration, Zero: "never extend a value"},
	{Path: "keys[].max_value_bytes", Lo: 1, Hi: maxRedisValue, Zero: "refresh.max_value_bytes"},
	{Path: "keys[].members_from.access_log.top_n", Lo: 1, Hi: maxTopN},
	{Path: "keys[].members_from.access_log.window", Min: time.Second, Max: MaxDuration, Zero: "prewarm.window"},
	{Path: "keys[].members_from.access_log.rank_interval", Min: minHotRankInterval, Max: MaxDuration, Zero: "access_log.rank_interval, or 1m"},
	{Path: "keys[].members_from.access_log.hysteresis", Lo: 0, Hi: 1},
	{Path: "keys[].members_from.access_log.demote_after", Lo: 1, Hi: maxDemoteAfter, Zero: "the default 2"},
	{Path: "keys[].notify.coalesce", Min: MinTimeout, Max: MaxCoalesce, Zero: "no extra wait"},
	{Path: "keys[].notify.gather", Min: MinTimeout, Max: MaxCoalesce, Zero: "the default 3ms"},

	{Path: "access_log.bucket", Min: time.Second, Max: maxBucket, Step: time.Second},
	{Path: "access_log.rollup_interval", Min: time.Second, Max: MaxDuration, Zero: "no roll-up"},
	{Path: "access_log.retention", Min: time.Second, Max: MaxDuration, Zero: "keep every row"},
	{Path: "access_log.rank_interval", Min: time.Second, Max: MaxDuration, Zero: "rank live"},

	{Path: "prewarm.top_n", Lo: 0, Hi: maxTopN},
	{Path: "prewarm.window", Min: time.Second, Max: MaxDuration},
	{Path: "prewarm.concurrency", Lo: 1, Hi: maxPrewarmConcurrency},
	{Path: "prewarm.rate", Lo: 0, Hi: 1e6, Zero: "no bound"},
	{Path: "prewarm.rewarm_check", Min: minRewarmCheck, Max: MaxDuration, Zero: "no check"},
}

var (
	durationType = reflect.TypeFor[time.Duration]()
	boundsByPath = func() map[string]Bound {
		m := make(map[string]Bound, len(Bounds))
		for _, b := range Bounds {
			m[b.Path] = b
		}
		return m
	}()
)

// checkDuration returns what is wrong with d, or "".
func (b Bound) checkDuration(d time.Duration) string {
	switch {
	case d == 0 && b.Zero != "":
		return ""
	case d < b.Min && b.Zero != "":
		return fmt.Sprintf("must be 0 (%s) or at least %s (got %s)", b.Zero, b.Min, d)
	case d < b.Min:
		return fmt.Sprintf("must be at least %s (got %s)", b.Min, d)
	case d > b.Max && b.Max == MaxDuration:
		return fmt.Sprintf("must be at most %s, a year (got %s)", b.Max, d)
	case d > b.Max:
		return fmt.Sprintf("must be at most %s (got %s)", b.Max, d)
	case b.Step > 0 && d%b.Step != 0:
		return fmt.Sprintf("must be a whole number of %s (got %s)", stepName(b.Step), d)
	}
	return ""
}

// checkNumber returns what is wrong with x, or "".
func (b Bound) checkNumber(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return fmt.Sprintf("must be a finite number (got %g)", x)
	}
	if x == 0 && b.Zero != "" {
		return ""
	}
	if x >= b.Lo && (x < b.Hi || (!b.HiOpen && x == b.Hi)) {
		return ""
	}
	rng := fmt.Sprintf("between %s and %s", num(b.Lo), num(b.Hi))
	if b.HiOpen {
		rng = fmt.Sprintf("at least %s and below %s", num(b.Lo), num(b.Hi))
	}
	switch {
	case b.Zero != "" && b.Lo == 0:
		return fmt.Sprintf("must be between 0 (%s) and %s (got %s)", b.Zero, num(b.Hi), num(x))
	case b.Zero != "":
		return fmt.Sprintf("must be 0 (%s) or %s (got %s)", b.Zero, rng, num(x))
	}
	return fmt.Sprintf("must be %s (got %s)", rng, num(x))
}

func num(x float64) string {
	if math.Abs(x) < 1e15 {
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	return strconv.FormatFloat(x, 'g', -1, 64)
}

func stepName(d time.Duration) string {
	switch d {
	case time.Millisecond:
		return "milliseconds"
	case time.Second:
		return "seconds"
	}
	return d.String() + "s"
}

// checkNumbers walks the whole config, so that a field added later is covered
// too, and checks every number and duration against its Bound: a float must
// be finite (NaN compares false both ways and would slip through every range
// check; +Inf overflows whatever it multiplies), and every value must be in
// its range. A field flagged here gets no second problem from the other
// checks of that field.
func (cfg *Config) checkNumbers(c *checker) {
	walkNumbers(c, "", "", reflect.ValueOf(*cfg))
}

func walkNumbers(c *checker, path, pattern string, v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			walkNumbers(c, path, pattern, v.Elem())
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
			switch {
			case name == "-":
				continue
			case opts == "squash":
				walkNumbers(c, path, pattern, v.Field(i))
				continue
			case name == "":
				name = strings.ToLower(f.Name)
			}
			walkNumbers(c, join(path, name), join(pattern, name), v.Field(i))
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			walkNumbers(c, valueItemPath(path, i, v.Index(i)), pattern+"[]", v.Index(i))
		}
	case reflect.Float32, reflect.Float64, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		b, ok := boundsByPath[pattern]
		if !ok {
			// TestEveryFieldBounded keeps this from happening; a finite
			// check still holds.
			if v.CanFloat() {
				b = Bound{Path: pattern, Lo: math.Inf(-1), Hi: math.Inf(1)}
			} else {
				return
			}
		}
		var msg string
		switch {
		case v.Type() == durationType:
			msg = b.checkDuration(time.Duration(v.Int()))
		case v.CanFloat():
			msg = b.checkNumber(v.Float())
		default:
			msg = b.checkNumber(float64(v.Int()))
		}
		if msg != "" {
			c.flag(path, "%s", msg)
		}
	}
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// valueItemPath is itemPath of a list item's Name field, if it has one.
func valueItemPath(path string, i int, v reflect.Value) string {
	if v.Kind() == reflect.Struct {
		if f := v.FieldByName("Name"); f.IsValid() && f.Kind() == reflect.String {
			return itemPath(path, i, f.String())
		}
	}
	return itemPath(path, i, "")
}
