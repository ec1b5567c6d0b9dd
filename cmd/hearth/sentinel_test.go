package main_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/testenv"
)

// TestSentinelFailover: pointed at three Sentinels, two Hearth instances keep
// a 1000-member family warm through a SENTINEL FAILOVER and a kill -9 of the
// master (the replica promoted each time): a separate client polling every
// key through the Sentinels finds none missing, leadership is re-established
// under a newer epoch after each, the kill is re-warmed (a new run_id), and
// there is one writer throughout: once the origin's values change, no key
// ever goes back to an older one, and at the end one instance leads and the
// other writes nothing.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	const members = 1000
	s := testenv.RedisSentinel(t)
	pg := heldItems(t, members)
	ns := "hearth-sentinel"
	config := clusterConfig(t, s.SentinelAddrs(), testenv.SentinelMaster, ns, pg.DSN)
	keys := itemKeys(members)
	reader := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: testenv.SentinelMaster, SentinelAddrs: s.SentinelAddrs()})
	t.Cleanup(func() { _ = reader.Close() })
	ctx := context.Background()

	a := startNode(t, "a", config)
	leading(t, a, 30*time.Second)
	b := startNode(t, "b", config)
	testenv.Eventually(t, 10*time.Second, "b stands by", func() bool { return b.health(t).Role == "standby" })
	testenv.Eventually(t, 20*time.Second, "every key written", func() bool {
		return reader.Exists(ctx, keys...).Val() == members
	})
	view := watchKeys(reader, keys)
	epoch := a.health(t).Epoch

	// SENTINEL FAILOVER: the replica becomes master with every key, the
	// lease included: the leader may keep its term (its renewals reach the
	// new master) or lose it to the other instance under a newer epoch.
	base := written(t, a, b)
	s.Failover(t)
	testenv.Eventually(t, 30*time.Second, "a full refresh after the failover", func() bool {
		return written(t, a, b) >= base+members
	})
	leader, _ := theLeader(t, a, b)
	if e := leader.health(t).Epoch; e < epoch {
		t.Fatalf("leader epoch %d after the failover, below %d", e, epoch)
	}
	epoch = leader.health(t).Epoch

	// kill -9 of the master: the sentinels promote the other server. The
	// writes the replica had not received are lost: a leader that kept its
	// term re-warms (the master's run_id changed); one that took over under
	// a newer epoch ran its start-up pre-warm and full refresh.
	restarts := rewarms(t, a, b)
	base = written(t, a, b)
	s.KillMaster(t)
	testenv.Eventually(t, 30*time.Second, "the kill re-warmed", func() bool {
		l, _ := theLeader(t, a, b)
		return written(t, a, b) >= base+members && (l.health(t).Epoch > epoch || rewarms(t, a, b) > restarts)
	})

	// One writer: the origin's values change; once a key shows a new value,
	// it never shows an older one (the outside view counts regressions).
	if _, err := pg.Pool.Exec(ctx, "UPDATE items SET v = 'new' || id"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the new values written", func() bool {
		for _, k := range keys {
			if v := reader.Get(ctx, k).Val(); !strings.HasPrefix(v, "new") {
				return false
			}
		}
		return true
	})
	leader, standby := theLeader(t, a, b)
	quiet := standby.written(t)
	base = leader.written(t)
	testenv.Eventually(t, 20*time.Second, "another full refresh", func() bool { return leader.written(t) >= base+members })

	gaps, regressions, failed, polls := view.finish()
	t.Logf("outside view: %d polls of %d keys, %d failed reads (during failovers)", polls, len(keys), failed)
	if len(gaps) > 0 {
		t.Errorf("%d reads found a declared key missing, first: %v", len(gaps), gaps[:min(5, len(gaps))])
	}
	if len(regressions) > 0 {
		t.Errorf("%d keys went back to an older value, first: %v", len(regressions), regressions[:min(5, len(regressions))])
	}
	if got := standby.written(t); got != quiet {
		t.Errorf("the standby wrote %g keys", got-quiet)
	}
	if leader.metric(t, "hearth_leader")+standby.metric(t, "hearth_leader") != 1 {
		t.Error("not exactly one leader")
	}
}

// written is the keys both instances wrote: only the leader writes.
func written(t *testing.T, nodes ...*node) float64 {
	t.Helper()
	total := 0.0
	for _, n := range nodes {
		total += n.written(t)
	}
	return total
}

// rewarms is the re-warms for a restart both instances ran.
func rewarms(t *testing.T, nodes ...*node) float64 {
	t.Helper()
	total := 0.0
	for _, n := range nodes {
		total += n.metric(t, "hearth_prewarm_rewarms_total", `reason="restart"`)
	}
	return total
}
