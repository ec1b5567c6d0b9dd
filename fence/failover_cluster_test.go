package fence_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// TestFailoverGraceFencedByNextLeader: on a real 3 + 3 Cluster, kill -9 of the
// master holding the lease's slot. Leader A cannot renew; under its failover
// grace it goes on writing the other masters past its renew deadline. Once
// the replica is promoted and A's lease expired there, B takes the lease and
// raises every slot's fence: from then on A's writes are refused on the
// surviving masters — whether A is still in its grace (the refusal ends its
// term) or saw its lease gone first — and B's values stay.
func TestFailoverGraceFencedByNextLeader(t *testing.T) {
	cl := testenv.RedisClusterTimeout(t, 2*time.Second)
	cc := cl.Client(t)
	ctx := context.Background()
	// The surviving masters serve their slots while the dead one's are
	// unowned: with Redis's default (full coverage required) every master
	// refuses commands (CLUSTERDOWN) from the dead master's FAIL, which can
	// come before A's renew deadline, to the promotion, and A's grace
	// writes then have nowhere to land (a CI run: the last write at 2.3 s,
	// the promotion at 3.4 s).
	for _, n := range cl.Nodes {
		if err := n.Client(t).ConfigSet(ctx, "cluster-require-full-coverage", "no").Err(); err != nil {
			t.Fatalf("%s: %v", n.Addr, err)
		}
	}
	// The test's client follows the failover as the daemon's does (it
	// reloads its slot map on failure; here every 100 ms).
	stopReload := make(chan struct{})
	var reloads sync.WaitGroup
	reloads.Go(func() {
		for {
			select {
			case <-stopReload:
				return
			case <-time.After(100 * time.Millisecond):
				cc.ReloadState(ctx)
			}
		}
	})
	defer func() { close(stopReload); reloads.Wait() }()

	const ns = "hearth"
	newInstance := func(lease, renew, retry time.Duration) (*leader.Lease, *fence.FencedStore, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		fs := fence.NewFencedStore(fence.FencedStoreOptions{Client: cc, Namespace: ns, Registerer: reg})
		l, err := leader.NewLease(leader.LeaseOptions{Client: cc, Namespace: ns, Duration: lease, RenewInterval: renew,
			RetryPeriod: retry, Fence: fs, FailoverGrace: 20 * time.Second, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		return l, fs, reg
	}
	// A renews seldom (every 1.5 s of a 3 s lease, retried as seldom): once
	// in its grace it mostly does not look at the lease again before B has
	// raised the fences.
	// B's lease of 2 s still leaves a 3 s lease alone (under 2 × 2 s).
	la, fa, rega := newInstance(3*time.Second, 1500*time.Millisecond, 1500*time.Millisecond)
	ta, err := la.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wa := fa.Writer(ta)

	leaseMaster := cl.MasterOf(t, slot.Of(store.LeaseKey(ns)))
	owners := cl.SlotOwners(t)
	var keys []string // one key on each surviving master
	seen := map[*testenv.RedisServer]bool{leaseMaster: true}
	for i := 0; len(keys) < 2; i++ {
		k := "item:" + strconv.Itoa(i)
		if m := owners[slot.Of(k)]; !seen[m] {
			seen[m] = true
			keys = append(keys, k)
		}
	}
	write := func(w warmer.Store, value string) error {
		es := make([]store.Entry, len(keys))
		for i, k := range keys {
			es[i] = store.Entry{Key: k, Value: []byte(value), TTL: time.Minute}
		}
		return w.Set(ctx, es)
	}
	if err := write(wa, "a"); err != nil {
		t.Fatal(err)
	}

	// A writes every 50 ms from the kill on; its writes past its renew
	// deadline (last renewal + 2.7 s) are the grace's.
	killed := time.Now()
	var (
		mu        sync.Mutex
		lastWrite time.Duration // since the kill, of A's last write that landed
	)
	stopA := make(chan struct{})
	var writer sync.WaitGroup
	writer.Go(func() {
		for {
			select {
			case <-stopA:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if write(wa, "a") == nil {
				mu.Lock()
				lastWrite = time.Since(killed)
				mu.Unlock()
			}
		}
	})
	// B campaigns from the kill on, as a standby does: it acquires once the
	// replica is promoted (A's lease expired there), then raises every fence,
	// while A, in its grace, may not have looked at the lease again.
	lb, fb, _ := newInstance(2*time.Second, 0, 100*time.Millisecond)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	type won struct {
		t   *leader.Term
		err error
	}
	campaign := make(chan won, 1)
	go func() {
		tb, err := lb.Campaign(cctx)
		campaign <- won{tb, err}
	}()
	cl.KillMaster(t, leaseMaster)
	t.Logf("replica promoted %s after the kill", time.Since(killed).Round(time.Millisecond))
	w := <-campaign
	if w.err != nil {
		t.Fatalf("B's campaign after the failover: %v", w.err)
	}
	tb := w.t
	close(stopA)
	writer.Wait()
	mu.Lock()
	last := lastWrite
	mu.Unlock()
	if tb.Epoch <= ta.Epoch {
		t.Fatalf("B's epoch %d is not above A's %d", tb.Epoch, ta.Epoch)
	}
	if got := counter(t, rega, "hearth_leader_failover_graces_total", ""); got != 1 {
		t.Fatalf("A entered the failover grace %g times, want 1", got)
	}
	// A's renew deadline is at most 2.7 s after the kill (its last renewal
	// at most at the kill): a write landing after that is the grace's. (The
	// replica's promotion, and B's fences with it, can come as early as 2.7 s
	// after the kill: a bound of 3 s failed at 2.731 s on a loaded machine.)
	if last <= 2700*time.Millisecond {
		t.Errorf("A's last write landed %s after the kill: never past its renew deadline", last.Round(time.Millisecond))
	}
	t.Logf("A's writes landed until %s after the kill (its renew deadline: at most 2.7 s after it)", last.Round(time.Millisecond))

	if err := write(fb.Writer(tb), "b"); err != nil {
		t.Fatalf("B's write: %v", err)
	}
	// A's term may still be in its grace: only the fences can refuse it.
	err = write(wa, "a-late")
	if !errors.Is(err, leader.ErrFenced) {
		t.Fatalf("A's write after B's raise: %v, want it fenced", err)
	}
	if ta.Err() == nil {
		t.Error("A's term goes on after a write of it was refused")
	}
	for _, k := range keys {
		if v, err := cc.Get(ctx, k).Result(); err != nil || v != "b" {
			t.Errorf("%s = %q (%v), want B's value", k, v, err)
		}
	}
	if !tb.Valid() {
		t.Errorf("B's term ended: %v", tb.Err())
	}
	if errors.Is(ta.Err(), leader.ErrFenced) {
		t.Log("A was in its grace until the refused write ended it")
	} else {
		t.Logf("A's term had ended before the refused write: %v", ta.Err())
	}
}
