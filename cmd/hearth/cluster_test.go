package main_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// clusterMembers is the family size of the cluster tests: enough members to
// land on every master many times over.
const clusterMembers = 3000

// outsideView polls every declared key through a client of its own, every
// 100ms, and records what a reader would have seen: a key missing on a node
// that answered (a gap), a key whose value went back to an older one (a
// regression: a fenced writer's value landing after the new leader's), and
// reads that failed (the dead master's slots during a failover).
type outsideView struct {
	c    redis.UniversalClient
	keys []string
	stop chan struct{}
	done chan struct{}

	mu          sync.Mutex
	gaps        []string
	regressions []string
	failed      int
	polls       int
	newest      map[string]string // the "new" value seen per key, once seen
}

func watchKeys(c redis.UniversalClient, keys []string) *outsideView {
	v := &outsideView{c: c, keys: keys, stop: make(chan struct{}), done: make(chan struct{}), newest: map[string]string{}}
	go func() {
		defer close(v.done)
		ctx := context.Background()
		for {
			select {
			case <-v.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			v.poll(ctx)
		}
	}()
	return v
}

func (v *outsideView) poll(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	pipe := v.c.Pipeline()
	cmds := make([]*redis.StringCmd, len(v.keys))
	for i, k := range v.keys {
		cmds[i] = pipe.Get(pctx, k)
	}
	_, _ = pipe.Exec(pctx)
	now := time.Now().Format("15:04:05.000")
	v.mu.Lock()
	defer v.mu.Unlock()
	v.polls++
	reload := false
	for i, c := range cmds {
		val, err := c.Result()
		switch {
		case errors.Is(err, redis.Nil):
			v.gaps = append(v.gaps, v.keys[i]+" at "+now)
		case err != nil:
			v.failed++
			reload = true
		case strings.HasPrefix(val, "new"):
			v.newest[v.keys[i]] = val
		case v.newest[v.keys[i]] != "":
			v.regressions = append(v.regressions, fmt.Sprintf("%s = %q after %q at %s", v.keys[i], val, v.newest[v.keys[i]], now))
		}
	}
	if cc, ok := v.c.(*redis.ClusterClient); ok && reload {
		cc.ReloadState(ctx) // the reader follows a failover too
	}
}

func (v *outsideView) finish() (gaps, regressions []string, failed, polls int) {
	close(v.stop)
	<-v.done
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.gaps, v.regressions, v.failed, v.polls
}

// heldItems is a Postgres origin for the cluster and sentinel tests: a table of
// clusterMembers rows whose query sleeps while ctl.hold is true, so that a
// test can freeze a leader with its loads in flight.
func heldItems(t *testing.T, n int) *testenv.PostgresEnv {
	t.Helper()
	pg := testenv.Postgres(t)
	if _, err := pg.Pool.Exec(context.Background(), fmt.Sprintf(`
		CREATE TABLE items (id bigint PRIMARY KEY, v text NOT NULL);
		INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, %d) g;
		CREATE TABLE ctl (hold boolean NOT NULL);
		INSERT INTO ctl VALUES (false);`, n)); err != nil {
		t.Fatal(err)
	}
	return pg
}

// itemsQuery sleeps 4s per batch while ctl.hold is set; the snapshot it reads
// items from is taken when it starts, before the sleep.
const itemsQuery = "SELECT i.id::text, i.v FROM items i, (SELECT CASE WHEN hold THEN pg_sleep(4) END FROM ctl) s WHERE i.id = ANY($1::bigint[])"

func clusterConfig(t *testing.T, addrs []string, masterName, ns, dsn string) string {
	t.Helper()
	quoted := make([]string, len(addrs))
	for i, a := range addrs {
		quoted[i] = strconv.Quote(a)
	}
	master := ""
	if masterName != "" {
		master = "\n  master_name: " + masterName
	}
	cfg := fmt.Sprintf(`redis:
  addrs: [%s]%s
  namespace: %s
log: {level: debug, format: json}
refresh: {load_timeout: 6s, jitter: 0, spread: 0.3, batch_size: 250, shutdown_timeout: 5s}
leader: {lease: 1s, retry_period: 250ms}
prewarm: {rewarm_check: 500ms}
sources:
  - {name: db, type: postgres, dsn: %q, max_conns: 8, breaker: {failures: 1000, open_for: 1s}}
keys:
  - {name: top, key: "top", source: db, ttl: 26s, interval: 3s, query: "SELECT 'top'"}
  - name: item
    key: "item:{id}"
    source: db
    ttl: 26s
    interval: 3s
    param_pattern: "[0-9]{1,6}"
    members_query: "SELECT id::text FROM items ORDER BY id"
    query: %q
`, strings.Join(quoted, ", "), master, ns, dsn, itemsQuery)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func startNode(t *testing.T, name, config string) *node {
	t.Helper()
	return startNodeBinary(t, e2e.Binary(t), name, config)
}

// startNodeBinary is startNode with the binary bin (e2e.PlainBinary for a
// test that bounds time from outside).
func startNodeBinary(t *testing.T, bin, name, config string) *node {
	t.Helper()
	addr := e2e.FreeAddr(t)
	n := &node{name: name, proc: e2e.StartBinary(t, bin, []string{"run", "--config", config, "--listen", addr}), url: "http://" + addr}
	n.proc.WaitHTTP(t, n.url+"/healthz", http.StatusOK, 30*time.Second)
	return n
}

func itemKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "item:" + strconv.Itoa(i+1)
	}
	return keys
}

