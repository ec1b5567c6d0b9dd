package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterNodeTimeout is the cluster-node-timeout of a [RedisCluster]: a
// master that does not answer for this long is failed over to its replica.
const ClusterNodeTimeout = time.Second

// Cluster is a Redis Cluster of a test's own: 3 masters and 3 replicas, each a
// private redis-server on a free loopback port, persistence off. Its methods
// must be called from the test's goroutine.
type Cluster struct {
	// Nodes are the six servers, in creation order; redis-cli picks which
	// are masters (see [Cluster.Masters]; roles change on failover).
	Nodes []*RedisServer

	mu sync.Mutex
}

// RedisCluster starts a 3-master, 3-replica Redis Cluster on free loopback
// ports and waits until every node reports cluster_state:ok and agrees on the
// slot map. Everything is stopped at cleanup. A cluster that cannot be
// started fails the test (see RequireServer).
func RedisCluster(t testing.TB) *Cluster {
	t.Helper()
	return RedisClusterTimeout(t, ClusterNodeTimeout)
}

// RedisClusterTimeout is [RedisCluster] with another cluster-node-timeout: a
// failover then takes about that long plus the election (a second or so).
func RedisClusterTimeout(t testing.TB, nodeTimeout time.Duration) *Cluster {
	t.Helper()
	c, err := newCluster(nodeTimeout)
	if c != nil {
		t.Cleanup(func() {
			for _, n := range c.Nodes {
				if err := n.stop(); err != nil {
					t.Errorf("testenv: stopping cluster node %s: %v", n.Addr, err)
				}
			}
		})
	}
	if err != nil {
		RequireServer(t, "cannot start a redis cluster: %v", err)
		return nil
	}
	return c
}

func newCluster(nodeTimeout time.Duration) (*Cluster, error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("redis-cli not found: %w", err)
	}
	c := &Cluster{}
	for range 6 {
		n, err := newRedisServer("--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.Itoa(int(nodeTimeout.Milliseconds())),
			// A replica whose master is gone for long is still promoted.
			"--cluster-replica-validity-factor", "0")
		if err != nil {
			return c, err
		}
		c.Nodes = append(c.Nodes, n)
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes {
		args = append(args, n.Addr)
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := runCLI(cli, 60*time.Second, args...); err != nil {
		return c, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.waitStable(30 * time.Second); err != nil {
		return c, err
	}
	return c, nil
}

// runCLI runs redis-cli with args, returning its combined output.
func runCLI(bin string, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	setParentDeathSignal(cmd, syscall.SIGKILL)
	err := cmd.Run()
	return out.String(), err
}

// Addrs returns every running node's address: a seed list for a cluster client.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, n := range c.Nodes {
		if n.running() {
			out = append(out, n.Addr)
		}
	}
	return out
}

// Client returns a new cluster client seeded with every node, closed at cleanup.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func (s *RedisServer) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil && !s.proc.exited()
}

// nodeView is what one node says about itself and the cluster.
type nodeView struct {
	role   string // master or slave
	state  string // cluster_state
	id     string // node id
	slots  string // the node's CLUSTER NODES lines, sorted, without flags that change (ping times, epochs)
	nslots int    // slots owned by this node
}

