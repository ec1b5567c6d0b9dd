package config

import (
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/sources/protect"
)

// Protection bounds what Hearth asks of one origin: calls in flight, calls per
// second, a timeout per call, retries with backoff and a circuit breaker. An
// unset field takes its value from DefaultProtection.
type Protection struct {
	// MaxInFlight bounds the source's origin calls in flight at once.
	MaxInFlight int `mapstructure:"max_in_flight"`
	// Rate bounds origin calls per second (0: unlimited); Burst of them may go
	// at once (default max_in_flight).
	Rate  *float64 `mapstructure:"rate"`
	Burst int      `mapstructure:"burst"`
	// AttemptTimeout bounds one call (unset: only the declaration's load_timeout).
	AttemptTimeout time.Duration `mapstructure:"attempt_timeout"`
	// Retries of a call that failed for a reason worth retrying (0: none).
	Retries         *int          `mapstructure:"retries"`
	RetryBackoff    time.Duration `mapstructure:"retry_backoff"`
	RetryMaxBackoff time.Duration `mapstructure:"retry_max_backoff"`
	Breaker         Breaker       `mapstructure:"breaker"`
}

// Breaker is a source's circuit breaker.
type Breaker struct {
	// Failures is how many consecutive failed calls open it (0: no breaker).
	Failures *int `mapstructure:"failures"`
	// OpenFor is how long it stays open before one trial call.
	OpenFor time.Duration `mapstructure:"open_for"`
	// ProbeInterval is how often the origin is pinged while the breaker is
	// open: the first answer closes it and refreshes the declarations that
	// went stale, without waiting out open_for (default 1s).
	ProbeInterval time.Duration `mapstructure:"probe_interval"`
}

// Protection defaults.
const (
	DefaultMaxInFlight     = 4
	DefaultRate            = 100.0
	DefaultRetries         = 2
	DefaultRetryBackoff    = 100 * time.Millisecond
	DefaultRetryMaxBackoff = 2 * time.Second
	DefaultBreakerFailures = 5
	DefaultBreakerOpenFor  = 30 * time.Second
	// DefaultBreakerProbeInterval is breaker.probe_interval's default.
	DefaultBreakerProbeInterval = time.Second
)

func (p Protection) resolved() protect.GuardConfig {
	g := protect.GuardConfig{
		MaxInFlight: p.MaxInFlight, Rate: DefaultRate, Burst: p.Burst,
		AttemptTimeout: p.AttemptTimeout, Retries: DefaultRetries,
		RetryBackoff: p.RetryBackoff, RetryMaxBackoff: p.RetryMaxBackoff,
		BreakerFailures: DefaultBreakerFailures, BreakerOpenFor: p.Breaker.OpenFor,
	}
	if g.MaxInFlight == 0 {
		g.MaxInFlight = DefaultMaxInFlight
	}
	if p.Rate != nil {
		g.Rate = *p.Rate
	}
	if g.Burst == 0 {
		g.Burst = g.MaxInFlight
	}
	if p.Retries != nil {
		g.Retries = *p.Retries
	}
	if g.RetryBackoff == 0 {
		g.RetryBackoff = DefaultRetryBackoff
	}
	if g.RetryMaxBackoff == 0 {
		g.RetryMaxBackoff = max(DefaultRetryMaxBackoff, g.RetryBackoff)
	}
	if p.Breaker.Failures != nil {
		g.BreakerFailures = *p.Breaker.Failures
	}
	if g.BreakerOpenFor == 0 {
		g.BreakerOpenFor = DefaultBreakerOpenFor
	}
	g.ProbeInterval = p.Breaker.ProbeInterval
	if g.ProbeInterval == 0 {
		g.ProbeInterval = DefaultBreakerProbeInterval
	}
	return g
}

// Guard returns the source's origin protection with defaults applied, ready
// for protect.Guard; metrics and logger are the caller's.
func (s Source) Guard(m *protect.GuardMetrics, log zerolog.Logger) protect.GuardConfig {
	g := s.Protection.resolved()
	g.Name, g.Metrics, g.Logger = s.Name, m, log
	return g
}

// validate checks what the bounds table cannot: one field against another.
func (p Protection) validate(c *checker, path string) {
	if p.RetryMaxBackoff > 0 && p.RetryBackoff > p.RetryMaxBackoff {
		c.add(path+".retry_max_backoff", "must be at least retry_backoff %s (got %s)", p.RetryBackoff, p.RetryMaxBackoff)
	}
}

// Warnings are what a valid config allows but an operator should know,
// each naming its field: a source whose breaker, once open, looks for the
// origin's return (a probe every breaker.probe_interval, or the trial call
// after breaker.open_for, whichever comes first) less often than one of its
// declarations is refreshed, so that after an outage that declaration's
// values stay stale for longer than one refresh interval; and load slots too
// few for the scheduled loads (slotWarnings); HEARTH_… variables that
// override nothing (envWarnings).
func (cfg *Config) Warnings() []string {
	out := append(envWarnings(), cfg.slotWarnings()...)
	for _, src := range cfg.Sources {
		g := src.Protection.resolved()
		if g.BreakerFailures == 0 {
			continue // no breaker
		}
		back := min(g.ProbeInterval, g.BreakerOpenFor)
		for _, s := range cfg.specs {
			if s.Source != src.Name || s.Interval <= 0 || back <= s.Interval {
				continue
			}
			field := fmt.Sprintf("sources[%s].breaker.probe_interval", src.Name)
			if g.BreakerOpenFor < g.ProbeInterval {
				field = fmt.Sprintf("sources[%s].breaker.open_for", src.Name)
			}
			out = append(out, fmt.Sprintf("%s: the origin's return is noticed after up to %s, longer than the refresh interval %s of keys[%s]: after an outage its values stay stale that long; keep it below %s",
				field, back, s.Interval, s.Name, s.Interval))
		}
	}
	return out
}
