package config

import (
	"fmt"
	"time"

	"github.com/hearth-dev/hearth/warmer"
)

// Leader configures the leader lease: one instance writes, the others stand by.
type Leader struct {
	// Enabled campaigns for the lease and fences every write (default true).
	// Off, every instance writes unfenced: for a single instance only.
	Enabled bool `mapstructure:"enabled"`
	// Lease is how long the lease outlives the leader's last renewal, and so
	// the longest a crashed leader keeps the standbys waiting. Zero picks
	// DefaultLease, or a shorter one that fits the refresh margin (see
	// LeaseTiming).
	Lease time.Duration `mapstructure:"lease"`
	// RenewInterval is how often the leader renews (default lease/3).
	RenewInterval time.Duration `mapstructure:"renew_interval"`
	// RetryPeriod is how often a standby tries to take the lease (default
	// 1s, or lease/5 if shorter). A released lease is taken at once.
	RetryPeriod time.Duration `mapstructure:"retry_period"`
}

// Lease defaults.
const (
	DefaultLease       = 5 * time.Second
	DefaultRetryPeriod = time.Second
	// MinAutoLease is the shortest lease Hearth picks by itself.
	MinAutoLease = time.Second
	// MinLease is the shortest lease accepted.
	MinLease = 100 * time.Millisecond
)

// LeaseTiming is the lease's timing once defaults are resolved, and the refresh
// margin it must fit in.
type LeaseTiming struct {
	Lease, RenewInterval, RetryPeriod time.Duration
	// Margin is the smallest refresh margin of any declaration: smallest
	// jittered TTL − interval − load timeout, the time a key survives past a
	// missed refresh. Zero when no declaration is valid.
	Margin time.Duration
	// MarginPath names the declaration with that margin (keys[name]).
	MarginPath string
	// MarginWhy spells the margin out for messages.
	MarginWhy string
	// Auto is true when neither lease nor retry_period was set.
	Auto bool
}

// Fits reports whether a standby taking over after a crash (lease + retry
// period after the leader's last renewal, at worst) still finds every hot key
// alive: lease + retry period < margin.
func (t LeaseTiming) Fits() bool {
	return t.Margin <= 0 || t.Lease+t.RetryPeriod < t.Margin
}

// LeaseTiming resolves the lease's timing. An unset lease is DefaultLease, or,
// if DefaultLease + DefaultRetryPeriod do not fit the smallest refresh margin,
// half that margin but not below MinAutoLease; an unset retry period is
// DefaultRetryPeriod or lease/5, whichever is shorter.
// It is resolved once, by Validate: zero on a config that has not passed it.
func (cfg *Config) LeaseTiming() LeaseTiming { return cfg.lease }

// leaseTiming resolves the lease's timing from the specs Validate built (one
// per key, nil for a key with problems).
func (cfg *Config) leaseTiming(specs []*warmer.Spec) LeaseTiming {
	var t LeaseTiming
	for i, s := range specs {
		if s == nil || s.Interval <= 0 {
			continue
		}
		k := cfg.Keys[i]
		m := s.MinTTL() - s.Interval - s.LoadTimeout
		if t.MarginPath == "" || m < t.Margin {
			t.Margin = m
			t.MarginPath = fmt.Sprintf("keys[%d]", i)
			if nameRe.MatchString(k.Name) {
				t.MarginPath = fmt.Sprintf("keys[%s]", k.Name)
			}
			t.MarginWhy = fmt.Sprintf("smallest jittered ttl %s − interval %s − load_timeout %s",
				s.MinTTL().Round(time.Millisecond), s.Interval, s.LoadTimeout)
		}
	}
	l := cfg.Leader
	t.Auto = l.Lease == 0 && l.RetryPeriod == 0
	t.Lease = l.Lease
	if t.Lease == 0 {
		t.Lease = DefaultLease
		if t.Margin > 0 && DefaultLease+DefaultRetryPeriod >= t.Margin {
			t.Lease = min(DefaultLease, max(t.Margin/2, MinAutoLease))
		}
	}
	t.RenewInterval = l.RenewInterval
	if t.RenewInterval == 0 {
		t.RenewInterval = t.Lease / 3
	}
	t.RetryPeriod = l.RetryPeriod
	if t.RetryPeriod == 0 {
		t.RetryPeriod = min(DefaultRetryPeriod, t.Lease/5)
	}
	return t
}

func (cfg *Config) validateLeader(c *checker, t LeaseTiming) {
	l := cfg.Leader
	if l.Lease < 0 || (l.Lease > 0 && l.Lease < MinLease) {
		c.add("leader.lease", "must be at least %s (got %s)", MinLease, l.Lease)
		return
	}
	if l.RenewInterval < 0 {
		c.add("leader.renew_interval", "must be > 0 (got %s)", l.RenewInterval)
	}
	if l.RetryPeriod < 0 {
		c.add("leader.retry_period", "must be > 0 (got %s)", l.RetryPeriod)
	}
	if l.RenewInterval > 0 && l.RenewInterval >= t.Lease {
		c.add("leader.renew_interval", "must be shorter than leader.lease %s (got %s)", t.Lease, l.RenewInterval)
	}
	if !l.Enabled || t.Auto || t.Fits() {
		return
	}
	c.add("leader.lease", "lease %s + retry_period %s must be shorter than the refresh margin %s of %s (%s): "+
		"a standby taking over after a crash would find that key expired; shorten the lease or lengthen the ttl",
		t.Lease, t.RetryPeriod, t.Margin.Round(time.Millisecond), t.MarginPath, t.MarginWhy)
}
