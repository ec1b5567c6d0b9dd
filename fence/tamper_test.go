package fence_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/leadertest"
	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/store"
)

// The tamper suite: someone (an operator, an attacker, a stray key template)
// writes into Hearth's own keys. Each foreign value must be repaired — Hearth
// writes again within a bound —, logged with the key and what was found,
// counted in hearth_state_repairs_total, and must never make the campaign spin.

type tamperEnv struct {
	t       *testing.T
	client  *redis.Client
	ns      string
	perSlot bool
}

// newTamperEnv gives each subtest its own namespace on one private Redis
// (tampering with the shared one would disturb other tests).
func newTamperEnv(t *testing.T, client *redis.Client, ns string) *tamperEnv {
	return &tamperEnv{t: t, client: client, ns: ns}
}

type tamperInstance struct {
	*leadertest.Instance
	logs *testenv.SyncBuffer
}

func (e *tamperEnv) instance(lease, retry time.Duration) *tamperInstance {
	e.t.Helper()
	logs := &testenv.SyncBuffer{}
	env := leadertest.On(e.t, e.client, e.ns)
	env.Log = zerolog.New(logs)
	return &tamperInstance{Instance: env.Instance(lease, retry, e.perSlot), logs: logs}
}

// lead runs what the daemon (daemon/term.go) does with a lease: campaign, write key every
// 50ms while the term lasts, campaign again when it ends; until the test ends.
func (in *tamperInstance) lead(t *testing.T, key string) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			term, err := in.Lease.Campaign(ctx)
			if err != nil {
				return
			}
			for term.Valid() {
				_ = in.Store.Writer(term).Set(ctx, []store.Entry{{Key: key, Value: []byte("v"), TTL: time.Minute}})
				select {
				case <-ctx.Done():
					_ = term.Release(context.Background())
					return
				case <-term.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
	}()
}

func (in *tamperInstance) attempts(t *testing.T) float64 {
	t.Helper()
	n := 0.0
	for _, r := range []string{"acquired", "held", "fenced", "error"} {
		n += promtest.Value(t, in.Reg, "hearth_lease_campaign_attempts_total", "result", r)
	}
	return n
}

func (in *tamperInstance) repairs(t *testing.T, kind string) float64 {
	t.Helper()
	return promtest.Value(t, in.Reg, "hearth_state_repairs_total", "key", kind)
}

// tamper is one foreign value written into one of Hearth's keys.
type tamper struct {
	name string
	kind string // the repairs label
	key  string // suffix after the namespace
	do   func(c *redis.Client, key string) error
	// found is what the repair log must quote.
	found string
}

func hash(c *redis.Client, key string) error {
	ctx := context.Background()
	if err := c.Del(ctx, key).Err(); err != nil {
		return err
	}
	return c.HSet(ctx, key, "f", "1").Err()
}

// withTTL keeps the key's valid value and gives it a TTL: once it expired,
// the fence would let any older epoch through.
func withTTL(c *redis.Client, key string) error {
	return c.PExpire(context.Background(), key, time.Hour).Err()
}

