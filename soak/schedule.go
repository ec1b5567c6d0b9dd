package soak

import (
	"math/rand/v2"
	"sort"
	"time"
)

// Fault is one planned fault: At from the start of the soak, lasting For (for
// kill -9 and SIGTERM, the time until the restart).
type Fault struct {
	Kind    Kind
	At, For time.Duration
	// Standby: an instance fault aimed at a standby instead of the leader.
	Standby bool
	// Latency added by an OriginSlow or LinkSlow fault (each way), or to the
	// replies by a LinkRenew fault.
	Latency time.Duration
	// Rate is a LinkNarrow fault's bandwidth, KB/s each way.
	Rate int64
}

// Schedule plans the faults of a soak of length total from seed: the same
// seed and parameters always give the same plan. Each track (instance faults,
// server faults, link faults) deals its kinds from a shuffled deck, so every
// kind comes up once before any comes up twice; the tracks run side by side,
// so faults of different tracks overlap (a leader paused while PostgreSQL is
// down, a standby cut off while the leader is killed). The first warmup and
// the last cooldown are free of faults. The plan is in order of start.
//
// On a Cluster (p.Cluster) the tracks are instance faults, the origin's
// faults and cluster faults (see Params.Tracks); a cluster fault is planned
// with its Overhead, and the cluster track runs its faults one after another,
// each at its time or when the one before it is done.
//
// The deck arithmetic: a fault and the pause after it take at most 23 s on
// the server track (PostgreSQL down 15 s + 8 s), 17 s on the instance track
// and 18 s on the link track, so 10 minutes deal at least 25, 34 and 32
// faults: every kind of the 6, 5 and 5 at least 4, 6 and 6 times in the
// worst case; on average (10, 9 and 11 s a fault) about 9, 12 and 11 times,
// and over 500 seeds never fewer than 9 (TestScheduleDealsEveryKindFiveTimes).
// On a Cluster, at most 23 s on the origin track and 28 s (a reshard: 20 s +
// 8 s) on the cluster track, 73 s for a deck of its four kinds: at least 10
// and 7 times each in the worst case (TestClusterScheduleDealsEveryKindFiveTimes).
func Schedule(seed uint64, total time.Duration, p Params) []Fault {
	const warmup, cooldown = 5 * time.Second, 15 * time.Second
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	between := func(a, b time.Duration) time.Duration { return a + time.Duration(rng.Int64N(int64(b-a)+1)) }
	var out []Fault
	// The link track comes last, so that a seed deals the other two as it
	// did before the link track existed.
	for _, kinds := range p.Tracks() {
		var deck []Kind
		at := warmup + between(0, 3*time.Second)
		for {
			if len(deck) == 0 {
				deck = append(deck, kinds...)
				rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
			}
			f := Fault{Kind: deck[0], At: at}
			switch f.Kind {
			case Kill, Term:
				f.For = between(time.Second, 5*time.Second)
				f.Standby = rng.IntN(4) == 0
			case PauseShort:
				f.For = between(p.Lease/4, p.Lease*3/4)
				f.Standby = rng.IntN(4) == 0
			case PauseLong:
				f.For = between(2*p.Lease, 6*p.Lease)
				f.Standby = rng.IntN(4) == 0
			case Reload:
			case RedisDown:
				f.For = between(500*time.Millisecond, 3*time.Second)
			case RedisFlush:
			case RedisPause:
				f.For = between(500*time.Millisecond, 6*time.Second)
			case PGDown:
				f.For = between(3*time.Second, 15*time.Second)
			case OriginSlow:
				f.For = between(3*time.Second, 10*time.Second)
				// Below the attempt timeout (slow loads), or far above it
				// (loads time out, values are kept stale).
				f.Latency = []time.Duration{150 * time.Millisecond, 1500 * time.Millisecond}[rng.IntN(2)]
			case OriginReset:
				f.For = between(2*time.Second, 8*time.Second)
			case LinkSlow:
				f.For = between(3*time.Second, 10*time.Second)
				f.Latency = between(10*time.Millisecond, 500*time.Millisecond)
				f.Standby = rng.IntN(4) == 0
			case LinkNarrow:
				f.For = between(3*time.Second, 10*time.Second)
				f.Rate = []int64{16, 64}[rng.IntN(2)]
				f.Standby = rng.IntN(4) == 0
			case LinkReset:
				f.For = between(time.Second, 5*time.Second)
				f.Standby = rng.IntN(4) == 0
			case LinkCut:
				// Longer than a lease: a cut leader's term ends, a standby's takes over.
				f.For = between(2*time.Second, 8*time.Second)
				f.Standby = rng.IntN(4) == 0
			case MasterKill:
				// Down this long after its replica was promoted, then restarted.
				f.For = between(time.Second, 5*time.Second)
			case Failover, Reshard:
			case MasterPause:
				// Shorter than cluster-node-timeout (1 s): no failover.
				f.For = between(300*time.Millisecond, 800*time.Millisecond)
			case LinkRenew:
				// Replies late by about the renew interval (lease/3): some
				// renewals come back just in time, some after the read timeout.
				f.For = between(3*time.Second, 8*time.Second)
				f.Latency = between(p.Lease/3*4/5, p.Lease/3*6/5)
				f.Standby = rng.IntN(8) == 0
			}
			if f.At+f.For+Overhead(f.Kind) > total-cooldown {
				break
			}
			deck = deck[1:]
			out = append(out, f)
			at += f.For + Overhead(f.Kind) + between(3*time.Second, 8*time.Second)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}

// Overhead is how long a cluster fault is planned to take beyond its For: a
// master's kill -9 waits for its replica's promotion (cluster-node-timeout 1 s
// + the election, about 2–3 s) and for the restarted node to rejoin as a
// replica (a full sync); CLUSTER FAILOVER for the promotion; a reshard of
// 2,000 slots for redis-cli. The schedule spaces the cluster track by it.
func Overhead(k Kind) time.Duration {
	switch k {
	case MasterKill:
		return 10 * time.Second
	case Failover:
		return 5 * time.Second
	case Reshard:
		return 20 * time.Second
	}
	return 0
}
