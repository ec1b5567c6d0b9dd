package changes

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/keytmpl"
	"github.com/hearth-dev/hearth/warmer"
)

// specOnly answers Spec; the queue under test never gets to refresh.
type specOnly struct{ spec *warmer.Spec }

func (s specOnly) Hot(string, []string) ([]string, bool) { return nil, false }
func (s specOnly) RefreshMembers(context.Context, string, []string) (warmer.Outcome, error) {
	return warmer.Outcome{}, nil
}
func (s specOnly) Refresh(context.Context, string, warmer.RunOptions) (warmer.Outcome, error) {
	return warmer.Outcome{}, nil
}
func (s specOnly) Spec(string) (*warmer.Spec, bool) { return s.spec, true }

// TestQueueOverflow: past MaxPendingChanges members within one window the
// pending set is dropped for one full refresh, measured from the earliest
// change; further members coalesce into it.
func TestQueueOverflow(t *testing.T) {
	tmpl, err := keytmpl.Parse("p:{id}")
	if err != nil {
		t.Fatal(err)
	}
	m := newMetrics(prometheus.NewRegistry())
	l := &listener{w: specOnly{&warmer.Spec{Name: "p", Template: tmpl}}, m: m, now: time.Now}
	q := newQueue("p", time.Hour, testGather, 100, l, newPacing(DefaultMinFullInterval))
	ids := make([]string, MaxPendingChanges+500)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	t0 := time.UnixMicro(1_000_000)
	q.add(payload{Hearth: 1, IDs: ids[:10]}, t0)
	q.add(payload{Hearth: 1, IDs: ids}, t0.Add(time.Second))
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.all || len(q.pending) != 0 {
		t.Fatalf("after %d members: all %v, %d pending; want one full refresh and none pending", len(ids), q.all, len(q.pending))
	}
	if q.allTS != t0.UnixMicro() {
		t.Errorf("full refresh measured from %d, want the earliest change %d", q.allTS, t0.UnixMicro())
	}
	if got := testutil.ToFloat64(m.overflows.WithLabelValues("p")); got != 1 {
		t.Errorf("overflows = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.members.WithLabelValues("p", "coalesced")); got < 499 {
		t.Errorf("coalesced = %v, want the members past the bound (and the 10 repeated)", got)
	}
}

// recorder is a Refresher that records every refresh it is asked for,
// each taking loadTime.
type recorder struct {
	spec     *warmer.Spec
	loadTime time.Duration
	mu       sync.Mutex
	fulls    []time.Time
	loads    map[string][]time.Time // member → when a load of it started
	inFlight map[string]bool
	overlap  int // loads of a member started while one of it ran
	calls    []call
}

// call is one RefreshMembers: when it started and what it loaded.
type call struct {
	at      time.Time
	members []string
}

func newRecorder(t *testing.T, key string) *recorder {
	t.Helper()
	tmpl, err := keytmpl.Parse(key)
	if err != nil {
		t.Fatal(err)
	}
	return &recorder{spec: &warmer.Spec{Name: "p", Template: tmpl}, loadTime: 5 * time.Millisecond,
		loads: map[string][]time.Time{}, inFlight: map[string]bool{}}
}

func (r *recorder) Hot(_ string, members []string) ([]string, bool) { return members, true }
func (r *recorder) Spec(string) (*warmer.Spec, bool)                { return r.spec, true }
func (r *recorder) Refresh(context.Context, string, warmer.RunOptions) (warmer.Outcome, error) {
	r.mu.Lock()
	r.fulls = append(r.fulls, time.Now())
	r.mu.Unlock()
	time.Sleep(r.loadTime)
	return warmer.Outcome{}, nil
}
func (r *recorder) RefreshMembers(_ context.Context, _ string, members []string) (warmer.Outcome, error) {
	r.mu.Lock()
	r.calls = append(r.calls, call{time.Now(), members})
	for _, m := range members {
		if r.inFlight[m] {
			r.overlap++
		}
		r.inFlight[m] = true
		r.loads[m] = append(r.loads[m], time.Now())
	}
	r.mu.Unlock()
	time.Sleep(r.loadTime)
	r.mu.Lock()
	for _, m := range members {
		r.inFlight[m] = false
	}
	r.mu.Unlock()
	return warmer.Outcome{Written: len(members)}, nil
}

// runQueue starts a queue on r (no coalesce wait, batches of 100) in the
// synctest bubble; it stops at the test's end.
func runQueue(t *testing.T, r *recorder, pace *pacing) *queue {
	t.Helper()
	return runQueueWith(t, r, pace, 0, 100)
}

// testGather is the gather wait the queue tests run with (notify.gather's
// default is config.DefaultGather, 3 ms).
const testGather = 5 * time.Millisecond

// runQueueWith is runQueue with a coalesce wait and a batch size.
func runQueueWith(t *testing.T, r *recorder, pace *pacing, coalesce time.Duration, batch int) *queue {
	t.Helper()
	return runQueueGather(t, r, pace, coalesce, testGather, batch)
}

// runQueueGather is runQueueWith with a gather wait.
func runQueueGather(t *testing.T, r *recorder, pace *pacing, coalesce, gather time.Duration, batch int) *queue {
	t.Helper()
	l := &listener{w: r, m: newMetrics(prometheus.NewRegistry()), now: time.Now, log: zerolog.Nop()}
	q := newQueue("p", coalesce, gather, batch, l, pace)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); q.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return q
}

