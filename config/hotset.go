package config

import (
	"time"

	"github.com/hearth-dev/hearth/warmer"
)

// MembersFrom lists where a family takes members from besides members and
// members_query: today the access log only.
type MembersFrom struct {
	AccessLog *HotSet `mapstructure:"access_log"`
}

// HotSet makes a family's members follow traffic: the family's top_n keys in
// the access log over window, re-ranked every rank_interval, are refreshed
// with its other members; a member that stops ranking is demoted (no longer
// refreshed, left to expire), with hysteresis so that a key at the boundary
// does not flap. See docs/hotset.md.
type HotSet struct {
	// TopN is how many of the family's hottest keys are promoted (required).
	TopN int `mapstructure:"top_n"`
	// Window is how far back the access log is ranked; 0 takes prewarm.window,
	// whose stored ranking (access_log.rank_interval) it then reads at once.
	Window time.Duration `mapstructure:"window"`
	// RankInterval is how often the hot set is re-ranked; 0 takes
	// access_log.rank_interval, or 1m when that is 0.
	RankInterval time.Duration `mapstructure:"rank_interval"`
	// Hysteresis keeps a promoted member while it ranks within
	// top_n × (1 + hysteresis); nil is DefaultHysteresis.
	Hysteresis *float64 `mapstructure:"hysteresis"`
	// DemoteAfter is how many rankings in a row a member must rank below that
	// before it is demoted; 0 is DefaultDemoteAfter.
	DemoteAfter int `mapstructure:"demote_after"`
}

// Defaults and bounds of a hot set.
const (
	DefaultHysteresis   = 0.2
	DefaultDemoteAfter  = 2
	maxDemoteAfter      = 100
	defaultRankInterval = time.Minute
	minHotRankInterval  = time.Second
)

// hotSet validates a family's members_from and returns its hot set (nil when
// it has none). Problems are reported through add, relative to the key.
func (cfg *Config) hotSet(mf *MembersFrom, s *warmer.Spec, add func(field, format string, args ...any)) *warmer.HotSet {
	const path = "members_from.access_log"
	h := mf.AccessLog
	if h == nil {
		add("members_from", "must name where members come from: access_log")
		return nil
	}
	a := cfg.AccessLog
	if a.Source == "" {
		add(path, "needs access_log.source: the access log the hot set is ranked from")
	}
	out := &warmer.HotSet{
		TopN: h.TopN, Window: h.Window, RankInterval: h.RankInterval,
		Hysteresis: DefaultHysteresis, DemoteAfter: h.DemoteAfter,
	}
	if h.Hysteresis != nil {
		out.Hysteresis = *h.Hysteresis
	}
	if out.Window == 0 {
		out.Window = cfg.Prewarm.Window
	}
	if out.RankInterval == 0 {
		out.RankInterval = a.RankInterval
		if out.RankInterval <= 0 {
			out.RankInterval = defaultRankInterval
		}
	}
	if out.DemoteAfter == 0 {
		out.DemoteAfter = DefaultDemoteAfter
	}
	inherited := func(set bool, from string) string {
		if set {
			return ""
		}
		return ", inherited from " + from
	}

	switch {
	case h.TopN < 1 || h.TopN > maxTopN: // out of its bound (config.Bounds): reported there
	case s.MaxMembers > 0 && out.Limit() > s.MaxMembers:
		add(path+".top_n", "top_n × (1 + hysteresis) = %d is more than max_members %d", out.Limit(), s.MaxMembers)
	}
	switch {
	case out.Window < a.Bucket:
		add(path+".window", "must be at least access_log.bucket %s (got %s%s)", a.Bucket, out.Window, inherited(h.Window != 0, "prewarm.window"))
	case a.Retention > 0 && out.Window > a.Retention:
		add(path+".window", "must be at most access_log.retention %s: older reads are deleted (got %s%s)", a.Retention, out.Window, inherited(h.Window != 0, "prewarm.window"))
	}
	if out.RankInterval > out.Window && out.Window > 0 {
		add(path+".rank_interval", "must be at most the window %s, or the hot set trails traffic by more than it ranks (got %s)", out.Window, out.RankInterval)
	}
	return out
}
