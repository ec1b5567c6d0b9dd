package soak_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/soak"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// reads builds one observer read per 100 ms in [from, to) of one key, with the
// version version(t).
func reads(from, to time.Duration, version func(time.Duration) int64) []soak.Read {
	var out []soak.Read
	for d := from; d < to; d += 100 * time.Millisecond {
		out = append(out, soak.Read{Sent: at(d), Recv: at(d + 5*time.Millisecond), Versions: []int64{version(d)}})
	}
	return out
}

func rules(r soak.Report) []soak.Rule {
	var out []soak.Rule
	for _, v := range r.Violations {
		out = append(out, v.Rule)
	}
	return out
}

func judge(evs []soak.Event, rds []soak.Read, commits []soak.Commit, samples []soak.Sample) soak.Report {
	return soak.Judge(soak.Input{Params: params, Start: t0, End: at(time.Minute), Keys: []string{"k"},
		Events: evs, Reads: rds, Commits: [][]soak.Commit{commits}, Samples: samples})
}

// absentBetween is a key at version 1, absent in [from, to).
func absentBetween(from, to time.Duration) func(time.Duration) int64 {
	return func(d time.Duration) int64 {
		if d >= from && d < to {
			return -1
		}
		return 1
	}
}

func TestJudgeMissing(t *testing.T) {
	absentAt20 := absentBetween(20*time.Second, 22*time.Second)
	t.Run("outside every window", func(t *testing.T) {
		r := judge(nil, reads(0, 40*time.Second, absentAt20), nil, nil)
		if got := rules(r); !slices.Equal(got, []soak.Rule{soak.Missing}) || r.Violations[0].Count != 20 {
			t.Errorf("violations %v (%+v), want one MISSING over 20 reads", got, r.Violations)
		}
	})
	t.Run("after a FLUSHDB, before the re-warm", func(t *testing.T) {
		evs := []soak.Event{{Kind: soak.RedisFlush, Start: at(19 * time.Second), End: at(19 * time.Second)}}
		if r := judge(evs, reads(0, 40*time.Second, absentAt20), nil, nil); !r.OK() || r.Absent != 20 || r.MaxAbsent != 2*time.Second {
			t.Errorf("violations %v, absences %d for %s; want none, 20 excused for 2s", rules(r), r.Absent, r.MaxAbsent)
		}
	})
	t.Run("a flush long before does not excuse it", func(t *testing.T) {
		evs := []soak.Event{{Kind: soak.RedisFlush, Start: at(time.Second), End: at(time.Second)}}
		if got := rules(judge(evs, reads(0, 40*time.Second, absentAt20), nil, nil)); !slices.Equal(got, []soak.Rule{soak.Missing}) {
			t.Errorf("violations %v, want MISSING", got)
		}
	})
	t.Run("a flush while postgres is down waits for postgres", func(t *testing.T) {
		late := absentBetween(19*time.Second, 45*time.Second)
		evs := []soak.Event{
			{Kind: soak.PGDown, Start: at(18 * time.Second), End: at(40 * time.Second)},
			{Kind: soak.RedisFlush, Start: at(19 * time.Second), End: at(19 * time.Second)},
		}
		if r := judge(evs, reads(0, 50*time.Second, late), nil, nil); !r.OK() {
			t.Errorf("violations %+v, want none", r.Violations)
		}
	})
}

func TestJudgeRegression(t *testing.T) {
	v := func(d time.Duration) int64 {
		switch {
		case d < 10*time.Second:
			return 5
		case d < 11*time.Second:
			return 4 // an older value landed over a newer one
		}
		return 6
	}
	// A flush does not excuse it: what comes back must be at least as new.
	evs := []soak.Event{{Kind: soak.RedisFlush, Start: at(9 * time.Second), End: at(9 * time.Second)}}
	r := judge(evs, reads(0, 20*time.Second, v), nil, nil)
	if got := rules(r); !slices.Equal(got, []soak.Rule{soak.Regression}) || !strings.Contains(r.Violations[0].Detail, "version 4 after 5") {
		t.Errorf("violations %+v, want one REGRESSION 4 after 5", r.Violations)
	}
}

