package rewarm_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/daemon"
	"github.com/hearth-dev/hearth/internal/slot"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/rewarm"
)

// TestFailedCheckNotPaced: a check of a Redis that refuses connections, with
// the client the daemon builds, does not count for MinCheckGap (so the check
// the push watch asks for once Redis is back runs at once); a check that
// reached Redis does, whatever it found.
func TestFailedCheckNotPaced(t *testing.T) {
	srv := testenv.PrivateRedis(t)
	rdb := daemon.NewRedis(config.Redis{Addrs: []string{srv.Addr}, DialTimeout: 2 * time.Second,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	e := newEnv(t, srv.Client(t), "rw:")
	rw, err := rewarm.New(rewarm.Options{Client: rdb, Namespace: rewarmNS, Warmer: e.w, NoPush: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err = rw.CheckOnce(ctx)
	if !rewarm.ReachedRedis(err) {
		t.Errorf("a check that reached Redis (%v) does not count for the gap", err)
	}
	srv.Stop(t)
	for range 3 { // the first after the refusals' redial window, then known down
		_, err = rw.CheckOnce(ctx)
		if err == nil || rewarm.ReachedRedis(err) {
			t.Errorf("a check of a stopped Redis (%v) counts for the gap", err)
		}
	}
	srv.Start(t)
	_, err = rw.CheckOnce(ctx)
	if !rewarm.ReachedRedis(err) {
		t.Errorf("a check of the restarted Redis (%v) does not count for the gap", err)
	}
}

// TestClusterCheckPaced: on a Cluster, a check that one master failed — a
// redirection while a slot moves, or a master killed and not yet replaced —
// reached the others and counts for MinCheckGap, so that the push watch's
// requests cannot run checks back to back against the live masters; a
// redirection is a topology error (no loss, a longer gap), a refused master
// is not.
func TestClusterCheckPaced(t *testing.T) {
	cl := testenv.RedisCluster(t)
	ctx := context.Background()
	owners := cl.SlotOwners(t)
	a := owners[0]
	other := -1
	for s, m := range owners {
		if m != a {
			other = s
			break
		}
	}
	if other < 0 {
		t.Fatal("every slot on one master")
	}
	// A master asked for a key of another master's slot answers MOVED, as
	// the marker's master does once its slot has moved.
	err := a.Client(t).Get(ctx, "k:{"+slot.Tag(other)+"}").Err()
	err = fmt.Errorf("rewarm: check and set k: %w", err)
	if !rewarm.TopologyError(err) || !rewarm.Redirected(err) || !rewarm.ReachedRedis(err) {
		t.Errorf("%v: topology %v, redirected %v, reached Redis %v; want all true", err,
			rewarm.TopologyError(err), rewarm.Redirected(err), rewarm.ReachedRedis(err))
	}

	rdb := daemon.NewRedis(config.Redis{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	rw, err := rewarm.New(rewarm.Options{Client: rdb, Namespace: "rwp", Warmer: &recordingRefresher{}, NoPush: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.CheckOnce(ctx); err != nil {
		t.Fatal(err)
	}
	owners[other].Kill(t)
	_, err = rw.CheckOnce(ctx)
	if err == nil {
		t.Fatalf("a check with master %s killed succeeded", owners[other].Addr)
	}
	if !rewarm.ReachedRedis(err) || rewarm.TopologyError(err) {
		t.Errorf("a check with one master killed (%v): reached Redis %v, topology %v; want true, false",
			err, rewarm.ReachedRedis(err), rewarm.TopologyError(err))
	}
}
