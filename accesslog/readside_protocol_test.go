package accesslog_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/readside"
)

// The read side (package readside) must not import the daemon, so it mirrors
// the daemon's protocol constants. These tests fail the moment the two drift.

// TestReadsideBucketNames: the read side names and dates access buckets as
// the roll-up reads them.
func TestReadsideBucketNames(t *testing.T) {
	for _, at := range []int64{0, 59, 60, 1_700_000_039, 1_700_000_040, -1, -61} {
		for _, w := range []time.Duration{time.Second, time.Minute, 5 * time.Minute, time.Hour} {
			tm := time.Unix(at, 0)
			if got, want := readside.AccessKey("hearth", tm, w), accesslog.BucketKey("hearth", accesslog.BucketStart(tm, w)); got != want {
				t.Errorf("at %d width %s: read side %q, daemon %q", at, w, got, want)
			}
		}
	}
}

// TestReadsideDefaultsMatchDaemon: namespace, bucket width and sentinel
// default alike on both sides, and the read side's per-key hash tags are the
// daemon's per-slot fence tags.
func TestReadsideDefaultsMatchDaemon(t *testing.T) {
	def := config.Default()
	if got, want := readside.DefaultNamespace, def.Redis.Namespace; got != want {
		t.Errorf("namespace: read side %q, daemon %q", got, want)
	}
	if got, want := readside.DefaultAccessBucket, def.AccessLog.Bucket; got != want {
		t.Errorf("bucket: read side %s, daemon %s", got, want)
	}
	t.Setenv("HEARTH_TEST_TOKEN", "x")
	cfg, err := config.Load("../config/testdata/valid-full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The first key of valid-full.yaml sets no negative_value.
	if got, want := readside.DefaultNegativeValue, string(cfg.Specs()[0].NegativeValue); got != want {
		t.Errorf("sentinel: read side %q, daemon %q", got, want)
	}
	for n := range slot.Count {
		if got, want := readside.SlotTag(n), slot.Tag(n); got != want {
			t.Fatalf("slot %d tag: read side %q, daemon %q", n, got, want)
		}
	}
	for _, k := range []string{"product:7", "{user:1}:cart", "a{}b", "x}y{z}", ""} {
		if got, want := readside.HashSlot(k), slot.Of(k); got != want {
			t.Errorf("slot of %q: read side %d, daemon %d", k, got, want)
		}
	}
}

// TestReadsideReadsRollUp: reads recorded by the read side are rolled up into
// the access log by the daemon's roller, counts intact.
func TestReadsideReadsRollUp(t *testing.T) {
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	migrate(t, pg.Pool)
	ns := rd.Prefix + "ns"
	e := newRollupEnv(t, pg.Pool, rd.Client, ns)
	readAt := e.now.Add(-2 * time.Minute) // a closed bucket by the roller's clock
	c, err := readside.New(readside.Options{Client: rd.Client, Namespace: ns, AccessSample: 1,
		AccessFlush: time.Hour, Now: func() time.Time { return readAt }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	load := func(context.Context) ([]byte, error) { return []byte("v"), nil }
	for i, key := range []string{"product:1", "product:1", "product:1", "product:2"} {
		if _, err := c.GetOrLoad(ctx, rd.Prefix+key, load); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.roller.RollupOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got := hits(t, pg.Pool)
	_, start := e.bucket(2 * time.Minute)
	for key, want := range map[string]int64{"product:1": 3, "product:2": 1} {
		if n := got[fmt.Sprintf("%d/%s", start, rd.Prefix+key)]; n != want {
			t.Errorf("%s rolled up as %d reads, want %d (table: %v)", key, n, want, got)
		}
	}
}
