// Package storetest is the one in-memory warmer.Store of the tests (Store)
// and the conformance suite every Store passes (Run: the fake here, the
// store.RedisStore against a real Redis). Its clock is time.Now, so that
// inside a testing/synctest bubble keys expire on the bubble's fake time and
// the warmer's pure logic (pacing, falling-behind projection, stale
// extension) runs without a server and without waiting. It is test harness:
// it never links into the daemon.
package storetest

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// Store is an in-memory warmer.Store with Redis's semantics for what the
// warmer uses: Set is SET key value PX ttl (no expiry for a TTL of 0),
// Extend is PEXPIRE key ttl GT (never shortens; a key without an expiry is
// left alone; reports whether each key exists). The zero value is not
// ready: use New.
type Store struct {
	mu     sync.Mutex
	keys   map[string]item
	writes []Write
	extend int
	err    error
	onSet  func(entries []store.Entry)
}

type item struct {
	value   []byte
	expires time.Time // zero: no expiry
}

// Write is one entry Set wrote, and when.
type Write struct {
	At    time.Time
	Key   string
	Value []byte
	TTL   time.Duration
}

var _ warmer.Store = (*Store)(nil)

// New returns an empty store.
func New() *Store { return &Store{keys: map[string]item{}} }

// Set writes every entry, or none when Fail set an error.
func (s *Store) Set(ctx context.Context, entries []store.Entry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return err
	}
	now := time.Now()
	for _, e := range entries {
		it := item{value: slices.Clone(e.Value)}
		if e.TTL > 0 {
			it.expires = now.Add(e.TTL)
		}
		s.keys[e.Key] = it
		s.writes = append(s.writes, Write{At: now, Key: e.Key, Value: it.value, TTL: e.TTL})
	}
	fn := s.onSet
	s.mu.Unlock()
	if fn != nil {
		fn(entries)
	}
	return nil
}

// Extend pushes each live key's expiry out to ttl from now unless it is
// already later; kept[i] reports whether keys[i] existed.
func (s *Store) Extend(ctx context.Context, keys []string, ttls []time.Duration) ([]bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	if len(keys) == 0 {
		return nil, nil
	}
	s.extend++
	now := time.Now()
	kept := make([]bool, len(keys))
	for i, k := range keys {
		it, ok := s.liveLocked(k, now)
		if !ok {
			continue
		}
		kept[i] = true
		if exp := now.Add(ttls[i]); !it.expires.IsZero() && exp.After(it.expires) {
			it.expires = exp
			s.keys[k] = it
		}
	}
	return kept, nil
}

// liveLocked is key's item if it has not expired (an expired one is dropped,
// as Redis does on access). Call with s.mu held.
func (s *Store) liveLocked(key string, now time.Time) (item, bool) {
	it, ok := s.keys[key]
	if !ok {
		return item{}, false
	}
	if !it.expires.IsZero() && !it.expires.After(now) {
		delete(s.keys, key)
		return item{}, false
	}
	return it, true
}

// Get returns key's value, false when it is absent or expired.
func (s *Store) Get(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	it, ok := s.liveLocked(key, time.Now())
	return it.value, ok
}

// TTL returns how long key has left (0 for no expiry), false when it is
// absent or expired.
func (s *Store) TTL(key string) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	it, ok := s.liveLocked(key, now)
	if !ok || it.expires.IsZero() {
		return 0, ok
	}
	return it.expires.Sub(now), true
}

// Keys returns the live keys, sorted.
func (s *Store) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var out []string
	for k := range s.keys {
		if _, ok := s.liveLocked(k, now); ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// Writes returns every entry written so far, in order.
func (s *Store) Writes() []Write {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.writes)
}

// Extends returns how many Extend calls with keys the store answered.
func (s *Store) Extends() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.extend
}

// Fail makes every Set and Extend fail with err from now on (Redis
// unreachable); nil ends it.
func (s *Store) Fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

// OnSet calls fn after every successful Set, outside the store's lock; nil
// removes it.
func (s *Store) OnSet(fn func(entries []store.Entry)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onSet = fn
}
