package main_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// failoverTTL is the TTL of the failover test's family: short enough that a
// leader which stopped writing for the failover (the node timeout, then the
// promotion) would let keys on the surviving masters expire.
const failoverTTL = 6 * time.Second

// failoverNodeTimeout is the failover test's cluster-node-timeout: the kill
// is seen after it, and the replica promoted about a second later.
const failoverNodeTimeout = 2 * time.Second

// failoverConfig is clusterConfig with a 6 s TTL refreshed every 3 s, and the
// lease left to Hearth (1 s: the shortest it picks).
func failoverConfig(t *testing.T, addrs []string, ns, dsn string) string {
	t.Helper()
	quoted := make([]string, len(addrs))
	for i, a := range addrs {
		quoted[i] = strconv.Quote(a)
	}
	cfg := fmt.Sprintf(`redis:
  addrs: [%s]
  namespace: %s
log: {level: debug, format: json}
refresh: {load_timeout: 1s, jitter: 0, spread: 0.3, batch_size: 250, shutdown_timeout: 5s}
prewarm: {rewarm_check: 500ms}
sources:
  - {name: db, type: postgres, dsn: %q, max_conns: 8, breaker: {failures: 1000, open_for: 1s}}
keys:
  - name: item
    key: "item:{id}"
    source: db
    ttl: %s
    interval: 3s
    param_pattern: "[0-9]{1,6}"
    members_query: "SELECT id::text FROM items ORDER BY id"
    query: "SELECT id::text, v FROM items WHERE id = ANY($1::bigint[])"
`, strings.Join(quoted, ", "), ns, dsn, failoverTTL)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestClusterFailoverCostsOnlyItsKeys: kill -9 of the master holding the
// lease's slot, on a 3 + 3 Cluster (node timeout 2 s) with two instances and 3,000 members of
// TTL 6 s. The leader cannot renew its lease until the replica is promoted;
// under the failover grace it writes on to the other masters, whose fences
// still carry its epoch. A separate client polling every key every 100 ms
// must find no key absent on a surviving master, and no key going back to an
// older value (the origin's values change as the master dies).
func TestClusterFailoverCostsOnlyItsKeys(t *testing.T) {
	cl := testenv.RedisClusterTimeout(t, failoverNodeTimeout)
	pg := heldItems(t, clusterMembers)
	ns := "hearth-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	config := failoverConfig(t, cl.Addrs(), ns, pg.DSN)
	keys := itemKeys(clusterMembers)
	reader := cl.Client(t)
	ctx := context.Background()

	// The plain binary: this test bounds absences in seconds, and under the
	// race detector on a loaded CI machine raising 16,384 fences outlasts
	// the 1 s lease, so no term could start after the promotion.
	bin := e2e.PlainBinary(t)
	a := startNodeBinary(t, bin, "a", config)
	leading(t, a, 30*time.Second)
	b := startNodeBinary(t, bin, "b", config)
	testenv.Eventually(t, 10*time.Second, "b stands by", func() bool { return b.health(t).Role == "standby" })
	testenv.Eventually(t, 20*time.Second, "every key written", func() bool {
		return countValues(ctx, reader, keys, "") == len(keys)
	})

	// Two scheduled refreshes: the keys' ages spread over the interval, as
	// in a leader's steady state (the start-up load wrote them all at once).
	base := written(t, a, b)
	testenv.Eventually(t, 20*time.Second, "two scheduled refreshes", func() bool {
		return written(t, a, b) >= base+2*clusterMembers
	})

	leaseMaster := cl.MasterOf(t, slot.Of(ns+":{lease}"))
	dead := cl.SlotsOf(t, leaseMaster)
	owners := cl.SlotOwners(t)
	byMaster := map[string][]string{}
	for _, k := range keys {
		if m := owners[slot.Of(k)]; m != leaseMaster {
			byMaster[m.Addr] = append(byMaster[m.Addr], k)
		}
	}
	var views []*masterView
	for addr, ks := range byMaster {
		views = append(views, watchMaster(t, addr, ks))
	}
	if _, err := pg.Pool.Exec(ctx, "UPDATE items SET v = 'new' || id"); err != nil {
		t.Fatal(err)
	}
	t.Logf("killing master %s (lease slot, slots %v)", leaseMaster.Addr, dead)
	killed := time.Now()
	cl.KillMaster(t, leaseMaster) // returns once the replica is promoted
	t.Logf("replica promoted %s after the kill", time.Since(killed).Round(time.Millisecond))
	base = written(t, a, b)
	testenv.Eventually(t, 30*time.Second, "a full refresh after the failover", func() bool {
		return written(t, a, b) >= base+clusterMembers
	})
	// Every key a surviving master held at the kill was written before it:
	// unless refreshed meanwhile, it is gone one TTL after the kill. The
	// views watch that whole window.
	testenv.Eventually(t, 2*failoverTTL, "one TTL past the kill", func() bool {
		return time.Since(killed) > failoverTTL+time.Second
	})
	absent, regressed := map[string]bool{}, map[string]string{}
	var first, last time.Time
	polls, failed := 0, 0
	for _, v := range views {
		v.finish()
		polls += v.polls
		failed += v.failed
		for k, at := range v.absent {
			absent[k] = true
			if first.IsZero() || at[0].Before(first) {
				first = at[0]
			}
			if at[1].After(last) {
				last = at[1]
			}
		}
		for k, r := range v.regressed {
			regressed[k] = r
		}
	}
	window := ""
	if len(absent) > 0 {
		window = fmt.Sprintf(", from %s to %s after the kill", first.Sub(killed).Round(time.Millisecond), last.Sub(killed).Round(time.Millisecond))
	}
	t.Logf("surviving masters, polled every %s: %d polls, %d failed; %d of %d keys absent%s; %d regressed",
		masterPoll, polls, failed, len(absent), len(keys)-countIn(keys, dead), window, len(regressed))
	if len(absent) > 0 {
		some := make([]string, 0, len(absent))
		for k := range absent {
			some = append(some, k)
		}
		sort.Strings(some)
		t.Errorf("%d keys on surviving masters expired during the lease master's failover, first: %v", len(absent), some[:min(5, len(some))])
	}
	for k, r := range regressed {
		t.Errorf("%s went back to an older value: %s", k, r)
		break
	}
	if got := a.metric(t, "hearth_leader_failover_graces_total") + b.metric(t, "hearth_leader_failover_graces_total"); got < 1 {
		t.Errorf("no term entered the failover grace (hearth_leader_failover_graces_total = %g)", got)
	}
	testenv.Eventually(t, 20*time.Second, "every key holds the new value", func() bool {
		return countValues(ctx, reader, keys, "new") == len(keys)
	})
	if a.metric(t, "hearth_leader")+b.metric(t, "hearth_leader") != 1 {
		t.Error("not exactly one leader")
	}
}

// countValues counts the keys that hold a value starting with prefix, one
// pipelined GET each.
func countValues(ctx context.Context, c redis.UniversalClient, keys []string, prefix string) int {
	pipe := c.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Get(ctx, k)
	}
	_, _ = pipe.Exec(ctx)
	n, failed := 0, false
	for _, cmd := range cmds {
		v, err := cmd.Result()
		if err == nil && strings.HasPrefix(v, prefix) {
			n++
		}
		failed = failed || (err != nil && !errors.Is(err, redis.Nil))
	}
	if cc, ok := c.(*redis.ClusterClient); ok && failed {
		cc.ReloadState(ctx) // follow the failover
	}
	return n
}

