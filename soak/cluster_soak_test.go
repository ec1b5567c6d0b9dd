package soak_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/soak"
)

// The Cluster variant's harness: the observer's reads through a cluster
// client, the names of the per-slot keys it reads, and the cluster track's
// faults.

// clusterGet reads keys with one pipelined GET each (a cluster client splits
// the pipeline per master); a key absent is nil.
func clusterGet(ctx context.Context, c *redis.ClusterClient, keys []string) ([]any, error) {
	pipe := c.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Get(ctx, k)
	}
	_, _ = pipe.Exec(ctx)
	out := make([]any, len(keys))
	for i, cmd := range cmds {
		v, err := cmd.Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return nil, err
		default:
			out[i] = v
		}
	}
	return out, nil
}

// clusterNames spells each key's version record (row family) and fence as
// Hearth's docs name them on a Cluster — <ns>:ver:{tag}:<key> and
// <ns>:fence:{tag}, the tag in the key's slot (soak.SlotTag) — after checking
// the checker's slot of every key against CLUSTER KEYSLOT, and waits until
// every one exists: the names are Hearth's, not guessed.
func clusterNames(t *testing.T, c *redis.ClusterClient, keys []string) (records, fences []string) {
	t.Helper()
	ctx := t.Context()
	records, fences = make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		n, err := c.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", k, err)
		}
		if int(n) != soak.Slot(k) {
			t.Fatalf("CLUSTER KEYSLOT %s = %d, the checker's slot %d", k, n, soak.Slot(k))
		}
		tag := soak.SlotTag(soak.Slot(k))
		fences[i] = "hearth:fence:{" + tag + "}"
		if strings.HasPrefix(k, "soak:row:") {
			records[i] = "hearth:ver:{" + tag + "}:" + k
		}
	}
	var names []string
	for i := range keys {
		names = append(names, fences[i])
		if records[i] != "" {
			names = append(names, records[i])
		}
	}
	testenv.Eventually(t, 30*time.Second, "every key's fence and every row key's version record", func() bool {
		vals, err := clusterGet(ctx, c, names)
		if err != nil {
			return false
		}
		for _, v := range vals {
			if v == nil {
				return false
			}
		}
		return true
	})
	return records, fences
}

// observeCluster reads every key every 100 ms: per key one MGET of the key,
// its version record (row family) and its fence — one slot, so one instant
// of its master — and a GET of the lease, all in one pipeline that the
// cluster client splits per master. A key whose MGET fails (its master down,
// paused, failing over) is unread in that read; after any failure the client
// reloads its slot map (go-redis would otherwise keep a dead master's slots
// until its periodic reload).
func (r *recorder) observeCluster(ctx context.Context, c *redis.ClusterClient) {
	names := make([][]string, len(r.keys))
	for i, k := range r.keys {
		names[i] = []string{k}
		if r.records[i] != "" {
			names[i] = append(names[i], r.records[i])
		}
		names[i] = append(names[i], r.fences[i])
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sent := time.Now()
		pipe := c.Pipeline()
		cmds := make([]*redis.SliceCmd, len(r.keys))
		for i := range r.keys {
			cmds[i] = pipe.MGet(ctx, names[i]...)
		}
		lease := pipe.Get(ctx, leaseKey)
		_, _ = pipe.Exec(ctx)
		recv := time.Now()
		if ctx.Err() != nil {
			return
		}
		n := len(r.keys)
		rd := soak.Read{Sent: sent, Recv: recv, Versions: make([]int64, n), Records: make([]string, n),
			Fences: make([]int64, n), Unread: make([]bool, n)}
		failed := false
		for i, cmd := range cmds {
			vals, err := cmd.Result()
			if err != nil || len(vals) != len(names[i]) {
				rd.Unread[i], failed = true, true
				continue
			}
			rd.Fences[i] = epochOf(vals[len(vals)-1])
			if r.records[i] != "" {
				rd.Records[i], _ = vals[1].(string)
			}
			rd.Versions[i] = versionOf(vals[0])
			if rd.Versions[i] == -2 {
				if rd.Raw == nil {
					rd.Raw = make([]string, n)
				}
				rd.Raw[i] = fmt.Sprint(vals[0])
			}
		}
		switch v, err := lease.Result(); {
		case errors.Is(err, redis.Nil):
		case err != nil:
			rd.Lease, failed = -1, true
		default:
			rd.Lease = epochOf(v)
		}
		if failed {
			c.ReloadState(ctx)
		}
		r.mu.Lock()
		r.reads = append(r.reads, rd)
		r.mu.Unlock()
	}
}

