package store

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Entry is one value the warmer writes.
type Entry struct {
	Key   string
	Value []byte
	TTL   time.Duration

	// Seq, when > 0, stamps the write with the order in which its load
	// started: a fenced store refuses it if a load of the same key that
	// started later already wrote, or, when Versioned, if Redis holds a newer
	// origin Version. RedisStore ignores stamps.
	Seq       int64
	Versioned bool
	Version   int64
	// VersionTTL is how long the key's version record lives (0: twice TTL).
	VersionTTL time.Duration
	// Family labels the version metrics of a stamped write.
	Family string
	// Unconfirmed, when not empty, is a version record that refused this
	// key's last write although its value did not back it, and that this
	// entry's re-read of the origin did not confirm: if the key's record is
	// still exactly this and would refuse the write again, the store treats
	// it as foreign and replaces it.
	Unconfirmed string
}

// RedisStore is the unfenced store of a Hearth without leader election:
// pipelined SET … PX, PEXPIRE … GT and PTTL.
type RedisStore struct {
	Client redis.UniversalClient
}

// Set writes entries in one pipeline. SET is idempotent, so a retransmitted
// pipeline is harmless.
func (s *RedisStore) Set(ctx context.Context, entries []Entry) error {
	if len(entries) == 0 {
		return nil
	}
	pipe := s.Client.Pipeline()
	for _, e := range entries {
		pipe.Set(ctx, e.Key, e.Value, e.TTL)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("write %d keys: %w", len(entries), err)
	}
	return nil
}

// Extend sets PEXPIRE … GT on each key in one pipeline: each existing key's
// expiry is pushed out to ttls[i], never shortened; kept[i] reports whether
// keys[i] still existed.
func (s *RedisStore) Extend(ctx context.Context, keys []string, ttls []time.Duration) (kept []bool, err error) {
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := s.Client.Pipeline()
	cmds := make([]*redis.Cmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Do(ctx, "pexpire", k, ttls[i].Milliseconds(), "gt")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("extend %d keys: %w", len(keys), err)
	}
	kept = make([]bool, len(keys))
	var check []int
	for i, cmd := range cmds {
		if n, _ := cmd.Int64(); n == 1 {
			kept[i] = true
		} else {
			// 0: the key is gone, or its TTL was already longer.
			check = append(check, i)
		}
	}
	if len(check) == 0 {
		return kept, nil
	}
	pipe = s.Client.Pipeline()
	ex := make([]*redis.IntCmd, len(check))
	for j, i := range check {
		ex[j] = pipe.Exists(ctx, keys[i])
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("check %d keys: %w", len(check), err)
	}
	for j, i := range check {
		kept[i] = ex[j].Val() == 1
	}
	return kept, nil
}

// pttlChunk bounds one pipeline of PTTLs.
const pttlChunk = 1000

// PTTLs returns each key's remaining lifetime as Redis's PTTL does: -2 (as a
// Duration) for a missing key, -1 for a key without expiry.
func (s *RedisStore) PTTLs(ctx context.Context, keys []string) ([]time.Duration, error) {
	out := make([]time.Duration, 0, len(keys))
	for len(keys) > 0 {
		n := min(pttlChunk, len(keys))
		pipe := s.Client.Pipeline()
		cmds := make([]*redis.DurationCmd, n)
		for i, k := range keys[:n] {
			cmds[i] = pipe.PTTL(ctx, k)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, fmt.Errorf("read ttl of %d keys: %w", n, err)
		}
		for _, cmd := range cmds {
			out = append(out, cmd.Val())
		}
		keys = keys[n:]
	}
	return out, nil
}