func TestJudgeStaleness(t *testing.T) {
	// Version 2 committed at 10s; the key shows 1 until 10s + shownAt.
	run := func(shownAfter time.Duration, evs []soak.Event) soak.Report {
		v := func(d time.Duration) int64 {
			if d < 10*time.Second+shownAfter {
				return 1
			}
			return 2
		}
		return judge(evs, reads(0, 90*time.Second, v), []soak.Commit{{Version: 2, Ack: at(10 * time.Second)}}, nil)
	}
	if r := run(params.Cycle()-time.Second, nil); !r.OK() {
		t.Errorf("refreshed within the cycle: %+v", r.Violations)
	}
	if got := rules(run(params.Cycle()+time.Second, nil)); !slices.Equal(got, []soak.Rule{soak.Staleness}) {
		t.Errorf("refreshed after the cycle with no fault: violations %v, want STALENESS", got)
	}
	pgDown := []soak.Event{{Kind: soak.PGDown, Start: at(11 * time.Second), End: at(25 * time.Second)}}
	if r := run(25*time.Second, pgDown); !r.OK() {
		t.Errorf("postgres down 11s–25s, refreshed at 35s: %+v", r.Violations)
	}
	if got := rules(run(60*time.Second, pgDown)); !slices.Equal(got, []soak.Rule{soak.Staleness}) {
		t.Errorf("postgres down 11s–25s, refreshed at 70s: violations %v, want STALENESS", got)
	}
	long := []soak.Event{{Kind: soak.PGDown, Start: at(11 * time.Second), End: at(89 * time.Second)}}
	r := run(79*time.Second, long)
	if got := rules(r); !slices.Equal(got, []soak.Rule{soak.Staleness}) || !strings.Contains(r.Violations[0].Detail, "max_stale") {
		t.Errorf("postgres down for 78s, value 79s old: violations %+v, want STALENESS over max_stale", r.Violations)
	}
}

func TestJudgeWriters(t *testing.T) {
	// a leads with epoch 100; b takes over with 200 at 10s (seen at 10.1s).
	var ss []soak.Sample
	for d := time.Duration(0); d < 30*time.Second; d += 250 * time.Millisecond {
		ss = append(ss, soak.Sample{Proc: "b#1", Sent: at(d), Recv: at(d + 10*time.Millisecond),
			Leader: d >= 10*time.Second, Epoch: map[bool]int64{true: 200, false: 0}[d >= 10*time.Second], Writes: float64(d / time.Second)})
	}
	aSamples := func(writesUntil time.Duration) []soak.Sample {
		var out []soak.Sample
		for d := time.Duration(0); d < 30*time.Second; d += 250 * time.Millisecond {
			out = append(out, soak.Sample{Proc: "a#1", Sent: at(d), Recv: at(d + 10*time.Millisecond),
				Leader: d < 10*time.Second, Epoch: 100, Writes: float64(min(d, writesUntil) / (100 * time.Millisecond))})
		}
		return out
	}
	if r := judge(nil, nil, nil, append(aSamples(10*time.Second), ss...)); !r.OK() || r.Epochs != 2 || r.Leaders != 2 || r.WriterChecks < 40 {
		t.Errorf("a stops writing when b leads: %+v epochs %d leaders %d, %d intervals judged", r.Violations, r.Epochs, r.Leaders, r.WriterChecks)
	}
	// a's writes land until 11s: inside the guard after b was seen, not judged.
	if r := judge(nil, nil, nil, append(aSamples(11*time.Second), ss...)); !r.OK() {
		t.Errorf("a's counter grows within the guard: %+v", r.Violations)
	}
	r := judge(nil, nil, nil, append(aSamples(20*time.Second), ss...))
	if got := rules(r); !slices.Equal(got, []soak.Rule{soak.TwoWriters}) || !strings.Contains(r.Violations[0].Detail, "epoch 100") {
		t.Errorf("a lands writes 10s after b leads: %+v, want TWO-WRITERS", r.Violations)
	}
	// A FLUSHDB after b raised its fences takes them: a's writes may land.
	flush := []soak.Event{{Kind: soak.RedisFlush, Start: at(12 * time.Second), End: at(12 * time.Second)}}
	if r := judge(flush, nil, nil, append(aSamples(20*time.Second), ss...)); !r.OK() {
		t.Errorf("a writes after a flush: %+v", r.Violations)
	}
	// a was SIGSTOPped until 16s: its count after the wake-up is judged 2s later.
	pause := []soak.Event{{Kind: soak.PauseLong, Target: "a#1", Start: at(9 * time.Second), End: at(16 * time.Second)}}
	if got := rules(judge(pause, nil, nil, append(aSamples(20*time.Second), ss...))); !slices.Equal(got, []soak.Rule{soak.TwoWriters}) {
		t.Errorf("a paused, wakes and keeps landing writes: %v, want TWO-WRITERS", got)
	}
	same := append(aSamples(10*time.Second), soak.Sample{Proc: "c#1", Sent: at(5 * time.Second), Recv: at(5 * time.Second), Leader: true, Epoch: 100})
	if got := rules(judge(nil, nil, nil, same)); !slices.Equal(got, []soak.Rule{soak.SameEpoch}) {
		t.Errorf("two processes lead with epoch 100: %v, want SAME-EPOCH", got)
	}
}