func redisMillis(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

func TestTamperState(t *testing.T) {
	srv := testenv.PrivateRedis(t)
	client := srv.Client(t)
	farFuture := strconv.FormatInt(redisMillis(t, client)+2*leader.MaxEpochAhead.Milliseconds(), 10)
	cases := []tamper{
		{"fence huge", "fence", ":fence", testenv.PutString("99999999999999999"), "99999999999999999"},
		{"fence nan", "fence", ":fence", testenv.PutString("nan"), "nan"},
		{"fence inf", "fence", ":fence", testenv.PutString("inf"), "inf"},
		{"fence 1e999", "fence", ":fence", testenv.PutString("1e999"), "1e999"},
		{"fence negative", "fence", ":fence", testenv.PutString("-5"), "-5"},
		{"fence beyond the bound", "fence", ":fence", testenv.PutString(farFuture), farFuture},
		{"fence as a list", "fence", ":fence", testenv.PutList, "wrong type: list"},
		{"fence as a hash", "fence", ":fence", hash, "wrong type: hash"},
		{"fence with a ttl", "fence", ":fence", withTTL, "ttl set: "},
		{"lease garbage without ttl", "lease", ":{lease}", testenv.PutString("garbage"), "garbage"},
		{"lease well-formed without ttl", "lease", ":{lease}", testenv.PutString("1700000000000:intruder-1-abcdef/1"), "no ttl: 1700000000000:intruder-1-abcdef/1"},
		{"lease well-formed with an hour's ttl", "lease", ":{lease}", func(c *redis.Client, key string) error {
			return c.Set(context.Background(), key, "1700000000000:intruder-1-abcdef/1", time.Hour).Err()
		}, "1700000000000:intruder-1-abcdef/1"},
		{"lease far-future epoch", "lease", ":{lease}", testenv.PutString("99999999999999:intruder-1-abcdef/1"), "99999999999999:intruder-1-abcdef/1"},
		{"lease as a list", "lease", ":{lease}", testenv.PutList, "wrong type: list"},
		{"epoch huge", "epoch", ":{lease}:epoch", testenv.PutString("99999999999999999999"), "99999999999999999999"},
		{"epoch nan", "epoch", ":{lease}:epoch", testenv.PutString("nan"), "nan"},
		{"epoch with a ttl", "epoch", ":{lease}:epoch", withTTL, "ttl set: "},
		{"epoch as a hash", "epoch", ":{lease}:epoch", hash, "wrong type: hash"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			env := newTamperEnv(t, client, fmt.Sprintf("t%d", i))
			in := env.instance(time.Second, 100*time.Millisecond)
			value := env.ns + ":value"
			in.lead(t, value)
			testenv.Eventually(t, 5*time.Second, "first write", func() bool { return client.Exists(ctx, value).Val() == 1 })

			key := env.ns + tc.key
			before := in.attempts(t)
			terms := promtest.Value(t, in.Reg, "hearth_leader_transitions_total", "result", "acquired")
			if err := tc.do(client, key); err != nil {
				t.Fatal(err)
			}
			if tc.kind == "epoch" {
				// The epoch counter is read at the next campaign: end the term.
				client.Del(ctx, env.ns+":{lease}")
			}
			if tc.kind != "fence" {
				// The old term writes until its renewal finds the lease
				// gone: only a new term proves the takeover.
				testenv.Eventually(t, 10*time.Second, "a new term after "+tc.name, func() bool {
					return promtest.Value(t, in.Reg, "hearth_leader_transitions_total", "result", "acquired") > terms
				})
			}
			client.Del(ctx, value)
			// Bound: the lease (1s) for a well-formed lease left to expire,
			// plus backoff; 10s leaves room for a loaded machine.
			testenv.Eventually(t, 10*time.Second, "hearth writes again after "+tc.name, func() bool {
				return client.Exists(ctx, value).Val() == 1
			})
			testenv.Eventually(t, 5*time.Second, "repair counted", func() bool { return in.repairs(t, tc.kind) >= 1 })
			logs := in.logs.String()
			if !strings.Contains(logs, `"key":"`+key+`"`) || !strings.Contains(logs, tc.found) {
				t.Errorf("no repair log naming %s and %q in:\n%s", key, tc.found, logs)
			}
			// Over the tamper and the recovery (≤ ~1s of standing by at
			// 100ms), a handful of attempts, never a spin.
			if n := in.attempts(t) - before; n > 30 {
				t.Errorf("%g campaign attempts during the repair, want ≤ 30", n)
			}
			if tc.kind == "fence" || tc.kind == "epoch" {
				epoch := int64(promtest.Value(t, in.Reg, "hearth_leader_epoch"))
				if limit := redisMillis(t, client) + leader.MaxEpochAhead.Milliseconds(); epoch > limit {
					t.Errorf("epoch %d after the repair, beyond Redis time + bound %d", epoch, limit)
				}
				if f, err := client.Get(ctx, env.ns+":fence").Int64(); err != nil || f > epoch {
					t.Errorf("fence after the repair = %d (%v), want ≤ epoch %d", f, err, epoch)
				}
				if ttl := client.PTTL(ctx, key).Val(); ttl != -1 {
					t.Errorf("%s ttl after the repair = %s, want none", key, ttl)
				}
			}
		})
	}
}