// spacedAtLeast fails unless consecutive times are at least d apart.
func spacedAtLeast(t *testing.T, what string, ts []time.Time, d time.Duration) {
	t.Helper()
	for i := 1; i < len(ts); i++ {
		if gap := ts[i].Sub(ts[i-1]); gap < d {
			t.Errorf("%s %d started %v after the one before, want >= %v", what, i, gap, d)
		}
	}
}

// TestPacingIDsThenAll: anyone who can NOTIFY sends {"ids":["1"]} then
// {"all":true} 5 ms later, 50 times (before, a members refresh that was
// already armed turned into a full refresh each time: 50 in 5.5 s). Full
// refreshes stay MinFullInterval apart, and the changed member is still
// loaded at once rather than behind the waiting full refresh.
func TestPacingIDsThenAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(t, "p:{id}")
		q := runQueue(t, r, newPacing(DefaultMinFullInterval))
		q.full() // the session's opening full refresh
		time.Sleep(time.Second)
		start := time.Now()
		for range 50 {
			q.add(payload{Hearth: 1, IDs: []string{"1"}}, time.Now())
			time.Sleep(5 * time.Millisecond)
			q.add(payload{Hearth: 1, All: true}, time.Now())
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(30 * time.Second)
		synctest.Wait()
		r.mu.Lock()
		defer r.mu.Unlock()
		spacedAtLeast(t, "full refresh", r.fulls, DefaultMinFullInterval)
		if n := len(r.fulls); n != 2 {
			t.Errorf("%d full refreshes in 31 s, want 2 (the session's, then one for the flood's 50 'all' 10 s after it)", n)
		}
		if l := r.loads["1"]; len(l) == 0 || l[0].Sub(start) > 100*time.Millisecond {
			t.Errorf("member 1 loads %v: want the first within the coalescing window of its change, not behind the full refresh", l)
		}
	})
}