func viewOf(ctx context.Context, addr string) (nodeView, error) {
	cl := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	defer cl.Close()
	var v nodeView
	info, err := cl.ClusterInfo(ctx).Result()
	if err != nil {
		return v, fmt.Errorf("cluster info on %s: %w", addr, err)
	}
	for _, l := range strings.Split(info, "\n") {
		if s, ok := strings.CutPrefix(strings.TrimSpace(l), "cluster_state:"); ok {
			v.state = s
		}
	}
	nodes, err := cl.ClusterNodes(ctx).Result()
	if err != nil {
		return v, fmt.Errorf("cluster nodes on %s: %w", addr, err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(l)
		if len(f) < 8 {
			continue
		}
		flags := f[2]
		if strings.Contains(flags, "myself") {
			v.id = f[0]
			if strings.Contains(flags, "master") {
				v.role = "master"
			} else {
				v.role = "slave"
			}
			v.nslots = countSlots(f[8:])
		}
		if strings.Contains(flags, "fail") && !strings.Contains(flags, "fail?") {
			continue // a failed node does not count in the agreement
		}
		role := "slave"
		if strings.Contains(flags, "master") {
			role = "master"
		}
		// Migrating/importing markers ([slot->-id]) are transient.
		var slots []string
		for _, s := range f[8:] {
			if !strings.HasPrefix(s, "[") {
				slots = append(slots, s)
			}
		}
		lines = append(lines, f[0]+" "+role+" "+f[3]+" "+strings.Join(slots, ","))
	}
	sortStrings(lines)
	v.slots = strings.Join(lines, "\n")
	return v, nil
}

func countSlots(fields []string) int {
	n := 0
	for _, s := range fields {
		if strings.HasPrefix(s, "[") {
			continue
		}
		lo, hi, ok := strings.Cut(s, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			continue
		}
		if !ok {
			n++
			continue
		}
		b, err := strconv.Atoi(hi)
		if err == nil {
			n += b - a + 1
		}
	}
	return n
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// waitStable waits until every running node reports cluster_state:ok, the
// running nodes agree on the map, every slot is owned by a running master and
// every running replica has caught up with its master's link.
func (c *Cluster) waitStable(timeout time.Duration) error {
	return waitFor(timeout, 50*time.Millisecond, nil, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var first string
		owned := 0
		for _, n := range c.Nodes {
			if !n.running() {
				continue
			}
			v, err := viewOf(ctx, n.Addr)
			if err != nil {
				return err
			}
			if v.state != "ok" {
				return fmt.Errorf("node %s: cluster_state:%s", n.Addr, v.state)
			}
			if first == "" {
				first = v.slots
			} else if v.slots != first {
				return fmt.Errorf("node %s disagrees on the cluster map", n.Addr)
			}
			if v.role == "master" {
				owned += v.nslots
			} else if err := replicaLinked(ctx, n.Addr); err != nil {
				return err
			}
		}
		if owned != 16384 {
			return fmt.Errorf("running masters own %d of 16384 slots", owned)
		}
		return nil
	})
}

func replicaLinked(ctx context.Context, addr string) error {
	cl := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	defer cl.Close()
	info, err := cl.Info(ctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("info replication on %s: %w", addr, err)
	}
	if !strings.Contains(info, "master_link_status:up") {
		return fmt.Errorf("replica %s: master link not up", addr)
	}
	return nil
}

// WaitStable waits (up to 30 s) until the cluster is ok on every running node.
func (c *Cluster) WaitStable(t testing.TB) {
	t.Helper()
	if err := c.waitStable(30 * time.Second); err != nil {
		t.Fatalf("testenv: redis cluster not stable: %v", err)
	}
}

// Masters returns the running nodes that are masters now.
func (c *Cluster) Masters(t testing.TB) []*RedisServer {
	t.Helper()
	var out []*RedisServer
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		v, err := viewOf(context.Background(), n.Addr)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		if v.role == "master" && v.nslots > 0 {
			out = append(out, n)
		}
	}
	return out
}

// NodeID returns the cluster node id of n.
func (c *Cluster) NodeID(t testing.TB, n *RedisServer) string {
	t.Helper()
	v, err := viewOf(context.Background(), n.Addr)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return v.id
}

// MasterOf returns the running master that serves slot.
func (c *Cluster) MasterOf(t testing.TB, slot int) *RedisServer {
	t.Helper()
	for _, m := range c.Masters(t) {
		cl := redis.NewClient(&redis.Options{Addr: m.Addr})
		shards, err := cl.ClusterSlots(context.Background()).Result()
		_ = cl.Close()
		if err != nil {
			t.Fatalf("testenv: cluster slots on %s: %v", m.Addr, err)
		}
		for _, s := range shards {
			if slot >= int(s.Start) && slot <= int(s.End) && len(s.Nodes) > 0 {
				for _, n := range c.Nodes {
					if n.Addr == s.Nodes[0].Addr {
						return n
					}
				}
			}
		}
		break
	}
	t.Fatalf("testenv: no master serves slot %d", slot)
	return nil
}