func TestScheduleReplays(t *testing.T) {
	a := soak.Schedule(42, 10*time.Minute, params)
	if b := soak.Schedule(42, 10*time.Minute, params); !slices.Equal(a, b) {
		t.Fatal("the same seed gave two schedules")
	}
	if c := soak.Schedule(43, 10*time.Minute, params); slices.Equal(a, c) {
		t.Error("seeds 42 and 43 gave the same schedule")
	}
	kinds := map[soak.Kind]bool{}
	for i, f := range a {
		if i > 0 && f.At < a[i-1].At {
			t.Errorf("fault %d (%s) starts at %s, before fault %d at %s", i, f.Kind, f.At, i-1, a[i-1].At)
		}
		kinds[f.Kind] = true
		if f.At+f.For > 10*time.Minute {
			t.Errorf("%s at %s for %s runs past the end", f.Kind, f.At, f.For)
		}
	}
	for _, k := range soak.AllKinds() {
		if !kinds[k] {
			t.Errorf("10 minutes of seed 42 never %s", k)
		}
	}
}

// TestScheduleDealsEveryKindFiveTimes checks the deck arithmetic of
// Schedule: in 10 minutes, every kind of every track comes up at least 5
// times, over 500 seeds.
func TestScheduleDealsEveryKindFiveTimes(t *testing.T) { dealsEveryKindFiveTimes(t, params) }

func dealsEveryKindFiveTimes(t *testing.T, params soak.Params) {
	least := map[soak.Kind]int{}
	for seed := uint64(1); seed <= 500; seed++ {
		n := map[soak.Kind]int{}
		for _, f := range soak.Schedule(seed, 10*time.Minute, params) {
			n[f.Kind]++
		}
		for _, k := range params.Kinds() {
			if m, ok := least[k]; !ok || n[k] < m {
				least[k] = n[k]
			}
		}
	}
	for _, k := range params.Kinds() {
		if least[k] < 5 {
			t.Errorf("%s: %d times in 10 minutes for one seed of 500; want at least 5", k, least[k])
		}
	}
	t.Logf("fewest runs of each kind in 10 minutes over 500 seeds: %v", least)
}

// recordReads builds one read per 100 ms in [from, to) of one key whose
// version record, fence and lease at d are state(d).
func recordReads(from, to time.Duration, state func(time.Duration) (rec string, fence, lease int64)) []soak.Read {
	var out []soak.Read
	for d := from; d < to; d += 100 * time.Millisecond {
		rec, fence, lease := state(d)
		out = append(out, soak.Read{Sent: at(d), Recv: at(d + 5*time.Millisecond), Versions: []int64{1},
			Records: []string{rec}, Fence: fence, Lease: lease})
	}
	return out
}

// record is a version record of epoch e written by the load seq.
func record(e int64, seq time.Duration) string {
	return fmt.Sprintf("%d:%d:%020d:%040x", e, seq/time.Millisecond, 1, 7)
}