// TestPacingOneMember: 20,000 notifications for one member over 4 s cost at
// most MemberBurst loads at once, then one per MemberInterval, never two of
// it at a time; a change to another member meanwhile is loaded within the
// coalescing window as if nothing else happened.
func TestPacingOneMember(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(t, "p:{id}")
		q := runQueue(t, r, newPacing(DefaultMinFullInterval))
		const n, over = 20_000, 4 * time.Second
		start := time.Now()
		var other time.Time
		for i := range n {
			q.add(payload{Hearth: 1, IDs: []string{"1"}}, time.Now())
			if i == n/2 {
				other = time.Now()
				q.add(payload{Hearth: 1, IDs: []string{"2"}}, other)
			}
			time.Sleep(over / n)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		r.mu.Lock()
		defer r.mu.Unlock()
		loads := r.loads["1"]
		// Allowed in [start, last change + one interval]: the burst plus one
		// per interval.
		bound := MemberBurst + int(over/MemberInterval) + 1
		if len(loads) == 0 || len(loads) > bound {
			t.Errorf("member 1 loaded %d times for %d notifications over %v, want 1..%d", len(loads), n, over, bound)
		}
		if r.overlap != 0 {
			t.Errorf("%d loads of a member started while one of it was in flight", r.overlap)
		}
		if l := r.loads["2"]; len(l) != 1 || l[0].Sub(other) > 50*time.Millisecond {
			t.Errorf("member 2 (changed once) loaded at %v after its change, want once within the coalescing window", l)
		}
		t.Logf("member 1: %d loads, first %v, last %v after the first notification", len(loads), loads[0].Sub(start), loads[len(loads)-1].Sub(start))
	})
}

// TestPacingIsolatedChangeAtOnce: a member not loaded lately is loaded the
// moment its change arrives (no window is waited); a second and third change
// right after its load are loaded at once too (the burst). With a coalesce
// wait set, each waits exactly that.
func TestPacingIsolatedChangeAtOnce(t *testing.T) {
	for _, coalesce := range []time.Duration{0, 20 * time.Millisecond} {
		t.Run(coalesce.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRecorder(t, "p:{id}")
				q := runQueueWith(t, r, newPacing(DefaultMinFullInterval), coalesce, 100)
				var sent []time.Time
				for range MemberBurst {
					sent = append(sent, time.Now())
					q.add(payload{Hearth: 1, IDs: []string{"7"}}, time.Now())
					time.Sleep(100 * time.Millisecond)
				}
				synctest.Wait()
				r.mu.Lock()
				defer r.mu.Unlock()
				if len(r.loads["7"]) != MemberBurst {
					t.Fatalf("%d loads for %d spaced changes, want one each", len(r.loads["7"]), MemberBurst)
				}
				for i, at := range r.loads["7"] {
					if d := at.Sub(sent[i]); d != coalesce {
						t.Errorf("change %d loaded %v after it, want %v", i, d, coalesce)
					}
				}
			})
		})
	}
}

// TestQueueGathersWhileInFlight: the first change is loaded at once; the
// changes that arrive while that load runs (50 ms) are gathered into exactly
// the next load, which starts the moment the first ends; then nothing more.
func TestQueueGathersWhileInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(t, "p:{id}")
		r.loadTime = 50 * time.Millisecond
		q := runQueue(t, r, newPacing(DefaultMinFullInterval))
		t0 := time.Now()
		q.add(payload{Hearth: 1, IDs: []string{"1"}}, time.Now())
		for _, id := range []string{"2", "3", "4", "5", "2"} {
			time.Sleep(9 * time.Millisecond)
			q.add(payload{Hearth: 1, IDs: []string{id}}, time.Now())
		}
		time.Sleep(time.Second)
		synctest.Wait()
		r.mu.Lock()
		defer r.mu.Unlock()
		want := []call{{t0, []string{"1"}}, {t0.Add(50 * time.Millisecond), []string{"2", "3", "4", "5"}}}
		if !sameCalls(r.calls, want) {
			t.Errorf("loads %v, want %v", r.calls, want)
		}
	})
}

