package accesslog_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// clusterRedis starts a one-node Redis Cluster owning every slot: it refuses a
// command or script whose keys are in different slots (CROSSSLOT) as a larger
// cluster does, which is what the roll-up's RENAME and claim script must pass.
func clusterRedis(t *testing.T) *redis.ClusterClient {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.RequireServer(t, "redis-server not found: %v", err)
		return nil
	}
	dir := t.TempDir()
	// Its cluster bus listens 10000 above: both must be free (a kernel-chosen
	// port can put the bus past 65535).
	port := testenv.FreeClusterPort(t)
	log, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		testenv.RequireServer(t, "start redis-server: %v", err)
		return nil
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	node := redis.NewClient(&redis.Options{Addr: addr})
	defer node.Close()
	ctx := context.Background()
	testenv.Eventually(t, 10*time.Second, "redis cluster node answers", func() bool { return node.Ping(ctx).Err() == nil })
	if err := node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, slot.Count-1).Err(); err != nil {
		t.Fatalf("cluster addslotsrange: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, "redis cluster state ok", func() bool {
		info, _ := node.ClusterInfo(ctx).Result()
		return strings.Contains(info, "cluster_state:ok")
	})
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestRollupCluster: on a Redis Cluster the bucket, its private name and its
// token share a slot, so the rename and the claim script run (a private name
// in another slot is refused with CROSSSLOT), and a stopped roll-up resumes.
func TestRollupCluster(t *testing.T) {
	pg := testenv.Postgres(t)
	migrate(t, pg.Pool)
	c := clusterRedis(t)
	ctx := ctxT(t)
	const ns = "hearth"
	now := time.Now().Truncate(time.Minute).Add(30 * time.Second)
	start := accesslog.BucketStart(now.Add(-2*time.Minute), time.Minute)
	key := accesslog.BucketKey(ns, start)

	bucketSlot := slot.Of(key)
	for _, k := range []string{accesslog.RollingKey(ns, key), accesslog.TokenKey(ns, key)} {
		if got := slot.Of(k); got != bucketSlot {
			t.Errorf("slot of %s = %d, want %d (the bucket's)", k, got, bucketSlot)
		}
	}
	// The cluster does refuse a rename across slots: the check above matters.
	if err := c.ZIncrBy(ctx, key, 1, "probe").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Rename(ctx, key, ns+":rollup:"+key).Err(); err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
		t.Fatalf("rename across slots = %v, want CROSSSLOT", err)
	}
	if err := c.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}

	r, err := accesslog.NewRoller(accesslog.RollerOptions{
		Log: accesslog.New(pg.Pool), Client: c, Namespace: ns, Bucket: time.Minute,
		Lookback: time.Hour, Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	for m, n := range map[string]float64{"product:1": 4, "product:2": 2} {
		if err := c.ZIncrBy(ctx, key, n, m).Err(); err != nil {
			t.Fatal(err)
		}
	}
	crash := errors.New("crash")
	accesslog.SetHook(r, func(stage string) error {
		if stage == "commit" {
			return crash
		}
		return nil
	})
	if _, err := r.RollupOnce(ctx); !errors.Is(err, crash) {
		t.Fatalf("RollupOnce = %v, want the crash", err)
	}
	if err := c.ZIncrBy(ctx, key, 1, "product:1").Err(); err != nil {
		t.Fatal(err)
	}
	accesslog.SetHook(r, nil)
	res, err := r.RollupOnce(ctx)
	if err != nil {
		t.Fatalf("RollupOnce on a cluster: %v", err)
	}
	if got, want := [2]int{res.Resumed, res.Buckets}, [2]int{1, 1}; got != want {
		t.Errorf("resumed, buckets = %v, want %v", got, want)
	}
	want := map[string]int64{fmt.Sprintf("%d/product:1", start.Unix()): 5, fmt.Sprintf("%d/product:2", start.Unix()): 2}
	if got := hits(t, pg.Pool); !mapsEqual(got, want) {
		t.Errorf("table = %v, want %v", got, want)
	}
	if n := c.Exists(ctx, key).Val() + c.Exists(ctx, accesslog.RollingKey(ns, key)).Val() + c.Exists(ctx, accesslog.TokenKey(ns, key)).Val(); n != 0 {
		t.Errorf("%d keys of bucket %s left in the cluster", n, key)
	}
}