func TestJudgeRecords(t *testing.T) {
	// a leads with epoch 100 and rewrites the record every 2 s; b leads with
	// epoch 200 from 10 s (fence and lease 200). stale(d) is true when a
	// write of a's lands at d.
	run := func(evs []soak.Event, stale func(time.Duration) bool, samples []soak.Sample) soak.Report {
		rec := ""
		rds := recordReads(0, 30*time.Second, func(d time.Duration) (string, int64, int64) {
			e := int64(100)
			if d >= 10*time.Second {
				e = 200
			}
			if d%(2*time.Second) == 0 {
				rec = record(e, d)
			}
			for _, ev := range evs { // a flush empties Redis for 2 s but for a's write
				if ev.Kind == soak.RedisFlush && d >= ev.Start.Sub(t0) && d < ev.Start.Sub(t0)+2*time.Second {
					if stale(d) {
						rec = record(100, d)
					} else if d == ev.Start.Sub(t0) {
						rec = ""
					}
					return rec, 0, 0
				}
			}
			if stale(d) {
				rec = record(100, d)
			}
			return rec, e, e
		})
		return judge(evs, rds, nil, samples)
	}
	never := func(time.Duration) bool { return false }
	if r := run(nil, never, nil); !r.OK() || r.RecordWrites != 15 {
		t.Errorf("a stops at 10s, b writes: %+v, %d record writes; want none, 15", r.Violations, r.RecordWrites)
	}
	at15 := func(d time.Duration) bool { return d == 15*time.Second }
	r := run(nil, at15, nil)
	if got := rules(r); !slices.Equal(got, []soak.Rule{soak.TwoWriters, soak.Lease}) || !strings.Contains(r.Violations[0].Detail, "epoch 100") ||
		!strings.Contains(r.Violations[0].Detail, "fence held epoch 200") {
		t.Errorf("a write of epoch 100 lands 5s after b raised the fence: %+v, want TWO-WRITERS and LEASE", r.Violations)
	}
	// A FLUSHDB at 14s takes the fence: a's write is not refused, so it is
	// no TWO-WRITERS; but a's lease went at 10s, so it is still LEASE.
	flush := []soak.Event{{Kind: soak.RedisFlush, Start: at(14 * time.Second), End: at(14 * time.Second)}}
	if got := rules(run(flush, func(d time.Duration) bool { return d == 15*time.Second }, nil)); !slices.Equal(got, []soak.Rule{soak.Lease}) {
		t.Errorf("a writes after a flush: %v, want LEASE only", got)
	}
	// A flush before b raised the fence does not excuse it.
	early := []soak.Event{{Kind: soak.RedisFlush, Start: at(5 * time.Second), End: at(5 * time.Second)}}
	if got := rules(run(early, at15, nil)); !slices.Contains(got, soak.TwoWriters) {
		t.Errorf("a flush at 5s, a writes at 15s: %v, want TWO-WRITERS", got)
	}
	// Just after the takeover, a's in-flight write is still refused by the
	// fence that b raised: TWO-WRITERS, with no guard.
	if got := rules(run(nil, func(d time.Duration) bool { return d == 10200*time.Millisecond }, nil)); !slices.Equal(got, []soak.Rule{soak.TwoWriters}) {
		t.Errorf("a writes 200ms after b raised the fence: %v, want TWO-WRITERS only (LEASE has a guard)", got)
	}
}

func TestJudgeLease(t *testing.T) {
	// a holds the lease with epoch 100 until 10s, then no one does: the
	// fence stays at 100, so only the lease says a's term is over.
	run := func(evs []soak.Event, lands time.Duration) soak.Report {
		rec := record(100, 0)
		rds := recordReads(0, 30*time.Second, func(d time.Duration) (string, int64, int64) {
			if d == lands {
				rec = record(100, d)
			}
			if d < 10*time.Second {
				return rec, 100, 100
			}
			return rec, 100, 0
		})
		samples := []soak.Sample{{Proc: "a#1", Sent: at(0), Recv: at(0), Leader: true, Epoch: 100}}
		return judge(evs, rds, nil, samples)
	}
	r := run(nil, 15*time.Second)
	if got := rules(r); !slices.Equal(got, []soak.Rule{soak.Lease}) || !strings.Contains(r.Violations[0].Detail, "lease gone") {
		t.Errorf("a writes 5s after its lease went: %+v, want LEASE", r.Violations)
	}
	if r := run(nil, 11*time.Second); !r.OK() {
		t.Errorf("a's write lands 1s after its lease went (in flight): %+v", r.Violations)
	}
	pause := []soak.Event{{Kind: soak.PauseLong, Target: "a#1", Start: at(9 * time.Second), End: at(14 * time.Second)}}
	if r := run(pause, 15*time.Second); !r.OK() {
		t.Errorf("a, SIGSTOPped past its lease, sends its write on waking: %+v", r.Violations)
	}
	flush := []soak.Event{{Kind: soak.RedisFlush, Start: at(10 * time.Second), End: at(10 * time.Second)}}
	if r := run(flush, 15*time.Second); !r.OK() {
		t.Errorf("the lease went with a flush: %+v", r.Violations)
	}
}