// TestQueueGathersUnderSustainedChange: at 2,500 changes a second with
// loads of 1 ms, natural batching alone would load two members at a time;
// once a load of more than one runs and more arrive, the next waits the
// gather wait from its first member's arrival (testGather), so loads carry
// a dozen. Changes a load apart or more are still loaded the
// moment they arrive, and so is a change after the flood.
func TestQueueGathersUnderSustainedChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(t, "p:{id}")
		r.loadTime = time.Millisecond
		q := runQueue(t, r, newPacing(DefaultMinFullInterval))
		sent := map[string]time.Time{}
		change := func(id string) {
			sent[id] = time.Now()
			q.add(payload{Hearth: 1, IDs: []string{id}}, time.Now())
		}
		// Spaced 3 ms: each goes at once, one per load.
		for i := range 5 {
			change("s" + strconv.Itoa(i))
			time.Sleep(3 * time.Millisecond)
		}
		// The flood: 250 changes 0.4 ms apart.
		for i := range 250 {
			change(strconv.Itoa(i))
			time.Sleep(400 * time.Microsecond)
		}
		time.Sleep(time.Second)
		change("after")
		time.Sleep(time.Second)
		synctest.Wait()
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, id := range []string{"s0", "s1", "s2", "s3", "s4", "0", "after"} {
			if got := r.loads[id]; len(got) != 1 || !got[0].Equal(sent[id]) {
				t.Errorf("change %s loaded at %v, want once, the moment it arrived (%v)", id, got, sent[id])
			}
		}
		loaded, big, worst := 0, 0, time.Duration(0)
		for _, c := range r.calls {
			loaded += len(c.members)
			if len(c.members) >= 10 {
				big++
			}
			for _, m := range c.members {
				worst = max(worst, c.at.Sub(sent[m]))
			}
		}
		if loaded != 5+250+1 {
			t.Fatalf("%d members loaded, want 256, each once", loaded)
		}
		// 5 single loads, the flood's first two (1, then what arrived
		// during it), then loads of about 13 (5 ms at 0.4 ms, plus the load
		// in flight), the one after.
		if n := len(r.calls); n > 5+2+250/10+1 {
			t.Errorf("%d loads for 256 changes, want at most %d: the flood was not gathered", n, 5+2+250/10+1)
		}
		if big < 15 {
			t.Errorf("%d loads of 10 members or more, want at least 15", big)
		}
		if worst > testGather+r.loadTime {
			t.Errorf("a change waited %v before its load, want at most the gather wait + one load in flight (%v)", worst, testGather+r.loadTime)
		}
	})
}

// TestQueueGatherZero: with notify.gather's wait at zero (what the tests
// above run with five), the same flood is loaded as natural batching alone
// loads it: what arrived during a load of 1 ms, about two members at a
// time, none of them held back.
func TestQueueGatherZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(t, "p:{id}")
		r.loadTime = time.Millisecond
		q := runQueueGather(t, r, newPacing(DefaultMinFullInterval), 0, 0, 100)
		sent := map[string]time.Time{}
		for i := range 250 {
			id := strconv.Itoa(i)
			sent[id] = time.Now()
			q.add(payload{Hearth: 1, IDs: []string{id}}, time.Now())
			time.Sleep(400 * time.Microsecond)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		r.mu.Lock()
		defer r.mu.Unlock()
		loaded, worst := 0, time.Duration(0)
		for _, c := range r.calls {
			loaded += len(c.members)
			for _, m := range c.members {
				worst = max(worst, c.at.Sub(sent[m]))
			}
		}
		if loaded != 250 {
			t.Fatalf("%d members loaded, want 250, each once", loaded)
		}
		if n := len(r.calls); n < 250/3 {
			t.Errorf("%d loads for 250 changes 0.4 ms apart with no gather wait, want at least %d (about two members each)", n, 250/3)
		}
		if worst > r.loadTime {
			t.Errorf("a change waited %v before its load, want at most one load in flight (%v)", worst, r.loadTime)
		}
	})
}