// TestTamperFencingHolds: after a foreign fence value is repaired, a paused
// ex-leader holding an older epoch is still refused, by Set, Extend and Raise.
func TestTamperFencingHolds(t *testing.T) {
	srv := testenv.PrivateRedis(t)
	client := srv.Client(t)
	for _, perSlot := range []bool{false, true} {
		t.Run(fmt.Sprintf("per slot %v", perSlot), func(t *testing.T) { testTamperFencingHolds(t, client, perSlot) })
	}
}

func testTamperFencingHolds(t *testing.T, client *redis.Client, perSlot bool) {
	for i, tc := range []struct {
		name string
		do   func(c *redis.Client, key string) error
	}{
		{"nan", testenv.PutString("nan")}, {"huge", testenv.PutString("99999999999999999")}, {"inf", testenv.PutString("inf")}, {"list", testenv.PutList}, {"ttl", withTTL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			env := newTamperEnv(t, client, fmt.Sprintf("f%d-%v", i, perSlot))
			env.perSlot = perSlot
			a := env.instance(30*time.Second, 20*time.Millisecond)
			b := env.instance(30*time.Second, 20*time.Millisecond)
			key := env.ns + ":value"
			fence := b.Store.FenceKey(key)
			ta := leadertest.Campaign(t, a.Lease, 5*time.Second)
			aw := a.Store.Writer(ta) // admitted, then paused
			client.Del(ctx, env.ns+":{lease}")
			tb := leadertest.Campaign(t, b.Lease, 5*time.Second)
			if tb.Epoch <= ta.Epoch {
				t.Fatalf("epoch %d after %d", tb.Epoch, ta.Epoch)
			}
			if err := tc.do(client, fence); err != nil {
				t.Fatal(err)
			}
			bw := b.Store.Writer(tb)
			if err := bw.Set(ctx, []store.Entry{{Key: key, Value: []byte("b"), TTL: time.Minute}}); err != nil {
				t.Fatalf("new leader's write over a foreign fence: %v", err)
			}
			if got := b.repairs(t, "fence"); got != 1 {
				t.Errorf("repairs{fence} = %g, want 1", got)
			}
			if err := aw.Set(ctx, []store.Entry{{Key: key, Value: []byte("a-stale"), TTL: time.Minute}}); !errors.Is(err, leader.ErrFenced) {
				t.Errorf("ex-leader's write after the repair: err = %v, want ErrFenced", err)
			}
			if _, err := aw.Extend(ctx, []string{key}, []time.Duration{time.Hour}); !errors.Is(err, leader.ErrFenced) {
				t.Errorf("ex-leader's extend after the repair: err = %v, want ErrFenced", err)
			}
			if err := a.Store.Raise(ctx, ta.Epoch); !errors.Is(err, leader.ErrFenced) {
				t.Errorf("raise to the ex-leader's epoch after the repair: err = %v, want ErrFenced", err)
			}
			if got := client.Get(ctx, key).Val(); got != "b" {
				t.Errorf("%s = %q, want the new leader's %q", key, got, "b")
			}
			if got, want := client.Get(ctx, fence).Val(), strconv.FormatInt(tb.Epoch, 10); got != want {
				t.Errorf("fence = %q, want the new leader's epoch %s", got, want)
			}
		})
	}
}

// refusingFence refuses every epoch, as a fence holding a newer leader's
// epoch does. A planted fence can no longer do that for long (one above the
// epoch counter is repaired, TestForeignFence), so the refusal comes from here.
type refusingFence struct{}

func (refusingFence) Raise(_ context.Context, epoch int64) error {
	return fmt.Errorf("raise fences to epoch %d: %w", epoch, leader.ErrFenced)
}

// fencedInstance is an instance whose every new term the fence refuses.
func (e *tamperEnv) fencedInstance(lease, retry time.Duration) *tamperInstance {
	e.t.Helper()
	logs := &testenv.SyncBuffer{}
	reg := prometheus.NewRegistry()
	l, err := leader.NewLease(leader.LeaseOptions{
		Client: e.client, Namespace: e.ns, Duration: lease, RetryPeriod: retry,
		Fence: refusingFence{}, Registerer: reg, Logger: zerolog.New(logs),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = l.Close(context.Background()) })
	return &tamperInstance{Instance: &leadertest.Instance{Lease: l, Reg: reg}, logs: logs}
}

