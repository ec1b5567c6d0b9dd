package config

import (
	"fmt"
	"time"
)

// DefaultWriteCapacity is the key writes per second `hearth validate`
// measures declarations against unless told otherwise (--capacity): on the
// 2-core machine of docs/performance.md, with Hearth, Redis and PostgreSQL
// on it, a 1,000,000-member version-checked family at 33,333 writes/s (TTL
// 60s) held on a quiet machine and let keys expire once another job took a
// third of a core. Taken as 40,000 keys/s, so that more than half of it
// (20,000) is where a stall like that one can make keys expire.
const DefaultWriteCapacity = 40_000

// capacityShare is the share of the write capacity past which a declaration,
// or all of them, draws a warning: the rest is headroom for a slow origin, a
// busy machine or a re-read.
const capacityShare = 0.5

// WriteRateWarnings estimates each declaration's key writes per second (its
// members / its interval: a single key 1, a family its declared members plus
// its hot set's limit, or its keys[].max_members when a members_query lists
// them) and warns when one, or their sum, needs more than half of capacity
// keys/s. A family whose members_query has no max_members of its own is not
// counted (its size is only known when it runs).
func (cfg *Config) WriteRateWarnings(capacity float64) []string {
	if !(capacity > 0) {
		return nil
	}
	var (
		out     []string
		total   float64
		counted int
	)
	limit := capacity * capacityShare
	for i, s := range cfg.specs {
		if s == nil || s.Interval <= 0 || i >= len(cfg.Keys) {
			continue
		}
		k := cfg.Keys[i]
		members := 1
		if s.Template.IsFamily() {
			members = len(k.Members)
			if s.HotSet != nil {
				members += s.HotSet.Limit()
			}
			if k.MembersQuery != "" {
				if k.MaxMembers <= 0 {
					continue
				}
				members = k.MaxMembers
			}
		}
		rate := float64(members) / s.Interval.Seconds()
		total += rate
		counted++
		if rate > limit {
			out = append(out, fmt.Sprintf("keys[%s]: %d members every %s need %s key writes/s, over %.0f%% of the write capacity %s keys/s: a slow origin or a busy machine makes its keys expire; lengthen the ttl, or measure this machine's capacity and pass it as --capacity (docs/performance.md)",
				k.Name, members, s.Interval.Round(time.Millisecond), keysPerSecond(rate), capacityShare*100, keysPerSecond(capacity)))
		}
	}
	if counted > 1 && total > limit {
		out = append(out, fmt.Sprintf("keys: the declarations together need %s key writes/s, over %.0f%% of the write capacity %s keys/s: a slow origin or a busy machine makes keys expire; lengthen ttls, or measure this machine's capacity and pass it as --capacity (docs/performance.md)",
			keysPerSecond(total), capacityShare*100, keysPerSecond(capacity)))
	}
	return out
}

// keysPerSecond spells a rate: whole keys from 10/s, two digits below.
func keysPerSecond(r float64) string {
	if r >= 10 {
		return fmt.Sprintf("%.0f", r)
	}
	return fmt.Sprintf("%.2g", r)
}