// theLeader waits until exactly one of the nodes is the ready leader, and
// returns it and the other.
func theLeader(t *testing.T, a, b *node) (leader, standby *node) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "one ready leader", func() bool {
		ra, rb := a.status(t, "/readyz") == http.StatusOK, b.status(t, "/readyz") == http.StatusOK
		switch {
		case ra && !rb:
			leader, standby = a, b
		case rb && !ra:
			leader, standby = b, a
		default:
			return false
		}
		return true
	})
	return leader, standby
}

// pauseLeaderMidLoad freezes the leader with loads in flight: every query
// sleeps while ctl.hold is set, the leader is stopped inside one, the origin's
// values change to "new…", and the standby takes over and writes them. Then
// the paused leader resumes: its loads finish with the old values, and every
// write of them it sends must be refused by the fences (or it ends its term
// first and sends none). It returns the new leader.
func pauseLeaderMidLoad(t *testing.T, pg *testenv.PostgresEnv, a, b *node) (old, next *node) {
	t.Helper()
	ctx := context.Background()
	old, next = theLeader(t, a, b)
	if _, err := pg.Pool.Exec(ctx, "UPDATE ctl SET hold = true"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "a load of the leader's sleeps in the origin", func() bool {
		var n int
		_ = pg.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(4)%' AND wait_event = 'PgSleep'").Scan(&n)
		return n > 0
	})
	old.proc.Signal(t, syscall.SIGSTOP)
	resumed := false
	defer func() {
		if !resumed {
			_ = old.proc.Cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	if _, err := pg.Pool.Exec(ctx, "UPDATE ctl SET hold = false; UPDATE items SET v = 'new' || id"); err != nil {
		t.Fatal(err)
	}
	leading(t, next, 30*time.Second)
	base := next.written(t)
	testenv.Eventually(t, 20*time.Second, "the new leader writes the new values", func() bool {
		return next.written(t) >= base+clusterMembers
	})
	old.proc.Signal(t, syscall.SIGCONT)
	resumed = true
	// Resumed, the old leader either sends its loads' writes, and the fences
	// refuse them, or sees its deadline passed first and ends the term, which
	// cancels them before they are sent: which one is a race between two of
	// its goroutines. Either way no old value lands (the outside view's
	// regressions and the fences' epochs, checked by the caller).
	testenv.Eventually(t, 20*time.Second, "the old leader fenced or standing by", func() bool {
		return old.metric(t, "hearth_fenced_writes_total") > 0 || old.health(t).Role == "standby"
	})
	t.Logf("the resumed leader's writes refused by the fences: %.0f", old.metric(t, "hearth_fenced_writes_total"))
	testenv.Eventually(t, 10*time.Second, "the old leader stands by", func() bool { return old.health(t).Role == "standby" })
	return old, next
}

// TestClusterStaysWarm: on a 3-master, 3-replica Redis Cluster a family of
// 3000 members stays warm, seen by a separate client polling every key, while
// (a) the master holding the lease is killed with kill -9 and its replica
// promoted, then restarted; (b) 2000 slots are resharded during refreshes;
// (c) the leader is paused with loads in flight past its lease and resumed:
// its old values are refused on every master (no key regresses), and the new
// leader is never fenced.
func TestClusterStaysWarm(t *testing.T) {
	cl := testenv.RedisCluster(t)
	pg := heldItems(t, clusterMembers)
	ns := "hearth-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	config := clusterConfig(t, cl.Addrs(), "", ns, pg.DSN)
	keys := itemKeys(clusterMembers)
	reader := cl.Client(t)
	ctx := context.Background()

	// hearth prewarm takes the cluster as a seed list URL.
	pre := e2e.Start(t, []string{"prewarm", "--config", config, "--redis", "redis+cluster://" + strings.Join(cl.Addrs()[:2], ",")})
	if code := pre.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("hearth prewarm --redis redis+cluster://… exited %d:\n%s", code, pre.Output())
	}
	if v := reader.Get(ctx, "top").Val(); v != "top" {
		t.Fatalf("after hearth prewarm, top = %q", v)
	}

	a := startNode(t, "a", config)
	leading(t, a, 30*time.Second)
	b := startNode(t, "b", config)
	testenv.Eventually(t, 10*time.Second, "b stands by", func() bool { return b.health(t).Role == "standby" })
	testenv.Eventually(t, 20*time.Second, "every key written", func() bool {
		n := 0
		for _, k := range keys {
			if reader.Exists(ctx, k).Val() == 1 {
				n++
			}
		}
		return n == len(keys)
	})
	view := watchKeys(reader, keys)

	// (a) kill -9 of the master holding the lease, then its return as a replica.
	leaseMaster := cl.MasterOf(t, slot.Of(ns+":{lease}"))
	t.Logf("killing master %s (lease slot)", leaseMaster.Addr)
	base := written(t, a, b)
	cl.KillMaster(t, leaseMaster)
	testenv.Eventually(t, 30*time.Second, "a full refresh after the failover", func() bool {
		return written(t, a, b) >= base+clusterMembers
	})
	cl.Restart(t, leaseMaster)
	leader, standby := theLeader(t, a, b)

	// (b) a reshard of 2000 slots between two masters while refreshes run.
	ms := cl.Masters(t)
	base = written(t, a, b)
	cl.Reshard(t, ms[0], ms[1], 2000)
	testenv.Eventually(t, 20*time.Second, "a full refresh after the reshard", func() bool {
		return written(t, a, b) >= base+clusterMembers
	})

	// (c) the leader paused past its lease with loads in flight. The standby
	// may have led before (a) and had its failover-grace writes fenced by
	// the leader that replaced it: only its fenced writes from here count.
	fencedBefore := standby.metric(t, "hearth_fenced_writes_total")
	old, next := pauseLeaderMidLoad(t, pg, leader, standby)
	base = next.written(t)
	testenv.Eventually(t, 20*time.Second, "the new leader keeps refreshing", func() bool {
		return next.written(t) >= base+clusterMembers
	})

	// The new leader raised the fence of every slot, on every master, to its
	// epoch before writing: an older epoch is refused wherever it writes.
	epoch := strconv.FormatInt(next.health(t).Epoch, 10)
	pipe := reader.Pipeline()
	fences := make([]*redis.StringCmd, slot.Count)
	for i := range fences {
		fences[i] = pipe.Get(ctx, ns+":fence:{"+slot.Tag(i)+"}")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("read the fences: %v", err)
	}
	for i, f := range fences {
		if v := f.Val(); v != epoch {
			t.Fatalf("fence of slot %d (master %s) = %q, want the new leader's epoch %s", i, cl.MasterOf(t, i).Addr, v, epoch)
		}
	}

	gaps, regressions, failed, polls := view.finish()
	t.Logf("outside view: %d polls of %d keys, %d failed reads (dead master's slots during failover)", polls, len(keys), failed)
	if len(gaps) > 0 {
		t.Errorf("%d reads found a declared key missing, first: %v", len(gaps), gaps[:min(5, len(gaps))])
	}
	if len(regressions) > 0 {
		t.Errorf("%d keys went back to a fenced leader's value, first: %v", len(regressions), regressions[:min(5, len(regressions))])
	}
	for _, k := range keys {
		if v := reader.Get(ctx, k).Val(); !strings.HasPrefix(v, "new") {
			t.Fatalf("%s = %q at the end, want the new leader's value", k, v)
		}
	}
	if got := next.metric(t, "hearth_fenced_writes_total") - fencedBefore; got != 0 {
		t.Errorf("the new leader had %g writes fenced in its term", got)
	}
	if old.metric(t, "hearth_leader")+next.metric(t, "hearth_leader") != 1 {
		t.Error("not exactly one leader")
	}
}