// masterPoll is how often a masterView reads its keys.
const masterPoll = 50 * time.Millisecond

// masterView polls the keys one master serves, through a client of its own
// to that master alone (a Cluster client's pipeline waits on the dead
// master's slots and would blind it), every masterPoll: the keys it found
// absent (first and last time), and the keys that went back from a "new"
// value to an older one.
type masterView struct {
	c      *redis.Client
	keys   []string
	stop   chan struct{}
	done   chan struct{}
	newest map[string]string

	polls, failed int
	absent        map[string][2]time.Time
	regressed     map[string]string
}

func watchMaster(t *testing.T, addr string, keys []string) *masterView {
	t.Helper()
	v := &masterView{c: redis.NewClient(&redis.Options{Addr: addr}), keys: keys, stop: make(chan struct{}), done: make(chan struct{}),
		newest: map[string]string{}, absent: map[string][2]time.Time{}, regressed: map[string]string{}}
	t.Cleanup(func() { _ = v.c.Close() })
	go func() {
		defer close(v.done)
		tick := time.NewTicker(masterPoll)
		defer tick.Stop()
		for {
			select {
			case <-v.stop:
				return
			case <-tick.C:
			}
			v.poll()
		}
	}()
	return v
}

func (v *masterView) poll() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	pipe := v.c.Pipeline()
	cmds := make([]*redis.StringCmd, len(v.keys))
	for i, k := range v.keys {
		cmds[i] = pipe.Get(ctx, k)
	}
	_, _ = pipe.Exec(ctx)
	now := time.Now()
	v.polls++
	for i, c := range cmds {
		k := v.keys[i]
		val, err := c.Result()
		switch {
		case errors.Is(err, redis.Nil):
			at, seen := v.absent[k]
			if !seen {
				at[0] = now
			}
			at[1] = now
			v.absent[k] = at
		case err != nil:
			v.failed++
		case strings.HasPrefix(val, "new"):
			v.newest[k] = val
		case v.newest[k] != "":
			if _, ok := v.regressed[k]; !ok {
				v.regressed[k] = fmt.Sprintf("%q after %q at %s", val, v.newest[k], now.Format("15:04:05.000"))
			}
		}
	}
}

// finish stops the polling; the results may be read after it.
func (v *masterView) finish() {
	close(v.stop)
	<-v.done
}

// countIn counts the keys whose slots lie in ranges.
func countIn(keys []string, ranges [][2]int) int {
	n := 0
	for _, k := range keys {
		if inRanges(ranges, slot.Of(k)) {
			n++
		}
	}
	return n
}

// inRanges reports whether s lies in one of the [start, end] slot ranges.
func inRanges(ranges [][2]int, s int) bool {
	for _, r := range ranges {
		if s >= r[0] && s <= r[1] {
			return true
		}
	}
	return false
}
