package readside_test

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/readside"
	"github.com/hearth-dev/hearth/readside/internal/rstest"
)

// holderToken looks like a readside owner token: 32 lowercase hex digits.
var holderToken = strings.Repeat("5a", 16)

// frame builds a stale copy as docs/readside.md specifies it, independently
// of readside's own encoder: "\xffhs", the version, the write time in unix
// milliseconds (8 bytes, big-endian), CRC-32C of those 12 bytes and the value
// (4 bytes, big-endian), then the value.
func frame(v string, written time.Time, version byte) []byte {
	h := make([]byte, 16, 16+len(v))
	copy(h, "\xffhs")
	h[3] = version
	binary.BigEndian.PutUint64(h[4:], uint64(written.UnixMilli()))
	crc := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	crc.Write(h[:12])
	crc.Write([]byte(v))
	binary.BigEndian.PutUint32(h[12:], crc.Sum32())
	return append(h, v...)
}

func textLogger(buf *rstest.SyncBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestPlantedLockRepaired: a lock no readside would have written (no TTL, a
// TTL far above LockTTL, not an owner token, not a string) is replaced on the
// first miss that finds it: the miss loads without waiting for it, the
// repair is counted by reason and logged, and the lock is gone afterwards.
// Before, every miss waited LockWait (LockTTL + 1 s) and then loaded anyway,
// at every expiry, for as long as the lock lived.
func TestPlantedLockRepaired(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns := env.Prefix + "ns"
	const lockTTL = 3 * time.Second
	for _, tc := range []struct {
		name, reason string
		plant        func(lock string) error
	}{
		{"no TTL", "no_ttl", func(lock string) error { return env.Client.Set(ctx, lock, holderToken, 0).Err() }},
		{"1000h TTL", "ttl_too_long", func(lock string) error { return env.Client.Set(ctx, lock, holderToken, 1000*time.Hour).Err() }},
		// A TTL within the bound: only the format gives it away.
		{"foreign format", "foreign_format", func(lock string) error { return env.Client.Set(ctx, lock, "someone-else", lockTTL).Err() }},
		{"uppercase token", "foreign_format", func(lock string) error {
			return env.Client.Set(ctx, lock, strings.ToUpper(holderToken), lockTTL).Err()
		}},
		{"foreign format, no TTL", "no_ttl", func(lock string) error { return env.Client.Set(ctx, lock, "x", 0).Err() }},
		{"a list", "foreign_format", func(lock string) error { return rstest.PutList(env.Client, lock) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			logs := &rstest.SyncBuffer{}
			c := newCache(t, env.Client, reg, readside.Options{Namespace: ns, LockTTL: lockTTL, Logger: textLogger(logs)})
			key := env.Prefix + "planted:" + strings.ReplaceAll(tc.name, " ", "_")
			lock := readside.LockKey(ns, key)
			if err := tc.plant(lock); err != nil {
				t.Fatal(err)
			}
			loads := 0
			load := func(context.Context) ([]byte, error) { loads++; return []byte("fresh"), nil }
			start := time.Now()
			v, err := c.GetOrLoad(ctx, key, load)
			took := time.Since(start)
			if err != nil || string(v) != "fresh" || loads != 1 {
				t.Fatalf("got %q, %v after %d loads", v, err, loads)
			}
			t.Logf("miss over a planted lock answered in %s", took)
			if took >= lockTTL {
				t.Errorf("the miss took %s, want < LockTTL %s: it waited for the planted lock", took, lockTTL)
			}
			if got := rstest.Sum(t, reg, "hearth_readside_lock_wait_seconds"); got != 0 {
				t.Errorf("lock waits observed: %v, want 0 (repaired on the first try)", got)
			}
			if got := rstest.Sum(t, reg, "hearth_readside_lock_repairs_total", "reason", tc.reason); got != 1 {
				t.Errorf("repairs{reason=%q}: %v, want 1", tc.reason, got)
			}
			if got := rstest.Sum(t, reg, "hearth_readside_lock_repairs_total"); got != 1 {
				t.Errorf("repairs in all: %v, want 1", got)
			}
			if n := env.Client.Exists(ctx, lock).Val(); n != 0 {
				t.Errorf("lock still there after the fill: %q", env.Client.Get(ctx, lock).Val())
			}
			if s := logs.String(); !strings.Contains(s, "reason="+tc.reason) || !strings.Contains(s, lock) {
				t.Errorf("log names neither the reason nor the lock:\n%s", s)
			}
			// The next expiry: an ordinary miss, nothing left to repair.
			env.Client.Del(ctx, key)
			if _, err := c.GetOrLoad(ctx, key, load); err != nil || loads != 2 {
				t.Fatalf("next miss: %v after %d loads", err, loads)
			}
			if got := rstest.Sum(t, reg, "hearth_readside_lock_repairs_total"); got != 1 {
				t.Errorf("repairs after the next miss: %v, want still 1", got)
			}
		})
	}
}

// TestHolderLockNotRepaired: a lock a reader could have taken (an owner
// token with at most LockTTL left) is waited for, not deleted: the waiter
// gets the holder's value and never loads.
func TestHolderLockNotRepaired(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns := env.Prefix + "ns"
	const lockTTL = 3 * time.Second
	opts := readside.Options{Namespace: ns, LockTTL: lockTTL}

	t.Run("another reader holds it", func(t *testing.T) {
		key := env.Prefix + "held"
		regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
		a := newCache(t, env.Client, regA, opts)
		b := newCache(t, redis.NewClient(&redis.Options{Addr: env.Addr}), regB, opts)
		release := make(chan struct{})
		doneB := make(chan error, 1)
		go func() {
			_, err := b.GetOrLoad(ctx, key, func(context.Context) ([]byte, error) { <-release; return []byte("b's"), nil })
			doneB <- err
		}()
		var token string
		rstest.Eventually(t, 10*time.Second, "B holds the lock", func() bool {
			token = env.Client.Get(ctx, readside.LockKey(ns, key)).Val()
			return token != ""
		})
		loadsA := 0
		resA := make(chan []byte, 1)
		go func() {
			v, _ := a.GetOrLoad(ctx, key, func(context.Context) ([]byte, error) { loadsA++; return []byte("a's"), nil })
			resA <- v
		}()
		rstest.Eventually(t, 10*time.Second, "A misses", func() bool {
			return rstest.Sum(t, regA, "hearth_readside_misses_total") == 1
		})
		time.Sleep(100 * time.Millisecond) // let A poll the held lock a few times
		if got := env.Client.Get(ctx, readside.LockKey(ns, key)).Val(); got != token {
			t.Fatalf("B's lock %q became %q while A waited", token, got)
		}
		close(release)
		if err := <-doneB; err != nil {
			t.Fatal(err)
		}
		if v := <-resA; string(v) != "b's" || loadsA != 0 {
			t.Errorf("A got %q after %d loads, want B's value and no load", v, loadsA)
		}
		// It waited: until B's value landed, or until B's release freed the lock.
		waits := rstest.Sum(t, regA, "hearth_readside_lock_wait_seconds", "result", "value") +
			rstest.Sum(t, regA, "hearth_readside_lock_wait_seconds", "result", "acquired")
		if waits != 1 {
			t.Errorf("A's lock waits: %v, want 1", waits)
		}
		for _, reg := range []*prometheus.Registry{regA, regB} {
			if got := rstest.Sum(t, reg, "hearth_readside_lock_repairs_total"); got != 0 {
				t.Errorf("repairs: %v, want 0", got)
			}
		}
	})

	t.Run("an owner token with LockTTL left, planted", func(t *testing.T) {
		key := env.Prefix + "token"
		lock := readside.LockKey(ns, key)
		reg := prometheus.NewRegistry()
		c := newCache(t, env.Client, reg, opts)
		env.Client.Set(ctx, lock, holderToken, lockTTL)
		loads := 0
		res := make(chan []byte, 1)
		go func() {
			v, _ := c.GetOrLoad(ctx, key, func(context.Context) ([]byte, error) { loads++; return []byte("loaded"), nil })
			res <- v
		}()
		rstest.Eventually(t, 10*time.Second, "the reader misses", func() bool {
			return rstest.Sum(t, reg, "hearth_readside_misses_total") == 1
		})
		time.Sleep(100 * time.Millisecond) // let it poll the held lock a few times
		if got := env.Client.Get(ctx, lock).Val(); got != holderToken {
			t.Fatalf("the holder's lock became %q", got)
		}
		env.Client.Set(ctx, key, "holder's", time.Minute) // the holder writes
		if v := <-res; string(v) != "holder's" || loads != 0 {
			t.Errorf("got %q after %d loads, want the holder's value and no load", v, loads)
		}
		if got := env.Client.Get(ctx, lock).Val(); got != holderToken {
			t.Errorf("the holder's lock became %q", got)
		}
		if got := rstest.Sum(t, reg, "hearth_readside_lock_repairs_total"); got != 0 {
			t.Errorf("repairs: %v, want 0", got)
		}
	})
}

// TestPlantedLockDoesNotStopEarlyRefresh: an early refresh that finds a planted
// lock repairs it and refreshes, instead of giving up as "locked" at every
// decision while the lock lives.
func TestPlantedLockDoesNotStopEarlyRefresh(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns, key := env.Prefix+"ns", env.Prefix+"early"
	reg := prometheus.NewRegistry()
	c := newCache(t, env.Client, reg, readside.Options{Namespace: ns, TTL: time.Hour})
	runs := 0
	load := func(context.Context) ([]byte, error) { runs++; return []byte("v" + itoa(runs)), nil }
	if _, err := c.GetOrLoad(ctx, key, load); err != nil {
		t.Fatal(err)
	}
	env.Client.Set(ctx, readside.LockKey(ns, key), holderToken, 0)
	readside.RefreshEarly(c, key, load, 2*time.Hour)
	if runs != 2 || env.Client.Get(ctx, key).Val() != "v2" {
		t.Errorf("loads %d, value %q: the planted lock stopped the early refresh", runs, env.Client.Get(ctx, key).Val())
	}
	if got := rstest.Sum(t, reg, "hearth_readside_lock_repairs_total", "reason", "no_ttl"); got != 1 {
		t.Errorf("repairs: %v, want 1", got)
	}
	if got := rstest.Sum(t, reg, "hearth_readside_early_refreshes_total", "result", "locked"); got != 0 {
		t.Errorf("early refreshes given up as locked: %v, want 0", got)
	}
}

// TestStaleCopyVerified: with the loader failing, a stale copy readside did
// not write (garbage, a copy from an older readside, a bad checksum, an
// unknown version, not a string), or one older than it could legitimately be
// (whatever its Redis TTL says), is never served: the loader's error is
// returned, the copy deleted, the rejection counted and logged. A frame
// within its bound is served.
func TestStaleCopyVerified(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns := env.Prefix + "ns"
	clock := newFakeClock(time.Unix(1_800_000_000, 0))
	now := clock.Now()
	const ttl, staleFor = time.Minute, time.Hour
	errOrigin := errors.New("origin down")
	failing := func(context.Context) ([]byte, error) { return nil, errOrigin }
	good := frame("good", now.Add(-30*time.Minute), 1)
	badSum := frame("good", now, 1)
	badSum[len(badSum)-1] ^= 1
	for _, tc := range []struct {
		name, reason string
		plant        func(sk string) error
	}{
		{"garbage, no TTL", "unframed", func(sk string) error { return env.Client.Set(ctx, sk, "\x00garbage", 0).Err() }},
		{"older readside's raw copy", "unframed", func(sk string) error { return env.Client.Set(ctx, sk, "old value", staleFor).Err() }},
		{"truncated frame", "unframed", func(sk string) error { return env.Client.Set(ctx, sk, good[:10], staleFor).Err() }},
		{"bad checksum", "bad_checksum", func(sk string) error { return env.Client.Set(ctx, sk, badSum, staleFor).Err() }},
		{"unknown version", "unknown_version", func(sk string) error {
			return env.Client.Set(ctx, sk, frame("good", now, 2), staleFor).Err()
		}},
		{"over age, no TTL", "too_old", func(sk string) error {
			return env.Client.Set(ctx, sk, frame("ancient", now.Add(-ttl-staleFor-time.Second), 1), 0).Err()
		}},
		{"over age, TTL says otherwise", "too_old", func(sk string) error {
			return env.Client.Set(ctx, sk, frame("ancient", now.Add(-48*time.Hour), 1), staleFor).Err()
		}},
		{"written in the future", "future", func(sk string) error {
			return env.Client.Set(ctx, sk, frame("later", now.Add(time.Hour), 1), staleFor).Err()
		}},
		{"a hash", "unframed", func(sk string) error { return env.Client.HSet(ctx, sk, "f", "v").Err() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			logs := &rstest.SyncBuffer{}
			c := newCache(t, env.Client, reg, readside.Options{Namespace: ns, TTL: ttl, StaleFor: staleFor, Jitter: -1,
				Now: clock.Now, Logger: textLogger(logs)})
			key := env.Prefix + "stale:" + strings.ReplaceAll(tc.name, " ", "_")
			sk := readside.StaleKey(ns, key)
			if err := tc.plant(sk); err != nil {
				t.Fatal(err)
			}
			v, err := c.GetOrLoad(ctx, key, failing)
			if !errors.Is(err, errOrigin) || v != nil {
				t.Fatalf("got %q, %v; want the loader's error, no value", v, err)
			}
			if n := env.Client.Exists(ctx, sk).Val(); n != 0 {
				t.Error("the rejected copy is still there")
			}
			if got := rstest.Sum(t, reg, "hearth_readside_stale_rejected_total", "reason", tc.reason); got != 1 {
				t.Errorf("rejected{reason=%q}: %v, want 1", tc.reason, got)
			}
			if got := rstest.Sum(t, reg, "hearth_readside_stale_served_total"); got != 0 {
				t.Errorf("stale served: %v, want 0", got)
			}
			if s := logs.String(); !strings.Contains(s, "reason="+tc.reason) {
				t.Errorf("log does not name the reason:\n%s", s)
			}
		})
	}

	t.Run("FallbackStale never serves garbage", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		c := newCache(t, env.Client, reg, readside.Options{Namespace: ns, TTL: ttl, StaleFor: staleFor, Jitter: -1,
			Now: clock.Now, LockTTL: 5 * time.Second, LockWait: 100 * time.Millisecond, Fallback: readside.FallbackStale})
		key := env.Prefix + "stale:fallback"
		env.Client.Set(ctx, readside.LockKey(ns, key), holderToken, 5*time.Second)
		env.Client.Set(ctx, readside.StaleKey(ns, key), "garbage", 0)
		v, err := c.GetOrLoad(ctx, key, failing)
		if !errors.Is(err, readside.ErrLockWait) || v != nil {
			t.Fatalf("got %q, %v; want ErrLockWait", v, err)
		}
		if got := rstest.Sum(t, reg, "hearth_readside_stale_rejected_total", "reason", "unframed"); got != 1 {
			t.Errorf("rejected: %v, want 1", got)
		}
	})

	t.Run("a frame within its bound is served", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		c := newCache(t, env.Client, reg, readside.Options{Namespace: ns, TTL: ttl, StaleFor: staleFor, Jitter: -1, Now: clock.Now})
		key := env.Prefix + "stale:good"
		env.Client.Set(ctx, readside.StaleKey(ns, key), good, staleFor)
		v, err := c.GetOrLoad(ctx, key, failing)
		if err != nil || string(v) != "good" {
			t.Fatalf("got %q, %v; want the stale copy", v, err)
		}
		if got := rstest.Sum(t, reg, "hearth_readside_stale_rejected_total"); got != 0 {
			t.Errorf("rejected: %v, want 0", got)
		}
	})

	t.Run("readside's own copy, past its bound while Redis still keeps it", func(t *testing.T) {
		clock := newFakeClock(now)
		reg := prometheus.NewRegistry()
		c := newCache(t, env.Client, reg, readside.Options{Namespace: ns, TTL: ttl, StaleFor: staleFor, Jitter: -1, Now: clock.Now})
		key := env.Prefix + "stale:own"
		sk := readside.StaleKey(ns, key)
		if _, err := c.GetOrLoad(ctx, key, func(context.Context) ([]byte, error) { return []byte("mine"), nil }); err != nil {
			t.Fatal(err)
		}
		if raw := env.Client.Get(ctx, sk).Val(); raw != string(frame("mine", now, 1)) {
			t.Fatalf("stored copy %q, want the documented frame %q", raw, frame("mine", now, 1))
		}
		env.Client.Del(ctx, key)
		clock.Add(ttl + staleFor - time.Second)
		if v, err := c.GetOrLoad(ctx, key, failing); err != nil || string(v) != "mine" {
			t.Fatalf("within the bound: %q, %v; want the stale copy", v, err)
		}
		clock.Add(2 * time.Second) // past TTL + StaleFor; Redis's TTL has a whole hour left
		if v, err := c.GetOrLoad(ctx, key, failing); !errors.Is(err, errOrigin) || v != nil {
			t.Fatalf("past the bound: %q, %v; want the loader's error", v, err)
		}
		if got := rstest.Sum(t, reg, "hearth_readside_stale_rejected_total", "reason", "too_old"); got != 1 {
			t.Errorf("rejected too_old: %v, want 1", got)
		}
	})
}
