package soak_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/soak"
)

var clusterParams = func() soak.Params { p := params; p.Cluster = true; return p }()

// TestClusterScheduleDealsEveryKindFiveTimes: the Cluster variant's deck
// arithmetic, every kind of its three tracks at least 5 times in 10 minutes
// over 500 seeds, and none of the single-node-only faults.
func TestClusterScheduleDealsEveryKindFiveTimes(t *testing.T) {
	dealsEveryKindFiveTimes(t, clusterParams)
	for _, f := range soak.Schedule(7, 10*time.Minute, clusterParams) {
		switch f.Kind {
		case soak.RedisDown, soak.RedisFlush, soak.RedisPause, soak.LinkSlow, soak.LinkNarrow, soak.LinkReset, soak.LinkCut, soak.LinkRenew:
			t.Errorf("the cluster schedule deals %s", f.Kind)
		}
		if f.Kind == soak.MasterPause && f.For >= time.Second {
			t.Errorf("a master paused %s: not shorter than cluster-node-timeout", f.For)
		}
	}
	// The single-node schedule of a seed is what it was before the cluster variant.
	if a, b := soak.Schedule(7, 10*time.Minute, params), soak.Schedule(7, 10*time.Minute, clusterParams); slices.Equal(a, b) {
		t.Error("the cluster and single-node schedules are the same")
	}
}

