package leader

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/store"
)

// The lease's timing that does not talk to Redis: when a standby may take
// over a holder it watches, and a term's renew deadline. The Redis side
// (acquire, renew, release scripts) is proven in lease_test.go against a
// real server.

// A standby takes over a lease only once it has seen the holder go a whole
// lease unrenewed: every renewal (the expiry moving) restarts the clock, a
// re-read of the same expiry (within the rounding of TIME and PTTL) does not,
// and a new holder starts it afresh.
func TestHolderWatchDue(t *testing.T) {
	const lease = 3 * time.Second
	var w holderWatch
	if _, ok := w.due(lease); ok {
		t.Fatal("due with no holder seen")
	}
	w.saw("7:a", 10_000, 0)
	if due, _ := w.due(lease); due != lease+time.Millisecond {
		t.Errorf("due = %v, want a lease (and 1ms) after first seen", due)
	}
	// Re-read 500ms later: PTTL rounded, TIME + PTTL moves by the tolerance.
	w.saw("7:a", 10_000+store.RenewTolerance, 500*time.Millisecond)
	if due, _ := w.due(lease); due != lease+time.Millisecond {
		t.Errorf("a re-read of the same expiry moved due to %v", due)
	}
	// Renewed (the expiry moved by a renew interval) at 1s.
	w.saw("7:a", 11_000, time.Second)
	if due, _ := w.due(lease); due != time.Second+lease+time.Millisecond {
		t.Errorf("after a renewal at 1s due = %v, want a lease after it", due)
	}
	// Another holder (a new term) at 2s.
	w.saw("8:b", 11_000, 2*time.Second)
	if due, _ := w.due(lease); due != 2*time.Second+lease+time.Millisecond {
		t.Errorf("after a new holder at 2s due = %v, want a lease after it", due)
	}
}

// termFor is a term of a lease on c that never reaches Redis, deadline
// after its lease's clock origin.
func termFor(t *testing.T, c *redis.Client, d time.Duration) (*Lease, *Term) {
	t.Helper()
	l, err := NewLease(LeaseOptions{Client: c, Duration: d})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	term := &Term{Epoch: 1, lease: l, value: "1:x", ctx: ctx, cancel: cancel}
	term.deadline.Store(int64(d - l.safety))
	l.current.Store(term)
	return l, term
}

// A term admits writes until its renew deadline (the lease less a tenth,
// so that it stops before its key in Redis can expire) and not a moment
// after; a renewal moves the deadline later, never earlier, and never
// revives a term that ended.
func TestTermDeadline(t *testing.T) {
	// Outside the bubble: the client's own goroutines outlive it.
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	synctest.Test(t, func(t *testing.T) {
		const lease = 10 * time.Second
		l, term := termFor(t, c, lease)
		if l.safety != lease/10 {
			t.Fatalf("safety margin = %v, want a tenth of the lease", l.safety)
		}
		time.Sleep(9*time.Second - time.Nanosecond)
		if !term.Valid() {
			t.Fatal("term invalid before its deadline")
		}
		term.extend(5 * time.Second) // a late reply of an older renewal
		if !term.Valid() {
			t.Fatal("an earlier deadline shortened the term")
		}
		time.Sleep(time.Nanosecond)
		if term.Valid() {
			t.Fatal("term still valid at its deadline: it could write after its lease expired in Redis")
		}
		// Renewed: the new deadline counts from when the renewal began.
		term.extend(l.since() + lease - l.safety)
		time.Sleep(9*time.Second - time.Nanosecond)
		if !term.Valid() {
			t.Fatal("a renewal did not move the deadline")
		}
		if !term.end(ErrLeaseLost) || term.end(ErrLeaseExpired) {
			t.Error("end did not end the term exactly once")
		}
		term.extend(l.since() + time.Hour)
		if term.Valid() {
			t.Error("a renewal revived an ended term")
		}
		if !errors.Is(term.Err(), ErrLeaseLost) || !errors.Is(context.Cause(term.Context()), ErrLeaseLost) {
			t.Errorf("ended term: Err %v, cause %v; want ErrLeaseLost", term.Err(), context.Cause(term.Context()))
		}
		if _, ok := l.Current(); ok {
			t.Error("an ended term is still the lease's current one")
		}
	})
}
