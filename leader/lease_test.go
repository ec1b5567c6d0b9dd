package leader_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/internal/leadertest"
	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/leader"
)

func TestLeaseOneLeader(t *testing.T) {
	env := leadertest.New(t)
	a := env.Instance(2*time.Second, 50*time.Millisecond, false)
	b := env.Instance(2*time.Second, 50*time.Millisecond, false)

	ta := leadertest.Campaign(t, a.Lease, 5*time.Second)
	if _, ok := a.Lease.Current(); !ok {
		t.Fatal("a.Current after winning: no term")
	}
	if ta.Context().Err() != nil {
		t.Fatalf("a's term context ended at once: %v", context.Cause(ta.Context()))
	}

	t.Run("a standby does not win while the leader renews", func(t *testing.T) {
		// Several lease lifetimes: only renewals keep a's lease alive.
		ctx, cancel := context.WithTimeout(context.Background(), 3*2*time.Second)
		defer cancel()
		if term, err := b.Lease.Campaign(ctx); err == nil {
			t.Fatalf("b won epoch %d while a leads", term.Epoch)
		}
		if _, ok := b.Lease.Current(); ok {
			t.Error("b.Current: a term, while a leads")
		}
		if !ta.Valid() {
			t.Errorf("a's term ended: %v", ta.Err())
		}
		if _, err := b.Gate().Admit(context.Background()); !errors.Is(err, leader.ErrNotLeader) {
			t.Errorf("b.Admit = %v, want ErrNotLeader", err)
		}
	})

	t.Run("release hands over at once, with a greater epoch", func(t *testing.T) {
		// b retries only every minute: winning sooner proves the announcement.
		slow := env.Instance(2*time.Second, time.Minute, false)
		won := make(chan *leader.Term, 1)
		go func() {
			term, err := slow.Lease.Campaign(context.Background())
			if err == nil {
				won <- term
			}
		}()
		// Let the standby subscribe and fail its first try.
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			n, _ := env.Client.PubSubNumSub(context.Background(), env.NS+":lease:released").Result()
			if n[env.NS+":lease:released"] > 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := ta.Release(context.Background()); err != nil {
			t.Fatalf("release: %v", err)
		}
		if !errors.Is(ta.Err(), leader.ErrReleased) {
			t.Errorf("a's term ended with %v, want ErrReleased", ta.Err())
		}
		if cause := context.Cause(ta.Context()); !errors.Is(cause, leader.ErrReleased) {
			t.Errorf("a's term context ended with %v, want ErrReleased", cause)
		}
		select {
		case tb := <-won:
			if tb.Epoch <= ta.Epoch {
				t.Errorf("new epoch %d, want > %d", tb.Epoch, ta.Epoch)
			}
			if err := tb.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			tc := leadertest.Campaign(t, a.Lease, 5*time.Second)
			if tc.Epoch <= tb.Epoch {
				t.Errorf("third epoch %d, want > %d", tc.Epoch, tb.Epoch)
			}
			_ = tc.Release(context.Background())
		case <-time.After(20 * time.Second):
			t.Fatal("standby did not take over after the release announcement")
		}
	})
}

