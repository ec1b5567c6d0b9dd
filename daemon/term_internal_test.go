package daemon

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/catchup"
	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// fakeStatus records what the campaign reports.
type fakeStatus struct {
	mu    sync.Mutex
	role  string
	epoch int64
	ready bool
}

func (f *fakeStatus) SetRole(role string, epoch int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.role, f.epoch = role, epoch
}

func (f *fakeStatus) SetReady(ready bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ready = ready
}

func (f *fakeStatus) get() (string, int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.role, f.epoch, f.ready
}

// termService counts the terms it ran in and whether one runs now.
type termService struct {
	started, ended atomic.Int64
}

func (s *termService) Run(ctx context.Context) error {
	s.started.Add(1)
	<-ctx.Done()
	s.ended.Add(1)
	return nil
}

func (s *termService) running() bool { return s.started.Load() > s.ended.Load() }

// newTermWork is the work of a term with no declarations, and svc as its one service.
func newTermWork(t *testing.T, l *leadership, svc *termService, srv status) *termWork {
	t.Helper()
	w, err := warmer.New(warmer.Options{Store: l.store, Gate: l.gate, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	sched, err := jobs.New(jobs.Options{Refresher: w})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sched.Close(context.Background()) })
	return &termWork{w: w, sched: sched, srv: srv, catchUp: catchup.Options{Schedule: sched},
		services: []func(context.Context) error{svc.Run}}
}

// TestTermRunsTheLeadersServices: a won term starts every leader-only
// service under its context; when the term ends (the lease lost behind the
// leader's back) they stop and /readyz turns 503, and the next term starts
// them again with a greater epoch. Nothing polls whether this instance leads.
func TestTermRunsTheLeadersServices(t *testing.T) {
	env := testenv.Redis(t)
	ns := env.Prefix + "hearth"
	store := fence.NewFencedStore(fence.FencedStoreOptions{Client: env.Client, Namespace: ns})
	lease, err := leader.NewLease(leader.LeaseOptions{Client: env.Client, Namespace: ns, Duration: 2 * time.Second,
		RenewInterval: 100 * time.Millisecond, RetryPeriod: 50 * time.Millisecond, Fence: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lease.Close(context.Background()) })
	l := &leadership{lease: lease, store: store, gate: store.Gate(lease), log: zerolog.Nop(), done: make(chan struct{})}
	svc, srv := &termService{}, &fakeStatus{}
	work := newTermWork(t, l, svc, srv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l.start(ctx, work)

	testenv.Eventually(t, 10*time.Second, "the first term's service and ready", func() bool {
		role, _, ready := srv.get()
		return svc.running() && role == "leader" && ready
	})
	_, first, _ := srv.get()
	// The lease vanishes: the next renewal finds it gone and the term ends.
	env.Client.Del(ctx, ns+":{lease}")
	testenv.Eventually(t, 10*time.Second, "the second term", func() bool {
		role, epoch, ready := srv.get()
		return svc.started.Load() == 2 && svc.ended.Load() == 1 && role == "leader" && epoch > first && ready
	})

	// Shutdown: the services stop, the schedule drains, the lease is released.
	cancel()
	if err := work.sched.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.wait()
	if svc.running() {
		t.Error("a service still runs after the campaign returned")
	}
	if err := l.release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := env.Client.Exists(context.Background(), ns+":{lease}").Val(); n != 0 {
		t.Error("the lease is still held after release")
	}
}

// TestEndlessTermWithoutLease: with leader.enabled false the same path runs
// one endless term: the services start at once, ready without a lease, and
// they run until shutdown.
func TestEndlessTermWithoutLease(t *testing.T) {
	env := testenv.Redis(t)
	l := &leadership{store: &store.RedisStore{Client: env.Client}, log: zerolog.Nop(), done: make(chan struct{})}
	svc, srv := &termService{}, &fakeStatus{}
	work := newTermWork(t, l, svc, srv)
	ctx, cancel := context.WithCancel(context.Background())
	l.start(ctx, work)
	testenv.Eventually(t, 10*time.Second, "the endless term's service and ready", func() bool {
		role, _, ready := srv.get()
		return svc.running() && role == "leader" && ready
	})
	time.Sleep(100 * time.Millisecond)
	if svc.started.Load() != 1 || !svc.running() {
		t.Fatalf("service started %d times, running %v; want one endless term", svc.started.Load(), svc.running())
	}
	cancel()
	if err := work.sched.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.wait()
	if svc.running() {
		t.Error("the service still runs after shutdown")
	}
	if err := l.release(context.Background()); err != nil {
		t.Fatal(err)
	}
}