// SlotOwners returns, for every slot, the running master that serves it now
// (one CLUSTER SLOTS: cheaper than MasterOf per key).
func (c *Cluster) SlotOwners(t testing.TB) []*RedisServer {
	t.Helper()
	out := make([]*RedisServer, 16384)
	m := c.Masters(t)
	if len(m) == 0 {
		t.Fatal("testenv: no running master")
	}
	cl := redis.NewClient(&redis.Options{Addr: m[0].Addr})
	defer cl.Close()
	shards, err := cl.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatalf("testenv: cluster slots on %s: %v", m[0].Addr, err)
	}
	for _, s := range shards {
		for _, n := range c.Nodes {
			if len(s.Nodes) > 0 && n.Addr == s.Nodes[0].Addr {
				for i := s.Start; i <= s.End; i++ {
					out[i] = n
				}
			}
		}
	}
	return out
}

// SlotsOf returns the slots a master serves, as [start, end] ranges.
func (c *Cluster) SlotsOf(t testing.TB, m *RedisServer) [][2]int {
	t.Helper()
	cl := redis.NewClient(&redis.Options{Addr: m.Addr})
	defer cl.Close()
	shards, err := cl.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatalf("testenv: cluster slots on %s: %v", m.Addr, err)
	}
	var out [][2]int
	for _, s := range shards {
		if len(s.Nodes) > 0 && s.Nodes[0].Addr == m.Addr {
			out = append(out, [2]int{int(s.Start), int(s.End)})
		}
	}
	return out
}

// Kill kills n with SIGKILL (kill -9) and waits for it to exit. Its
// directory (and nodes.conf) stay, so [RedisServer.Start] brings it back as
// the same cluster node, with no data.
func (s *RedisServer) Kill(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil {
		return
	}
	s.proc, s.paused = nil, false
	if err := p.kill(); err != nil {
		t.Fatalf("testenv: killing redis at %s: %v", s.Addr, err)
	}
}

// KillMaster kills master m with SIGKILL and waits until its replica is
// promoted and the cluster is ok again; it returns the promoted replica.
func (c *Cluster) KillMaster(t testing.TB, m *RedisServer) *RedisServer {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	replica := c.ReplicaOf(t, m)
	m.Kill(t)
	if err := waitPromoted(replica); err != nil {
		t.Fatalf("testenv: after killing %s: %v", m.Addr, err)
	}
	if err := c.waitStable(30 * time.Second); err != nil {
		t.Fatalf("testenv: after killing %s: %v", m.Addr, err)
	}
	return replica
}

// ReplicaOf returns a running replica of master m (the test fails if it has none).
func (c *Cluster) ReplicaOf(t testing.TB, m *RedisServer) *RedisServer {
	t.Helper()
	var replica *RedisServer
	for _, n := range c.Nodes {
		if n == m || !n.running() {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: n.Addr})
		info, err := cl.Info(context.Background(), "replication").Result()
		_ = cl.Close()
		if err != nil {
			t.Fatalf("testenv: info replication on %s: %v", n.Addr, err)
		}
		if strings.Contains(info, "master_port:"+strconv.Itoa(m.Port)+"\r") {
			replica = n
		}
	}
	if replica == nil {
		t.Fatalf("testenv: master %s (%s) has no running replica", m.Addr, c.NodeID(t, m))
	}
	return replica
}

// Replicas returns the running nodes that are not masters serving slots now.
func (c *Cluster) Replicas(t testing.TB) []*RedisServer {
	t.Helper()
	masters := c.Masters(t)
	var out []*RedisServer
	for _, n := range c.Nodes {
		if n.running() && !slices.Contains(masters, n) {
			out = append(out, n)
		}
	}
	return out
}