// TestQueueBatchCap: seven changes gathered during a load are loaded at most
// batch (3) at a time, the earliest changed first, one load right after the
// other.
func TestQueueBatchCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(t, "p:{id}")
		r.loadTime = 50 * time.Millisecond
		q := runQueueWith(t, r, newPacing(DefaultMinFullInterval), 0, 3)
		t0 := time.Now()
		q.add(payload{Hearth: 1, IDs: []string{"1"}}, time.Now())
		// Changed in the order 8, 7, …, 2: the earliest go first.
		for id := 8; id >= 2; id-- {
			time.Sleep(time.Millisecond)
			q.add(payload{Hearth: 1, IDs: []string{strconv.Itoa(id)}}, time.Now())
		}
		time.Sleep(time.Second)
		synctest.Wait()
		r.mu.Lock()
		defer r.mu.Unlock()
		ms := 50 * time.Millisecond
		want := []call{{t0, []string{"1"}}, {t0.Add(ms), []string{"6", "7", "8"}}, {t0.Add(2 * ms), []string{"3", "4", "5"}}, {t0.Add(3 * ms), []string{"2"}}}
		if !sameCalls(r.calls, want) {
			t.Errorf("loads %v, want %v", r.calls, want)
		}
	})
}

// TestQueuePendingBoundInFlight: more than MaxPendingChanges distinct
// members arriving during one load become one full refresh right after it,
// not 10,000 members' loads.
func TestQueuePendingBoundInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(t, "p:{id}")
		r.loadTime = 50 * time.Millisecond
		q := runQueue(t, r, newPacing(DefaultMinFullInterval))
		t0 := time.Now()
		q.add(payload{Hearth: 1, IDs: []string{"0"}}, time.Now())
		time.Sleep(time.Millisecond)
		ids := make([]string, MaxPendingChanges+1)
		for i := range ids {
			ids[i] = strconv.Itoa(i + 1)
		}
		q.add(payload{Hearth: 1, IDs: ids}, time.Now())
		q.mu.Lock()
		if n := len(q.pending); n != 0 || !q.all {
			t.Errorf("during the load: %d pending, full refresh wanted %v; want 0 and true", n, q.all)
		}
		q.mu.Unlock()
		time.Sleep(time.Second)
		synctest.Wait()
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.calls) != 1 || len(r.fulls) != 1 || !r.fulls[0].Equal(t0.Add(50*time.Millisecond)) {
			t.Errorf("%d member loads, full refreshes at %v; want the first load, then one full refresh when it ended (%v)", len(r.calls), r.fulls, t0.Add(50*time.Millisecond))
		}
	})
}

// sameCalls reports whether got is want (members compared as sets).
func sameCalls(got, want []call) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		a, b := slices.Clone(got[i].members), slices.Clone(want[i].members)
		slices.Sort(a)
		slices.Sort(b)
		if !got[i].at.Equal(want[i].at) || !slices.Equal(a, b) {
			return false
		}
	}
	return true
}

// TestPacingSurvivesRestart: the listeners a reload starts build new queues;
// the declaration's pacing carries over, so the new session's full refresh
// waits for the rest of MinFullInterval instead of running at once.
func TestPacingSurvivesRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRecorder(t, "p:{id}")
		c := &Listeners{w: r, m: newMetrics(prometheus.NewRegistry()), paces: map[string]*pacing{},
			opts: Options{MinFullInterval: DefaultMinFullInterval, DSNs: map[string]string{"db": "postgres://u@127.0.0.1/db"},
				Now: time.Now}}
		specs := []*warmer.Spec{{Name: "p", Template: r.spec.Template, Source: "db", Notify: "ch", Coalesce: 20 * time.Millisecond}}
		for range 3 { // three sessions, a second apart
			ls, err := c.build(specs)
			if err != nil {
				t.Fatal(err)
			}
			q := ls[0].queues[0]
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); q.run(ctx) }()
			q.full()
			time.Sleep(time.Second)
			cancel()
			<-done
		}
		ls, err := c.build(specs)
		if err != nil {
			t.Fatal(err)
		}
		q := ls[0].queues[0]
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go q.run(ctx)
		q.full()
		time.Sleep(15 * time.Second)
		synctest.Wait()
		r.mu.Lock()
		defer r.mu.Unlock()
		spacedAtLeast(t, "full refresh", r.fulls, DefaultMinFullInterval)
		if len(r.fulls) != 2 {
			t.Errorf("%d full refreshes over four sessions in 18 s, want 2", len(r.fulls))
		}
	})
}