func TestLeaseStepsDown(t *testing.T) {
	t.Run("lost lease ends the term", func(t *testing.T) {
		env := leadertest.New(t)
		a := env.Instance(time.Second, 50*time.Millisecond, false)
		ta := leadertest.Campaign(t, a.Lease, 5*time.Second)
		// Another party deleted the lease (as an expiry during a pause would).
		env.Client.Del(context.Background(), env.NS+":{lease}")
		leadertest.WaitDone(t, ta, 5*time.Second)
		if !errors.Is(ta.Err(), leader.ErrLeaseLost) {
			t.Errorf("term ended with %v, want ErrLeaseLost", ta.Err())
		}
		if _, ok := a.Lease.Current(); ok {
			t.Error("still leader after losing the lease")
		}
		if cause := context.Cause(ta.Context()); !errors.Is(cause, leader.ErrLeaseLost) {
			t.Errorf("term context ended with %v, want ErrLeaseLost", cause)
		}
		if got := promtest.Value(t, a.Reg, "hearth_leader"); got != 0 {
			t.Errorf("hearth_leader = %g, want 0", got)
		}
	})

	t.Run("unreachable redis ends the term by the renew deadline", func(t *testing.T) {
		srv := testenv.PrivateRedis(t)
		client := srv.Client(t)
		reg := prometheus.NewRegistry()
		l, err := leader.NewLease(leader.LeaseOptions{Client: client, Namespace: "hearth", Duration: time.Second, RetryPeriod: 50 * time.Millisecond, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Close(context.Background()) }()
		term := leadertest.Campaign(t, l, 5*time.Second)
		srv.Pause(t)
		defer srv.Resume(t)
		leadertest.WaitDone(t, term, 5*time.Second)
		if !errors.Is(term.Err(), leader.ErrLeaseExpired) {
			t.Errorf("term ended with %v, want ErrLeaseExpired", term.Err())
		}
		if _, ok := l.Current(); ok {
			t.Error("still leader with redis unreachable")
		}
		if term.Context().Err() == nil {
			t.Error("term context still live past the renew deadline")
		}
	})
}

func TestCampaignAgainstDeadRedisIsCounted(t *testing.T) {
	srv := testenv.PrivateRedis(t)
	client := srv.Client(t)
	reg := prometheus.NewRegistry()
	logs := &testenv.SyncBuffer{}
	store := fence.NewFencedStore(fence.FencedStoreOptions{Client: client, Namespace: "hearth", Registerer: reg})
	l, err := leader.NewLease(leader.LeaseOptions{
		Client: client, Namespace: "hearth", Duration: time.Second, RetryPeriod: 50 * time.Millisecond, Fence: store, Registerer: reg,
		Logger: zerolog.New(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	srv.Stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := make(chan error, 1)
	go func() {
		_, err := l.Campaign(ctx)
		errs <- err
	}()
	for promtest.Value(t, reg, "hearth_lease_campaign_errors_total") < 2 {
		if ctx.Err() != nil {
			t.Fatal("campaign errors against a stopped Redis were not counted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Said as it is: Redis is down, not "fenced" nor a script error.
	if l := logs.String(); !strings.Contains(l, "campaign: cannot reach redis") {
		t.Errorf("campaign log against a stopped redis does not say it cannot reach it:\n%s", l)
	}
	srv.Start(t)
	select {
	case err := <-errs:
		if err != nil {
			t.Fatalf("campaign after Redis came back: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("no leadership after Redis came back")
	}
}

// slowFence raises nothing and takes its time, as raising a Cluster's
// 16,384 per-slot fences does on a loaded machine.
type slowFence time.Duration

func (f slowFence) Raise(ctx context.Context, _ int64) error {
	select {
	case <-time.After(time.Duration(f)):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A term whose fence raise took longer than a renew interval is renewed at
// once, not a whole interval after the raise: otherwise a short lease
// reaches its renew deadline unrenewed and the new leader steps down in its
// first second (seen on a Cluster under load).
func TestLeaseSlowFenceRaiseStillRenews(t *testing.T) {
	env := leadertest.New(t)
	const lease = time.Second // renew interval 333ms, deadline 900ms after the acquisition began
	l, err := leader.NewLease(leader.LeaseOptions{
		Client: env.Client, Namespace: env.NS, Duration: lease, RetryPeriod: 50 * time.Millisecond,
		Fence: slowFence(700 * time.Millisecond), Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	term := leadertest.Campaign(t, l, 5*time.Second)
	// Three leases on: only renewals that began on time keep it.
	select {
	case <-term.Done():
		t.Fatalf("the term ended %v after a slow fence raise: %v", lease, term.Err())
	case <-time.After(3 * lease):
	}
	if !term.Valid() {
		t.Fatalf("term invalid after three leases: %v", term.Err())
	}
}

// RenewNow renews at once instead of at the next renew interval: a leader
// told that Redis lost its data (the lease with it) ends its term as soon as
// the renewal finds the lease gone, so that a new term's catch-up can write
// the keys back, rather than up to a renew interval later.
func TestRenewNowSeesALostLeaseAtOnce(t *testing.T) {
	env := leadertest.New(t)
	a := env.Instance(30*time.Second, 50*time.Millisecond, false) // renew interval 10s
	term := leadertest.Campaign(t, a.Lease, 5*time.Second)
	env.Client.Del(context.Background(), env.NS+":{lease}") // as a restart without persistence does
	term.RenewNow()
	term.RenewNow() // asks while one is pending are one, and never block
	leadertest.WaitDone(t, term, 5*time.Second)
	if !errors.Is(term.Err(), leader.ErrLeaseLost) {
		t.Errorf("term ended with %v, want ErrLeaseLost", term.Err())
	}
}

// A campaign against a Redis that refuses connections (restarting) tries
// again every RetryPeriod/10, not after the backoff that grew while it was
// down: with a 2 s retry period the attempts came 2, 4 and 8 s apart, and
// Redis back after 7 s was not tried again until 14 s.
func TestCampaignWinsSoonAfterARefusingRedisReturns(t *testing.T) {
	srv := testenv.PrivateRedis(t)
	client := srv.Client(t)
	reg := prometheus.NewRegistry()
	l, err := leader.NewLease(leader.LeaseOptions{Client: client, Namespace: "hearth", Duration: 6 * time.Second, RetryPeriod: 2 * time.Second, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	srv.Stop(t)
	won := make(chan time.Time, 1)
	go func() {
		if _, err := l.Campaign(context.Background()); err == nil {
			won <- time.Now()
		}
	}()
	time.Sleep(7 * time.Second) // attempts at 0, 2, 6 and, backed off, 14 s
	up := srv.StartTimed(t)
	select {
	case at := <-won:
		// RetryPeriod/10 is 200ms (±20%); the backoff would have waited 7 s.
		if took := at.Sub(up); took > 2*time.Second {
			t.Errorf("won %v after Redis accepted connections again, want within a few tenths of a second", took)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no term 20s after Redis came back")
	}
}
