// Package leadertest builds leader-elected instances for tests: a lease and
// its fenced store sharing one Hearth namespace on a real Redis, wired as the
// daemon wires them.
package leadertest

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/warmer"
)

// Env is one Hearth namespace (NS) on a Redis; Prefix starts every key of
// the test's own.
type Env struct {
	t      testing.TB
	Client *redis.Client
	NS     string
	Prefix string
	// Log is where the instances built from now on log (zerolog's zero
	// value: nowhere).
	Log zerolog.Logger
}

// New gives the test a namespace of its own on the shared test Redis.
func New(t testing.TB) *Env {
	env := testenv.Redis(t)
	return &Env{t: t, Client: env.Client, NS: env.Prefix + "hearth", Prefix: env.Prefix}
}

// On is a namespace ns on client (a private Redis, for tests that tamper with it).
func On(t testing.TB, client *redis.Client, ns string) *Env {
	return &Env{t: t, Client: client, NS: ns}
}

// Instance is one Hearth instance's lease and fenced store, with its own registry.
type Instance struct {
	Lease *leader.Lease
	Store *fence.FencedStore
	Reg   *prometheus.Registry
}

// Instance builds an instance: a lease of the given duration and retry
// period, fences per slot or one, logging to e.Log; closed when the test ends.
func (e *Env) Instance(lease, retry time.Duration, perSlot bool) *Instance {
	e.t.Helper()
	log := e.Log
	reg := prometheus.NewRegistry()
	store := fence.NewFencedStore(fence.FencedStoreOptions{Client: e.Client, Namespace: e.NS, PerSlot: &perSlot, Registerer: reg, Logger: log})
	l, err := leader.NewLease(leader.LeaseOptions{
		Client: e.Client, Namespace: e.NS, Duration: lease, RetryPeriod: retry, Fence: store, Registerer: reg, Logger: log,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = l.Close(context.Background()) })
	return &Instance{Lease: l, Store: store, Reg: reg}
}

// Gate is the instance's warmer gate, as the daemon wires it.
func (in *Instance) Gate() warmer.Gate { return in.Store.Gate(in.Lease) }

// Campaign wins the lease within the given time, or fails the test.
func Campaign(t testing.TB, l *leader.Lease, within time.Duration) *leader.Term {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	term, err := l.Campaign(ctx)
	if err != nil {
		t.Fatalf("campaign: %v", err)
	}
	return term
}

// WaitDone waits for term to end, or fails the test after within.
func WaitDone(t testing.TB, term *leader.Term, within time.Duration) {
	t.Helper()
	select {
	case <-term.Done():
	case <-time.After(within):
		t.Fatalf("term %d did not end within %s", term.Epoch, within)
	}
}
