package config

import (
	"fmt"
	"time"

	"github.com/hearth-dev/hearth/catchup"
	"github.com/hearth-dev/hearth/warmer"
)

// Leader configures the leader lease: one instance writes, the others stand by.
type Leader struct {
	// Enabled campaigns for the lease and fences every write (default true).
	// Off, every instance writes unfenced: for a single instance only.
	Enabled bool `mapstructure:"enabled"`
	// Lease is how long the lease outlives the leader's last renewal, and so
	// the longest a crashed leader keeps the standbys waiting. Zero picks
	// DefaultLease, or a shorter one that fits the takeover margin (see
	// LeaseTiming).
	Lease time.Duration `mapstructure:"lease"`
	// RenewInterval is how often the leader renews (default lease/3).
	RenewInterval time.Duration `mapstructure:"renew_interval"`
	// RetryPeriod is how often a standby tries to take the lease (default
	// 1s, or lease/5 if shorter). A released lease is taken at once.
	RetryPeriod time.Duration `mapstructure:"retry_period"`
	// FailoverGrace is how long past its renew deadline a leader on a Redis
	// Cluster goes on writing while its lease's master does not answer (it
	// is failing over): the per-slot fences keep those writes safe, and the
	// other masters' keys do not expire meanwhile. Default
	// DefaultFailoverGrace, at most MaxFailoverGrace; 0 turns it off (a
	// Cluster leader then stops at its renew deadline, as on a single node).
	// Only a Cluster has one; on a single node or Sentinel the lease and the
	// fence live on one master and a leader that cannot renew stops at its
	// deadline.
	FailoverGrace time.Duration `mapstructure:"failover_grace"`
}

// DefaultFailoverGrace covers a Cluster failover at Redis's default
// cluster-node-timeout (15 s) twice: the master is failed after the node
// timeout, and its replica promoted within about a second more.
const DefaultFailoverGrace = 30 * time.Second

// MaxFailoverGrace bounds leader.failover_grace: ten times the default, room
// for a cluster-node-timeout of two minutes. For that long two instances may
// both report leading (the fences order their writes); a year of it, which
// the generic bound allowed, is a leader that never steps down.
const MaxFailoverGrace = 5 * time.Minute

// Grace is leader.failover_grace: how long a Cluster term writes on past its
// renew deadline while its lease's master does not answer; 0 is off.
func (l Leader) Grace() time.Duration {
	return l.FailoverGrace
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
	// Margin is the smallest takeover margin of any declaration: how long
	// after its leader crashed a standby may take over and still catch up
	// every key of it before one expires (see Fits). Zero when no
	// declaration is valid.
	Margin time.Duration
	// MarginPath names the declaration with that margin (keys[name]).
	MarginPath string
	// MarginWhy spells the margin out for messages.
	MarginWhy string
	// Auto is true when neither lease nor retry_period was set.
	Auto bool
}

// Takeover is the longest a standby takes to take over after the leader
// crashed: the lease outlives the leader's last renewal by Lease, and the
// standby's next attempt comes at most TakeoverWait(RetryPeriod) later (its
// campaign may be backing off after a failed attempt).
func (t LeaseTiming) Takeover() time.Duration { return t.Lease + TakeoverWait(t.RetryPeriod) }

// Fits reports whether a standby taking over after a crash still finds every
// hot key alive: Takeover() < Margin.
func (t LeaseTiming) Fits() bool {
	return t.MarginPath == "" || t.Takeover() < t.Margin
}

// LeaseTiming resolves the lease's timing. An unset lease is DefaultLease, or,
// if that does not fit the smallest takeover margin, half that margin but not
// below MinAutoLease; an unset retry period is DefaultRetryPeriod or lease/5,
// whichever is shorter (so that an automatic lease + TakeoverWait(lease/5) =
// 1.96 × lease fits twice the lease).
// It is resolved once, by Validate: zero on a config that has not passed it.
func (cfg *Config) LeaseTiming() LeaseTiming { return cfg.lease }

// leaseTiming resolves the lease's timing from the specs Validate built (one
// per key, nil for a key with problems).
//
// The takeover margin of a declaration: its leader writes a key at w and
// crashes at c just before the next write would land, c ≤ w + Gap (see
// refreshTiming); the key expires at w + MinTTL ≥ c + MinTTL − Gap. The
// standby holds the lease by c + Takeover(), and its catch-up rewrites the key
// within load_timeout + catchup.Slack more. So a takeover never loses a key
// when Takeover() < MinTTL − Gap − load_timeout − catchup.Slack = Margin.
func (cfg *Config) leaseTiming(specs []*warmer.Spec) LeaseTiming {
	var t LeaseTiming
	for i, s := range specs {
		if s == nil || !timeable(s, cfg.Refresh.Spread) {
			continue
		}
		k := cfg.Keys[i]
		rt := refreshTiming(s, k, cfg.Refresh.Spread, cfg.sourceRate(s.Source))
		m := rt.Margin() - s.LoadTimeout - catchup.Slack
		if t.MarginPath == "" || m < t.Margin {
			t.Margin = m
			t.MarginPath = itemPath("keys", i, k.Name)
			t.MarginWhy = fmt.Sprintf("smallest jittered ttl %s − (%s) − catch-up load_timeout %s − slack %s",
				rt.MinTTL.Round(time.Millisecond), rt.Terms, s.LoadTimeout, catchup.Slack)
		}
	}
	l := cfg.Leader
	t.Auto = l.Lease == 0 && l.RetryPeriod == 0
	t.Lease = l.Lease
	if t.Lease == 0 {
		t.Lease = DefaultLease
		if t.MarginPath != "" && DefaultLease+TakeoverWait(DefaultRetryPeriod) >= t.Margin {
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
	if c.flagged["leader.lease"] || c.flagged["leader.retry_period"] || c.flagged["leader.renew_interval"] {
		return
	}
	if l.RenewInterval > 0 && l.RenewInterval >= t.Lease {
		c.add("leader.renew_interval", "must be shorter than leader.lease %s (got %s)", t.Lease, l.RenewInterval)
	}
	if !l.Enabled || t.Auto || t.Fits() {
		return
	}
	c.add("leader.lease", "lease %s + campaign backoff %s (%d × retry_period %s, +%g%%) = %s must be shorter than the takeover margin %s of %s (%s): "+
		"a standby taking over after a crash would find that key expired; shorten the lease or lengthen the ttl",
		t.Lease, TakeoverWait(t.RetryPeriod), CampaignBackoff, t.RetryPeriod, CampaignJitter*100, t.Takeover(), t.Margin.Round(time.Millisecond), t.MarginPath, t.MarginWhy)
}
