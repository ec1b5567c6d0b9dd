package accesslog_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// TestRollupAcrossMasters: on a 3-master Cluster the buckets of successive
// minutes live on different masters (each bucket key hashes alone); one
// roll-up finds every closed bucket by name, on whichever master holds it,
// moves every hit to PostgreSQL and leaves no bucket behind on any master.
func TestRollupAcrossMasters(t *testing.T) {
	pg := testenv.Postgres(t)
	migrate(t, pg.Pool)
	cl := testenv.RedisCluster(t)
	c := cl.Client(t)
	ctx := ctxT(t)
	const ns = "hearth"
	now := time.Now().Truncate(time.Minute).Add(30 * time.Second)
	owners := cl.SlotOwners(t)
	masters := map[string]bool{}
	want := map[string]int64{}
	var keys []string
	for i := 2; i <= 13; i++ {
		start := accesslog.BucketStart(now.Add(-time.Duration(i)*time.Minute), time.Minute)
		key := accesslog.BucketKey(ns, start)
		keys = append(keys, key)
		masters[owners[slot.Of(key)].Addr] = true
		for m, n := range map[string]int64{"product:1": int64(i), "product:2": 1} {
			if err := c.ZIncrBy(ctx, key, float64(n), m).Err(); err != nil {
				t.Fatal(err)
			}
			want[fmt.Sprintf("%d/%s", start.Unix(), m)] = n
		}
	}
	if len(masters) < 2 {
		t.Fatalf("12 buckets on %d master(s): the test needs them spread", len(masters))
	}
	r, err := accesslog.NewRoller(accesslog.RollerOptions{
		Log: accesslog.New(pg.Pool), Client: c, Namespace: ns, Bucket: time.Minute,
		Lookback: time.Hour, Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.RollupOnce(ctx)
	if err != nil {
		t.Fatalf("RollupOnce across masters: %v", err)
	}
	if got, want := res.Buckets, len(keys); got != want {
		t.Errorf("buckets rolled up = %d, want %d (on %d masters)", got, want, len(masters))
	}
	if got := hits(t, pg.Pool); !mapsEqual(got, want) {
		t.Errorf("table = %v, want %v", got, want)
	}
	for _, k := range keys {
		if n := c.Exists(ctx, k, accesslog.RollingKey(ns, k), accesslog.TokenKey(ns, k)).Val(); n != 0 {
			t.Errorf("%d keys of bucket %s left on the cluster", n, k)
		}
	}
}
