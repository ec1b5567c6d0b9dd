package testenv_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/testenv"
)

// TestRedisCluster: the harness's cluster serves keys on three masters, a
// killed master's replica takes over its slots, a resharded key stays
// readable, and a restarted node rejoins.
func TestRedisCluster(t *testing.T) {
	c := testenv.RedisCluster(t)
	ctx := context.Background()
	cc := c.Client(t)
	masters := c.Masters(t)
	if got, want := len(masters), 3; got != want {
		t.Fatalf("masters: got %d, want %d", got, want)
	}
	for i := range 100 {
		if err := cc.Set(ctx, fmt.Sprintf("k%d", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	count := func(when string) {
		n := 0
		for i := range 100 {
			if cc.Exists(ctx, fmt.Sprintf("k%d", i)).Val() == 1 {
				n++
			}
		}
		t.Logf("%s: %d keys", when, n)
	}
	count("before")
	m := c.MasterOf(t, 0)
	promoted := c.KillMaster(t, m)
	count("after kill")
	if got := c.MasterOf(t, 0); got != promoted {
		t.Fatalf("slot 0 served by %s, want the promoted replica %s", got.Addr, promoted.Addr)
	}
	c.Restart(t, m)
	if got, want := len(c.Masters(t)), 3; got != want {
		t.Fatalf("masters after restart: got %d, want %d", got, want)
	}
	count("after restart")
	ms := c.Masters(t)
	c.Reshard(t, ms[0], ms[1], 100)
	n := 0
	for i := range 100 {
		v, err := cc.Get(ctx, fmt.Sprintf("k%d", i)).Int()
		if err == redis.Nil {
			continue // lost with the killed master: replication is asynchronous
		}
		if err != nil {
			t.Fatal(err)
		}
		if v != i {
			t.Fatalf("k%d = %d", i, v)
		}
		n++
	}
	if n < 90 {
		t.Fatalf("only %d of 100 keys survived a failover and a reshard", n)
	}
}

// TestRedisSentinel: the harness's sentinels fail over on SENTINEL FAILOVER
// and on kill -9 of the master, and a sentinel client follows.
func TestRedisSentinel(t *testing.T) {
	s := testenv.RedisSentinel(t)
	ctx := context.Background()
	fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: testenv.SentinelMaster, SentinelAddrs: s.SentinelAddrs()})
	t.Cleanup(func() { _ = fc.Close() })
	if err := fc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	first := s.CurrentMaster(t)
	second := s.Failover(t)
	if second == first {
		t.Fatal("failover kept the master")
	}
	third := s.KillMaster(t)
	if third != first {
		t.Fatalf("kill -9 of %s: new master %s, want %s", second.Addr, third.Addr, first.Addr)
	}
	testenv.Eventually(t, 10*1e9, "the failover client writes to the new master", func() bool {
		return fc.Set(ctx, "k2", "v", 0).Err() == nil
	})
}