// versionOf is a value's version: -1 absent, -2 not v<n>.
func versionOf(v any) int64 {
	if v == nil {
		return -1
	}
	s, ok := v.(string)
	n, err := strconv.ParseInt(strings.TrimPrefix(s, "v"), 10, 64)
	if !ok || !strings.HasPrefix(s, "v") || err != nil || n < 1 {
		return -2
	}
	return n
}

// clusterTrack runs the cluster track's faults one after another, each at its
// planned time or when the one before it is done, and returns them as
// executed. It runs beside the executor's loop (a failover blocks for
// seconds): it is the only one to touch the cluster's nodes.
//
//   - kill -9 of a master (one of the three at random): the kill, its
//     replica's promotion (Promoted), For more seconds down, then the node
//     restarted, rejoining as a replica of the one that replaced it (End).
//   - CLUSTER FAILOVER on a replica at random: graceful; End is when the
//     cluster is ok again.
//   - a reshard of 2,000 slots from the master serving the most slots to the
//     one serving the fewest (redis-cli --cluster reshard: MIGRATE, SETSLOT).
//   - SIGSTOP of a master at random for For (shorter than cluster-node-timeout),
//     then SIGCONT.
func clusterTrack(ctx context.Context, t *testing.T, cl *testenv.Cluster, plan []soak.Fault, begin, end time.Time, seed uint64) []soak.Event {
	rng := rand.New(rand.NewPCG(seed, 3))
	var out []soak.Event
	sleep := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	for _, f := range plan {
		if !sleep(time.Until(begin.Add(f.At))) {
			break
		}
		if time.Now().Add(f.For + soak.Overhead(f.Kind)).After(end) {
			t.Logf("soak: cluster track late, %s planned at %s not run", f.Kind, f.At)
			break
		}
		ev := soak.Event{Kind: f.Kind}
		switch f.Kind {
		case soak.MasterKill:
			ms := cl.Masters(t)
			m := ms[rng.IntN(len(ms))]
			replica := cl.ReplicaOf(t, m)
			ev.Target, ev.Slots = m.Addr, cl.SlotsOf(t, m)
			ev.Start = time.Now()
			m.Kill(t)
			cl.WaitPromoted(t, replica)
			ev.Promoted = time.Now()
			ev.Note = fmt.Sprintf("%s promoted after %s, down %s more", replica.Addr, ev.Promoted.Sub(ev.Start).Round(time.Millisecond), f.For)
			sleep(f.For)
			cl.Restart(t, m)
		case soak.Failover:
			rs := cl.Replicas(t)
			replica := rs[rng.IntN(len(rs))]
			ev.Target, ev.Start = replica.Addr, time.Now()
			cl.Failover(t, replica)
			ev.Promoted = time.Now()
			ev.Slots = cl.SlotsOf(t, replica)
			ev.Note = fmt.Sprintf("replica promoted after %s", ev.Promoted.Sub(ev.Start).Round(time.Millisecond))
		case soak.Reshard:
			ms := cl.Masters(t)
			n := make(map[*testenv.RedisServer]int, len(ms))
			for _, m := range ms {
				for _, r := range cl.SlotsOf(t, m) {
					n[m] += r[1] - r[0] + 1
				}
			}
			slices.SortStableFunc(ms, func(a, b *testenv.RedisServer) int { return n[b] - n[a] })
			from, to := ms[0], ms[len(ms)-1]
			ev.Target, ev.Start = from.Addr+" → "+to.Addr, time.Now()
			cl.Reshard(t, from, to, 2000)
			ev.Note = fmt.Sprintf("%d and %d slots before", n[from], n[to])
		case soak.MasterPause:
			ms := cl.Masters(t)
			m := ms[rng.IntN(len(ms))]
			ev.Target, ev.Slots = m.Addr, cl.SlotsOf(t, m)
			ev.Start = time.Now()
			m.Pause(t)
			sleep(f.For)
			m.Resume(t)
			ev.Note = f.For.Round(time.Millisecond).String()
		}
		ev.End = time.Now()
		out = append(out, ev)
	}
	return out
}
