package readside

import (
	"bytes"
	"fmt"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// LocalOptions configures the optional near cache: a bounded in-process LRU
// in front of Redis that serves hot reads from memory. Off when Size is 0.
//
// A value is served locally at most TTL after it was read from (or written
// to) Redis, never past its Redis expiry as seen by that read, and a
// sentinel never past NegativeTTL either. The price is staleness: a value
// another process (or Hearth) rewrites or deletes in Redis is seen here at
// most TTL later. XFetch still decides on every local hit, from the Redis
// expiry and δ the local copy carries, so early refreshes go on.
type LocalOptions struct {
	// Size is the most keys held in memory (0: no near cache).
	Size int
	// TTL bounds how long a copy is served locally (default 1s when Size is
	// set): the staleness bound for writes by other processes.
	TTL time.Duration
}

// DefaultLocalTTL is LocalOptions.TTL's default.
const DefaultLocalTTL = time.Second

// localEntry is a copy of what one read (or write) of a key found.
type localEntry struct {
	value    []byte
	negative bool
	until    time.Time     // served locally before this instant only
	expires  time.Time     // the value's Redis expiry; zero for none
	delta    time.Duration // δ for XFetch; 0 when unknown
}

// near is the near cache; nil in a Cache without one.
type near struct {
	lru *lru.Cache[string, localEntry]
	ttl time.Duration
}

func newNear(o LocalOptions) (*near, error) {
	if o.Size < 0 {
		return nil, fmt.Errorf("readside: Options.Local.Size: must not be negative (got %d)", o.Size)
	}
	if o.TTL < 0 {
		return nil, fmt.Errorf("readside: Options.Local.TTL: must not be negative (got %s)", o.TTL)
	}
	if o.Size == 0 {
		return nil, nil
	}
	if o.TTL == 0 {
		o.TTL = DefaultLocalTTL
	}
	l, err := lru.New[string, localEntry](o.Size)
	if err != nil {
		return nil, fmt.Errorf("readside: Options.Local: %w", err)
	}
	return &near{lru: l, ttl: o.TTL}, nil
}

// remember keeps a copy of v, read or written at t0 with remaining left in
// Redis (its PTTL: -1 for no TTL, -2 for gone) and δ delta.
func (c *Cache) remember(key string, v []byte, remaining, delta time.Duration, t0 time.Time) {
	if c.near == nil || remaining == -2 {
		return
	}
	le := localEntry{value: bytes.Clone(v), negative: string(v) == c.o.NegativeValue, delta: delta}
	bound := c.near.ttl
	if le.negative {
		bound = min(bound, c.o.NegativeTTL)
		le.value, le.delta = nil, 0
	}
	if remaining >= 0 {
		le.expires = t0.Add(remaining)
		bound = min(bound, remaining)
	}
	if bound <= 0 {
		c.near.lru.Remove(key)
		return
	}
	le.until = t0.Add(bound)
	c.near.lru.Add(key, le)
}

// local answers from the near cache when it holds a live copy of key, and
// runs XFetch's test on it as a Redis read would.
func (c *Cache) local(key string, load Loader, co callOpts) ([]byte, bool, error) {
	if c.near == nil {
		return nil, false, nil
	}
	le, ok := c.near.lru.Get(key)
	if !ok {
		return nil, false, nil
	}
	now := c.o.Now()
	if !now.Before(le.until) {
		return nil, false, nil
	}
	if le.negative {
		c.m.localHits.WithLabelValues("negative").Inc()
		return nil, true, ErrNotFound
	}
	c.m.localHits.WithLabelValues("value").Inc()
	if !le.expires.IsZero() {
		e := entry{remaining: le.expires.Sub(now), delta: le.delta}
		if c.early(e) {
			c.refreshEarly(key, load, co, e.remaining, e.delta)
		}
	}
	return bytes.Clone(le.value), true, nil
}