// WaitPromoted waits (up to 30 s) until n is a master serving slots: a
// replica promoted after its master failed or by CLUSTER FAILOVER.
func (c *Cluster) WaitPromoted(t testing.TB, n *RedisServer) {
	t.Helper()
	if err := waitPromoted(n); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

func waitPromoted(n *RedisServer) error {
	return waitFor(30*time.Second, 50*time.Millisecond, nil, func() error {
		v, err := viewOf(context.Background(), n.Addr)
		if err != nil {
			return err
		}
		if v.role != "master" || v.nslots == 0 {
			return errors.New("replica " + n.Addr + " not promoted yet")
		}
		return nil
	})
}

// Failover sends CLUSTER FAILOVER to replica (a graceful failover: its
// master stops taking writes until the replica has caught up, then the two
// swap roles), waits until the replica serves the slots and the cluster is
// ok again.
func (c *Cluster) Failover(t testing.TB, replica *RedisServer) {
	t.Helper()
	cl := redis.NewClient(&redis.Options{Addr: replica.Addr})
	err := cl.ClusterFailover(context.Background()).Err()
	_ = cl.Close()
	if err != nil {
		t.Fatalf("testenv: cluster failover on %s: %v", replica.Addr, err)
	}
	c.WaitPromoted(t, replica)
	c.WaitStable(t)
}

// Restart starts a killed or stopped node again (same port, same nodes.conf,
// no data) and waits until the cluster is ok; a former master comes back as a
// replica of the node that replaced it.
func (c *Cluster) Restart(t testing.TB, n *RedisServer) {
	t.Helper()
	n.Start(t)
	c.WaitStable(t)
}

// Reshard moves count slots from master from to master to with
// `redis-cli --cluster reshard`, keys included (MIGRATE), while clients keep
// running: they see MOVED and ASK redirections.
func (c *Cluster) Reshard(t testing.TB, from, to *RedisServer, count int) {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("testenv: redis-cli not found: %v", err)
	}
	out, err := runCLI(cli, 120*time.Second, "--cluster", "reshard", to.Addr,
		"--cluster-from", c.NodeID(t, from), "--cluster-to", c.NodeID(t, to),
		"--cluster-slots", strconv.Itoa(count), "--cluster-yes", "--cluster-pipeline", "100")
	if err != nil {
		t.Fatalf("testenv: redis-cli --cluster reshard: %v\n%s", err, lastLines(out, 20))
	}
	c.WaitStable(t)
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// Sentinel is a Sentinel deployment of a test's own: one master, one replica
// and three sentinels monitoring the master as [SentinelMaster], each a private
// redis-server (the sentinels run `redis-server --sentinel`, so no
// redis-sentinel package is needed).
type Sentinel struct {
	// Master and Replica are the servers as started; roles swap on failover
	// (see [Sentinel.CurrentMaster]).
	Master, Replica *RedisServer
	// Sentinels are the three sentinel processes.
	Sentinels []*RedisServer
}

// SentinelMaster is the name the sentinels monitor the master under.
const SentinelMaster = "hearth"

// SentinelDownAfter is how long the sentinels wait before they deem the
// master down and fail over.
const SentinelDownAfter = time.Second

// RedisSentinel starts 1 master, 1 replica and 3 sentinels (quorum 2) on
// free loopback ports and waits until every sentinel knows the replica and
// the other sentinels. Everything is stopped at cleanup.
func RedisSentinel(t testing.TB) *Sentinel {
	t.Helper()
	s, err := newSentinel()
	t.Cleanup(func() {
		for _, n := range s.all() {
			if err := n.stop(); err != nil {
				t.Errorf("testenv: stopping %s: %v", n.Addr, err)
			}
		}
	})
	if err != nil {
		RequireServer(t, "cannot start redis sentinels: %v", err)
		return nil
	}
	return s
}

func (s *Sentinel) all() []*RedisServer {
	out := []*RedisServer{}
	for _, n := range append([]*RedisServer{s.Master, s.Replica}, s.Sentinels...) {
		if n != nil {
			out = append(out, n)
		}
	}
	return out
}

func newSentinel() (*Sentinel, error) {
	s := &Sentinel{}
	var err error
	if s.Master, err = newRedisServer(); err != nil {
		return s, err
	}
	if s.Replica, err = newRedisServer("--replicaof", "127.0.0.1", strconv.Itoa(s.Master.Port)); err != nil {
		return s, err
	}
	for range 3 {
		n, err := newSentinelServer(s.Master.Port)
		if err != nil {
			return s, err
		}
		s.Sentinels = append(s.Sentinels, n)
	}
	err = waitFor(30*time.Second, 50*time.Millisecond, nil, func() error {
		if err := replicaLinked(context.Background(), s.Replica.Addr); err != nil {
			return err
		}
		for _, n := range s.Sentinels {
			sc := redis.NewSentinelClient(&redis.Options{Addr: n.Addr})
			m, err := sc.Master(context.Background(), SentinelMaster).Result()
			_ = sc.Close()
			if err != nil {
				return fmt.Errorf("sentinel %s: %w", n.Addr, err)
			}
			if m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" {
				return fmt.Errorf("sentinel %s knows %s replicas and %s other sentinels", n.Addr, m["num-slaves"], m["num-other-sentinels"])
			}
		}
		return nil
	})
	return s, err
}