func TestSlotAndTag(t *testing.T) {
	// Redis's cluster specification and CLUSTER KEYSLOT.
	for key, want := range map[string]int{"123456789": 0x31C3, "foo": 12182, "{user1000}.following": soak.Slot("user1000"), "foo{}{bar}": soak.Slot("foo{}{bar}")} {
		if got := soak.Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
	if soak.Slot("foo{}{bar}") == soak.Slot("bar") {
		t.Error("an empty tag must hash the whole key")
	}
	// docs/readside.md's examples of Hearth's tags.
	for key, tag := range map[string]string{"product:7": "9kd", "{user:1}:cart": "3as"} {
		if got := soak.SlotTag(soak.Slot(key)); got != tag {
			t.Errorf("SlotTag(Slot(%q)) = %q, want %q", key, got, tag)
		}
	}
	for n := range soak.Slots {
		if got := soak.Slot("{" + soak.SlotTag(n) + "}:x"); got != n {
			t.Fatalf("SlotTag(%d) = %q lands in slot %d", n, soak.SlotTag(n), got)
		}
	}
}

// Two keys on two masters: a on the master that fails, b on another.
var clusterKeys = func() []string {
	a := "soak:item:1"
	for i := 2; ; i++ {
		if b := "soak:item:" + string(rune('0'+i)); soak.Slot(b) != soak.Slot(a) {
			return []string{a, b}
		}
	}
}()

func clusterReads(from, to time.Duration, v func(d time.Duration, key int) int64, unread func(d time.Duration, key int) bool) []soak.Read {
	var out []soak.Read
	for d := from; d < to; d += 100 * time.Millisecond {
		rd := soak.Read{Sent: at(d), Recv: at(d + 5*time.Millisecond), Versions: []int64{v(d, 0), v(d, 1)}}
		if unread != nil {
			rd.Unread = []bool{unread(d, 0), unread(d, 1)}
		}
		out = append(out, rd)
	}
	return out
}

func clusterJudge(p soak.Params, evs []soak.Event, rds []soak.Read) soak.Report {
	return soak.Judge(soak.Input{Params: p, Start: t0, End: at(time.Minute), Keys: clusterKeys,
		Events: evs, Reads: rds, Commits: [][]soak.Commit{nil, nil}})
}

func TestJudgeClusterFailover(t *testing.T) {
	sa := soak.Slot(clusterKeys[0])
	// a's master is killed at 10s, its replica promoted at 13s.
	kill := []soak.Event{{Kind: soak.MasterKill, Target: "m1", Start: at(10 * time.Second), Promoted: at(13 * time.Second),
		End: at(20 * time.Second), Slots: [][2]int{{sa, sa}}}}
	unread := func(d time.Duration, k int) bool { return k == 0 && d >= 10*time.Second && d < 13*time.Second }
	absent := func(key int, from, to time.Duration) func(time.Duration, int) int64 {
		return func(d time.Duration, k int) int64 {
			if k == key && d >= from && d < to {
				return -1
			}
			return 1
		}
	}
	t.Run("the failed master's keys, unreadable then absent after the promotion", func(t *testing.T) {
		r := clusterJudge(clusterParams, kill, clusterReads(0, 40*time.Second, absent(0, 13*time.Second, 14*time.Second), unread))
		if !r.OK() || r.Absent != 10 {
			t.Fatalf("violations %+v, %d excused; want none, 10 excused", r.Violations, r.Absent)
		}
		if len(r.Failovers) != 1 {
			t.Fatalf("failovers %+v", r.Failovers)
		}
		f := r.Failovers[0]
		if f.FailedReads != 10 || f.FailedKeys != 1 || f.SurvivingReads != 0 || f.Unread != 30 || f.Promotion != 3*time.Second {
			t.Errorf("failover %+v; want 10 absent key-reads of 1 key on the failed master, none on the others, 30 unread, promoted after 3s", f)
		}
	})
	t.Run("a surviving master's key, during the failover", func(t *testing.T) {
		rds := clusterReads(0, 40*time.Second, absent(1, 12*time.Second, 13*time.Second), unread)
		r := clusterJudge(clusterParams, kill, rds)
		if got := rules(r); !slices.Equal(got, []soak.Rule{soak.FailoverSpill}) || !strings.Contains(r.Violations[0].Detail, "m1") {
			t.Errorf("violations %+v, want one FAILOVER-SPILL naming m1", r.Violations)
		}
		if f := r.Failovers[0]; f.SurvivingReads != 10 || f.SurvivingKeys != 1 || f.FailedReads != 0 {
			t.Errorf("failover %+v; want 10 absent key-reads of 1 key on the surviving masters", f)
		}
		tolerant := clusterParams
		tolerant.TolerateSpill = true
		if r := clusterJudge(tolerant, kill, rds); !r.OK() || len(r.Tolerated) != 1 || r.Tolerated[0].Rule != soak.FailoverSpill {
			t.Errorf("tolerated: violations %+v, tolerated %+v; want none and one FAILOVER-SPILL", r.Violations, r.Tolerated)
		}
	})
	t.Run("a surviving master's key, after promotion + takeover", func(t *testing.T) {
		late := 13*time.Second + clusterParams.Takeover() + time.Second
		r := clusterJudge(clusterParams, kill, clusterReads(0, 40*time.Second, absent(1, late, late+time.Second), unread))
		if got := rules(r); !slices.Equal(got, []soak.Rule{soak.Missing}) {
			t.Errorf("violations %v, want MISSING", got)
		}
	})
	t.Run("a paused master excuses its own keys only", func(t *testing.T) {
		pause := []soak.Event{{Kind: soak.MasterPause, Target: "m1", Start: at(10 * time.Second), End: at(10*time.Second + 800*time.Millisecond), Slots: [][2]int{{sa, sa}}}}
		if r := clusterJudge(clusterParams, pause, clusterReads(0, 40*time.Second, absent(0, 11*time.Second, 12*time.Second), nil)); !r.OK() {
			t.Errorf("its own key: %+v", r.Violations)
		}
		if got := rules(clusterJudge(clusterParams, pause, clusterReads(0, 40*time.Second, absent(1, 11*time.Second, 12*time.Second), nil))); !slices.Equal(got, []soak.Rule{soak.Missing}) {
			t.Errorf("another master's key: %v, want MISSING", got)
		}
	})
	t.Run("a reshard excuses nothing", func(t *testing.T) {
		rs := []soak.Event{{Kind: soak.Reshard, Target: "m1→m2", Start: at(10 * time.Second), End: at(20 * time.Second)}}
		if got := rules(clusterJudge(clusterParams, rs, clusterReads(0, 40*time.Second, absent(0, 11*time.Second, 12*time.Second), nil))); !slices.Equal(got, []soak.Rule{soak.Missing}) {
			t.Errorf("violations %v, want MISSING", got)
		}
	})
}

// TestJudgeClusterFences: each key is judged against its own slot's fence,
// an unread key not at all, and a master's kill -9 resets the fences of its
// slots only (its promoted replica may hold older ones).
func TestJudgeClusterFences(t *testing.T) {
	sa := soak.Slot(clusterKeys[0])
	// a's fence rises to 200 at 5s; b's stays at 100. At 10s both records
	// change to a write of epoch 150.
	state := func(d time.Duration) soak.Read {
		rd := soak.Read{Sent: at(d), Recv: at(d + 5*time.Millisecond), Versions: []int64{1, 1}, Lease: 0,
			Records: []string{"100:1:1:aaaaaaaaaa", "100:1:1:bbbbbbbbbb"}, Fences: []int64{100, 100}}
		if d >= 5*time.Second {
			rd.Fences[0] = 200
		}
		if d >= 10*time.Second {
			rd.Records = []string{"150:2:1:cccccccccc", "150:2:1:dddddddddd"}
		}
		return rd
	}
	var rds []soak.Read
	for d := time.Duration(0); d < 20*time.Second; d += 100 * time.Millisecond {
		rds = append(rds, state(d))
	}
	r := clusterJudge(clusterParams, nil, rds)
	if got := rules(r); !slices.Equal(got, []soak.Rule{soak.TwoWriters}) || r.Violations[0].Key != clusterKeys[0] {
		t.Errorf("violations %+v, want TWO-WRITERS on %s only", r.Violations, clusterKeys[0])
	}
	// a's master killed at 8s: its promoted replica holds fence 100 again,
	// and an older record.
	kill := []soak.Event{{Kind: soak.MasterKill, Target: "m1", Start: at(8 * time.Second), Promoted: at(9 * time.Second), End: at(12 * time.Second), Slots: [][2]int{{sa, sa}}}}
	back := slices.Clone(rds)
	for i := range back {
		if d := back[i].Sent.Sub(t0); d >= 8*time.Second {
			back[i].Fences = []int64{100, 100}
			if d < 10*time.Second {
				back[i].Records = []string{"90:1:1:eeeeeeeeee", back[i].Records[1]}
			}
		}
	}
	if r := clusterJudge(clusterParams, kill, back); !r.OK() {
		t.Errorf("after a kill of a's master: %+v", r.Violations)
	}
	if r := clusterJudge(clusterParams, nil, back); r.OK() {
		t.Error("a record going back with no kill: no violation")
	}
	// Unread at the write: the next read that finds it still judges it.
	for i := range rds {
		if d := rds[i].Sent.Sub(t0); d >= 9*time.Second && d < 11*time.Second {
			rds[i].Unread = []bool{true, false}
			rds[i].Records[0], rds[i].Fences[0] = "", 0
		}
	}
	if got := rules(clusterJudge(clusterParams, nil, rds)); !slices.Equal(got, []soak.Rule{soak.TwoWriters}) {
		t.Errorf("a unread around its write: %v, want TWO-WRITERS", got)
	}
}

// TestJudgeClusterSpillNotChained: a spill window is lengthened by a fault
// overlapping it, not by the next fault that overlaps that one.
func TestJudgeClusterSpillNotChained(t *testing.T) {
	sa := soak.Slot(clusterKeys[0])
	evs := []soak.Event{
		{Kind: soak.MasterKill, Target: "m1", Start: at(10 * time.Second), Promoted: at(12 * time.Second), End: at(20 * time.Second), Slots: [][2]int{{sa, sa}}},
		// Overlaps the spill window [10s, 16.8s]: lengthens it to 16s + 6s + 4.8s.
		{Kind: soak.OriginSlow, Target: "proxy", Start: at(15 * time.Second), End: at(16 * time.Second)},
		// Overlaps only the lengthened window.
		{Kind: soak.PGDown, Target: "postgres", Start: at(25 * time.Second), End: at(35 * time.Second)},
	}
	absentAt := func(from time.Duration) func(time.Duration, int) int64 {
		return func(d time.Duration, k int) int64 {
			if k == 1 && d >= from && d < from+500*time.Millisecond {
				return -1
			}
			return 1
		}
	}
	r := clusterJudge(clusterParams, evs, clusterReads(0, 60*time.Second, absentAt(25*time.Second), nil))
	if got := rules(r); !slices.Equal(got, []soak.Rule{soak.FailoverSpill}) {
		t.Errorf("absent at 25s: %v, want FAILOVER-SPILL", got)
	}
	if f := r.Failovers[0]; f.SurvivingReads != 5 || f.SurvivingKeys != 1 || !f.Until.Equal(at(16*time.Second+params.BreakerOpenFor+params.LoadTimeout+params.Slack+params.Takeover())) {
		t.Errorf("failover %+v; want the 5 absent key-reads counted on the surviving masters, the window to 26.8s", f)
	}
	if got := rules(clusterJudge(clusterParams, evs, clusterReads(0, 60*time.Second, absentAt(40*time.Second), nil))); !slices.Equal(got, []soak.Rule{soak.Missing}) {
		t.Errorf("absent at 40s, after the postgres outage the failover did not overlap: %v, want MISSING", got)
	}
}
