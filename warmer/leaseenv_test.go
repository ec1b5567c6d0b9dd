package warmer_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/leader"
)

// leaseEnv is one Hearth namespace on a Redis, with helpers to build
// instances (a lease and its fenced store) that share it: the catch-up runs
// as a leader elected by the leader package would.
type leaseEnv struct {
	t      *testing.T
	client *redis.Client
	ns     string
	prefix string
}

func newLeaseEnv(t *testing.T) *leaseEnv {
	env := testenv.Redis(t)
	return &leaseEnv{t: t, client: env.Client, ns: env.Prefix + "hearth", prefix: env.Prefix}
}

type instance struct {
	lease *leader.Lease
	store *leader.FencedStore
	reg   *prometheus.Registry
}

func (e *leaseEnv) instance(lease, retry time.Duration, perSlot bool) *instance {
	e.t.Helper()
	reg := prometheus.NewRegistry()
	store := leader.NewFencedStore(leader.FencedStoreOptions{Client: e.client, Namespace: e.ns, PerSlot: &perSlot, Registerer: reg})
	l, err := leader.NewLease(leader.LeaseOptions{
		Client: e.client, Namespace: e.ns, Duration: lease, RetryPeriod: retry, Fence: store, Registerer: reg,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = l.Close(context.Background()) })
	return &instance{lease: l, store: store, reg: reg}
}

func campaign(t *testing.T, l *leader.Lease, within time.Duration) *leader.Term {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	term, err := l.Campaign(ctx)
	if err != nil {
		t.Fatalf("campaign: %v", err)
	}
	return term
}