// newSentinelServer starts `redis-server <conf> --sentinel` monitoring the
// master on port. The config file is the sentinel's own: it rewrites it.
func newSentinelServer(masterPort int) (*RedisServer, error) {
	dir, err := os.MkdirTemp("", "hearth-sentinel-")
	if err != nil {
		return nil, fmt.Errorf("make sentinel dir: %w", err)
	}
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 2\n"+
		"sentinel down-after-milliseconds %[1]s %[3]d\n"+
		"sentinel failover-timeout %[1]s 10000\n"+
		"sentinel parallel-syncs %[1]s 1\n", SentinelMaster, masterPort, SentinelDownAfter.Milliseconds())
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		return nil, fmt.Errorf("write sentinel config: %w", err)
	}
	s := &RedisServer{dir: dir, conf: conf, args: []string{"--sentinel"}}
	if s.bin, err = exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server not found: %w", err)
	}
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		err = s.startLocked(port)
		s.mu.Unlock()
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

// SentinelAddrs returns the sentinels' addresses.
func (s *Sentinel) SentinelAddrs() []string {
	out := make([]string, len(s.Sentinels))
	for i, n := range s.Sentinels {
		out[i] = n.Addr
	}
	return out
}

// CurrentMaster returns the server the sentinels name as master now.
func (s *Sentinel) CurrentMaster(t testing.TB) *RedisServer {
	t.Helper()
	addr, err := s.masterAddr()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	for _, n := range []*RedisServer{s.Master, s.Replica} {
		if n.Addr == addr {
			return n
		}
	}
	t.Fatalf("testenv: sentinels name an unknown master %s", addr)
	return nil
}

func (s *Sentinel) masterAddr() (string, error) {
	var errs []error
	for _, n := range s.Sentinels {
		if !n.running() {
			continue
		}
		sc := redis.NewSentinelClient(&redis.Options{Addr: n.Addr})
		a, err := sc.GetMasterAddrByName(context.Background(), SentinelMaster).Result()
		_ = sc.Close()
		if err == nil && len(a) == 2 {
			return a[0] + ":" + a[1], nil
		}
		errs = append(errs, err)
	}
	return "", fmt.Errorf("no sentinel names the master: %w", errors.Join(errs...))
}

// Failover runs SENTINEL FAILOVER and waits until every sentinel names the
// other server as master and it reports role:master; it returns the new master.
func (s *Sentinel) Failover(t testing.TB) *RedisServer {
	t.Helper()
	old := s.CurrentMaster(t)
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinels[0].Addr})
	defer sc.Close()
	if err := sc.Failover(context.Background(), SentinelMaster).Err(); err != nil {
		t.Fatalf("testenv: sentinel failover: %v", err)
	}
	return s.waitNewMaster(t, old)
}

// KillMaster kills the current master with SIGKILL and waits until the
// sentinels promote the replica; it returns the new master. The killed
// server stays down (restart it with [RedisServer.Start]; the sentinels then
// make it a replica).
func (s *Sentinel) KillMaster(t testing.TB) *RedisServer {
	t.Helper()
	old := s.CurrentMaster(t)
	old.Kill(t)
	return s.waitNewMaster(t, old)
}

func (s *Sentinel) waitNewMaster(t testing.TB, old *RedisServer) *RedisServer {
	t.Helper()
	var nm *RedisServer
	err := waitFor(60*time.Second, 50*time.Millisecond, nil, func() error {
		for _, n := range s.Sentinels {
			sc := redis.NewSentinelClient(&redis.Options{Addr: n.Addr})
			a, err := sc.GetMasterAddrByName(context.Background(), SentinelMaster).Result()
			_ = sc.Close()
			if err != nil {
				return err
			}
			if a[0]+":"+a[1] == old.Addr {
				return fmt.Errorf("sentinel %s still names %s", n.Addr, old.Addr)
			}
		}
		nm = s.CurrentMaster(t)
		cl := redis.NewClient(&redis.Options{Addr: nm.Addr})
		defer cl.Close()
		info, err := cl.Info(context.Background(), "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "role:master") {
			return fmt.Errorf("%s is not master yet", nm.Addr)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("testenv: waiting for a sentinel failover away from %s: %v", old.Addr, err)
	}
	return nm
}
