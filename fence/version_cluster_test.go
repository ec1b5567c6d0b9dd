package fence_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/store"
)

// startCluster starts a three-master Redis Cluster of the test's own
// (redis-server with cluster mode, slots assigned by redis-cli --cluster
// create) and returns its addresses. Every process is stopped at cleanup.
func startCluster(t *testing.T) []string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.RequireServer(t, "redis-server not found: %v", err)
		return nil
	}
	var addrs []string
	for i := range 3 {
		port := testenv.FreeClusterPort(t)
		dir := t.TempDir()
		cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--dir", dir)
		if err := cmd.Start(); err != nil {
			t.Fatalf("start cluster node %d: %v", i, err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(port))
	}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		testenv.Eventually(t, 10*time.Second, "cluster node "+a+" up", func() bool { return c.Ping(context.Background()).Err() == nil })
		_ = c.Close()
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c := redis.NewClient(&redis.Options{Addr: addrs[0]})
	defer c.Close()
	testenv.Eventually(t, 20*time.Second, "cluster_state:ok", func() bool {
		s, _ := c.ClusterInfo(context.Background()).Result()
		return strings.Contains(s, "cluster_state:ok")
	})
	return addrs
}

// TestVersionedWritesOnCluster: on a real three-master cluster, version
// records live in their value's slot (one script touches value, fence and
// record without CROSSSLOT), and the version check holds on every master.
func TestVersionedWritesOnCluster(t *testing.T) {
	addrs := startCluster(t)
	ctx := context.Background()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer cc.Close()
	testenv.Eventually(t, 20*time.Second, "the cluster client sees every slot", func() bool {
		return cc.Set(ctx, "probe{a}", "1", time.Second).Err() == nil && cc.Set(ctx, "probe{b}", "1", time.Second).Err() == nil
	})
	reg := prometheus.NewRegistry()
	fs := fence.NewFencedStore(fence.FencedStoreOptions{Client: cc, Namespace: "hearth", Registerer: reg})
	lease, err := leader.NewLease(leader.LeaseOptions{Client: cc, Namespace: "hearth", Duration: 10 * time.Second, Fence: fs, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Close(context.Background()) }()
	term, err := lease.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := fs.Writer(term)
	const n = 300
	batch := func(seq, version int64, value string) []store.Entry {
		es := make([]store.Entry, n)
		for i := range es {
			es[i] = store.Entry{Key: "product:" + strconv.Itoa(i), Value: []byte(value), TTL: time.Minute,
				Seq: seq, Versioned: true, Version: version, VersionTTL: 2 * time.Minute, Family: "product"}
		}
		return es
	}
	if err := w.Set(ctx, batch(1, 5, "v5")); err != nil {
		t.Fatalf("versioned write on a cluster: %v", err)
	}
	if err := w.Set(ctx, batch(2, 4, "v4")); err != nil {
		t.Fatal(err)
	}
	masters := map[string]bool{}
	for i := range n {
		k := "product:" + strconv.Itoa(i)
		if got := cc.Get(ctx, k).Val(); got != "v5" {
			t.Fatalf("%s = %q, want v5 (version 4 refused)", k, got)
		}
		if got, want := slot.Of(store.VersionKey("hearth", k)), slot.Of(k); got != want {
			t.Fatalf("record of %s in slot %d, value in %d", k, got, want)
		}
		m, err := cc.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr] = true
	}
	if len(masters) != 3 {
		t.Errorf("keys landed on %d masters, want all 3", len(masters))
	}
	if got := counter(t, reg, "hearth_version_refused_writes_total", "family=product"); got != n {
		t.Errorf("refused = %v, want %d", got, n)
	}
}