// TestPacerGCRA: the bucket admits burst loads at once, then one per
// interval, and forgets a key once its bucket is full again.
func TestPacerGCRA(t *testing.T) {
	p := newPacer(time.Second, 3)
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		if d := p.due("k"); d.After(t0) {
			t.Fatalf("load %d of the burst due at %v, want now", i, d)
		}
		p.take("k", t0)
	}
	if d := p.due("k"); !d.Equal(t0.Add(time.Second)) {
		t.Errorf("after the burst due at %v, want one interval later", d.Sub(t0))
	}
	p.sweep(t0.Add(10 * time.Second))
	if len(p.tat) != 0 {
		t.Errorf("a full bucket still kept: %v", p.tat)
	}
}

func TestParsePayload(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{`{"hearth":1,"ts":1,"ids":["1","2"]}`, true},
		{`{"hearth":1,"ts":1,"all":true}`, true},
		{`{"hearth":1,"ts":1e999,"ids":["1"]}`, false},
		{`{"hearth":1,"ts":"NaN","ids":["1"]}`, false},
		{`{"hearth":1,"ids":[null]}`, true}, // null decodes as "", which the template rejects
		{`{"hearth":1}`, false},
		{`{"hearth":"1","ids":["1"]}`, false},
		{`[]`, false},
		{``, false},
		{`{"hearth":1,"ids":["1"],"table":"x"}`, false},             // a member Hearth does not send
		{`{"hearth":1,"ids":["1"]} {"hearth":1,"all":true}`, false}, // trailing data
		{`{"hearth":1,"ids":["1"],"ids":["2"]}`, false},             // a name twice: which one?
		{`{"Hearth":1,"IDS":["1"]}`, false},                         // names match exactly
	} {
		_, err := parsePayload(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("parsePayload(%q) error %v, want ok %v", tc.in, err, tc.ok)
		}
	}
}

// FuzzParsePayload: any notification payload (PostgreSQL allows up to 8,000
// bytes) is parsed without a panic, and what is accepted is Hearth's format.
func FuzzParsePayload(f *testing.F) {
	for _, s := range []string{`{"hearth":1,"ts":1,"ids":["1","2"]}`, `{"hearth":1,"ts":1,"all":true}`, `{"hearth":1,"ids":[null]}`, `hello`, `{"hearth":1e999}`, ``} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := parsePayload(s)
		if err != nil {
			return
		}
		if p.Hearth != 1 || (!p.All && len(p.IDs) == 0) {
			t.Fatalf("accepted %q as %+v", s, p)
		}
	})
}

// TestLifecycle: Run runs once at a time and returns when its context ends;
// Apply between runs is what the next Run listens for; after Close, Run
// refuses to start.
func TestLifecycle(t *testing.T) {
	tmpl, err := keytmpl.Parse("p:{id}")
	if err != nil {
		t.Fatal(err)
	}
	spec := &warmer.Spec{Name: "p", Template: tmpl, Source: "db", Notify: "ch"}
	c, err := New(specOnly{spec}, Options{Specs: []*warmer.Spec{spec}, DSNs: map[string]string{"db": "postgres://u@127.0.0.1:1/db"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	testenv.Eventually(t, 10*time.Second, "the listener started", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.run != nil && len(c.run.listeners) == 1
	})
	if err := c.Run(context.Background()); !errors.Is(err, ErrRunning) {
		t.Errorf("a second Run: %v, want ErrRunning", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	moved := *spec
	moved.Notify = "ch2"
	if err := c.Apply([]*warmer.Spec{&moved}); err != nil {
		t.Fatal(err)
	}
	ls, err := c.build(c.specs)
	if err != nil || len(ls) != 1 || ls[0].channels["ch2"] == nil {
		t.Errorf("after Apply while stopped, the next Run would listen on %v (%v), want ch2", ls, err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Run after Close: %v, want ErrClosed", err)
	}
}
