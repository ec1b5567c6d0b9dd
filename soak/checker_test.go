package soak_test

import (
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

func TestJudgeMissing(t *testing.T) {
	absentAt20 := func(d time.Duration) int64 {
		if d >= 20*time.Second && d < 22*time.Second {
			return -1
		}
		return 1
	}
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
		late := func(d time.Duration) int64 {
			if d >= 19*time.Second && d < 45*time.Second {
				return -1
			}
			return 1
		}
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
	for _, k := range append(slices.Clone(soak.InstanceKinds), soak.ServerKinds...) {
		if !kinds[k] {
			t.Errorf("10 minutes of seed 42 never %s", k)
		}
	}
}