// TestCampaignDoesNotSpinWhenFenced: a fence that refuses every new epoch
// (a newer leader's). Two standbys keep acquiring, failing to raise and
// releasing; they must back off (and not wake each other or themselves with
// their release announcements), and say that they are fenced, not that Redis
// is down.
func TestCampaignDoesNotSpinWhenFenced(t *testing.T) {
	srv := testenv.PrivateRedis(t)
	client := srv.Client(t)
	ctx := context.Background()
	env := newTamperEnv(t, client, "spin")
	const retry = 100 * time.Millisecond
	a := env.fencedInstance(time.Second, retry)
	b := env.fencedInstance(time.Second, retry)
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, in := range []*tamperInstance{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if term, err := in.Lease.Campaign(cctx); err == nil {
				t.Errorf("won epoch %d although the fence refuses it", term.Epoch)
			}
		}()
	}
	testenv.Eventually(t, 5*time.Second, "first fenced attempts", func() bool {
		return promtest.Value(t, a.Reg, "hearth_lease_campaign_attempts_total", "result", "fenced") >= 1 &&
			promtest.Value(t, b.Reg, "hearth_lease_campaign_attempts_total", "result", "fenced") >= 1
	})
	start := time.Now()
	n0 := a.attempts(t) + b.attempts(t)
	// A window of 20 retry periods: backing off (up to 4 × retry) makes at
	// most 20 attempts per instance; a busy loop makes thousands.
	testenv.Eventually(t, 30*time.Second, "a 2s window", func() bool { return time.Since(start) >= 20*retry })
	n := a.attempts(t) + b.attempts(t) - n0
	elapsed := time.Since(start)
	cancel()
	wg.Wait()
	if limit := 2 * (float64(elapsed/retry) + 2); n > limit {
		t.Errorf("%g attempts in %s by two fenced standbys, want ≤ %g (no busy loop)", n, elapsed, limit)
	}
	t.Logf("%g attempts in %s by two fenced standbys", n, elapsed)
	for _, in := range []*tamperInstance{a, b} {
		logs := in.logs.String()
		if !strings.Contains(logs, "campaign: fenced") {
			t.Errorf("log does not say the campaign is fenced:\n%s", logs)
		}
		if strings.Contains(logs, "cannot reach redis") {
			t.Errorf("log blames redis reachability while redis answers:\n%s", logs)
		}
	}
}

// TestCampaignSkipsOwnReleases: a standby wakes on another instance's release
// announcement, not on one naming itself, and a flood of announcements makes
// at most one attempt per RetryPeriod/10.
func TestCampaignSkipsOwnReleases(t *testing.T) {
	srv := testenv.PrivateRedis(t)
	client := srv.Client(t)
	ctx := context.Background()
	env := newTamperEnv(t, client, "own")
	leader := env.instance(time.Minute, time.Minute)
	_ = leadertest.Campaign(t, leader.Lease, 5*time.Second)
	const retry = 2 * time.Second
	standby := env.instance(time.Minute, retry)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _, _ = standby.Lease.Campaign(cctx) }()
	channel := env.ns + ":lease:released"
	testenv.Eventually(t, 5*time.Second, "standby subscribed and tried once", func() bool {
		n, _ := client.PubSubNumSub(ctx, channel).Result()
		return n[channel] >= 1 && standby.attempts(t) == 1
	})

	var published atomic.Int64
	flood := func(payload string, d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); {
			client.Publish(ctx, channel, payload)
			published.Add(1)
			time.Sleep(time.Millisecond)
		}
	}
	// Its own announcements (what its own release publishes), for less than
	// one retry period: no attempt.
	flood("1:"+standby.Lease.ID()+"/7", retry/4)
	if got := standby.attempts(t); got != 1 {
		t.Errorf("attempts after %d of its own announcements = %g, want 1", published.Load(), got)
	}
	// Another instance's, for one retry period: woken, but at most once per
	// retry/10.
	flood("1:"+leader.Lease.ID()+"/1", retry)
	if got, limit := standby.attempts(t), 1.0+10+2; got < 2 || got > limit {
		t.Errorf("attempts after a flood of foreign announcements = %g, want 2..%g", got, limit)
	}
}