func TestKindStats(t *testing.T) {
	absentAt20 := absentBetween(20*time.Second, 22*time.Second)
	evs := []soak.Event{
		{Kind: soak.RedisFlush, Start: at(19 * time.Second), End: at(19 * time.Second)},
		{Kind: soak.LinkCut, Target: "a#1", Start: at(2 * time.Second), End: at(6 * time.Second)},
		{Kind: soak.LinkCut, Target: "b#1", Start: at(30 * time.Second), End: at(32 * time.Second)},
		{Kind: soak.Kill, Start: at(3 * time.Second), End: at(3 * time.Second), Note: "skipped: no instance up"},
	}
	r := judge(evs, reads(0, 40*time.Second, absentAt20), nil, nil)
	got := map[soak.Kind]soak.KindStat{}
	for _, k := range r.Kinds {
		got[k.Kind] = k
	}
	if k := got[soak.RedisFlush]; k.Count != 1 || k.MaxAbsent != 2*time.Second {
		t.Errorf("FLUSHDB: %+v, want 1 run, 2s absence", k)
	}
	if k := got[soak.LinkCut]; k.Count != 2 || k.MaxAbsent != 0 {
		t.Errorf("link cut: %+v, want 2 runs, no absence", k)
	}
	if k := got[soak.Kill]; k.Count != 0 {
		t.Errorf("kill -9: %+v, want 0 runs (skipped)", k)
	}
	if len(r.Kinds) != len(soak.AllKinds()) {
		t.Errorf("%d kinds in the verdict, want every one of %d", len(r.Kinds), len(soak.AllKinds()))
	}
}

// TestBackAfter: a Redis restart's line in the verdict also counts from the
// moment Redis accepted connections again (Event.Up) to the end of the read by
// which every key had been found back; the absence figure counts from the
// first read that found a key gone.
func TestBackAfter(t *testing.T) {
	up := at(21*time.Second + 50*time.Millisecond)
	evs := []soak.Event{{Kind: soak.RedisDown, Start: at(19 * time.Second), End: up, Up: up}}
	r := judge(evs, reads(0, 40*time.Second, absentBetween(20*time.Second, 22*time.Second)), nil, nil)
	var k soak.KindStat
	for _, s := range r.Kinds {
		if s.Kind == soak.RedisDown {
			k = s
		}
	}
	want := 955 * time.Millisecond // from 21.05 s to the end of the read sent at 22 s
	if k.Count != 1 || k.MaxAbsent != 2*time.Second || k.MaxFromUp != want || !slices.Equal(k.FromUp, []time.Duration{want}) {
		t.Errorf("redis restart: %+v, want 1 run, 2s absence, %s from accepting connections", k, want)
	}
	if out := soak.Format(soak.Input{Params: params, Start: t0, End: at(time.Minute)}, r, 1); !strings.Contains(out, "from accepting connections 955ms (955ms)") {
		t.Errorf("the verdict does not print the figure:\n%s", out)
	}

	// Two keys: the later one decides; a key found once is back, whatever
	// the reads after it find; reads before up do not count.
	rds := []soak.Read{
		{Sent: at(0), Recv: at(time.Millisecond), Versions: []int64{1, 1}},
		{Sent: at(time.Second), Recv: at(time.Second + time.Millisecond), Versions: []int64{1, -1}},
		{Sent: at(2 * time.Second), Recv: at(2*time.Second + time.Millisecond), Versions: []int64{-1, 1}},
		{Sent: at(3 * time.Second), Recv: at(3*time.Second + time.Millisecond), Versions: []int64{-2, -1}},
	}
	if got := soak.BackAfter(at(500*time.Millisecond), rds, 2); got != 1501*time.Millisecond {
		t.Errorf("BackAfter = %s, want 1.501s (key 0 at the read of 1 s, key 1 at 2 s)", got)
	}
	if got := soak.BackAfter(at(2500*time.Millisecond), rds, 2); got != 501*time.Millisecond {
		t.Errorf("BackAfter with keys never back = %s, want 501ms (to the last read)", got)
	}
}
