package daemon

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hearth-dev/hearth/internal/testenv"
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
	tmpl, err := warmer.ParseTemplate("p:{id}")
	if err != nil {
		t.Fatal(err)
	}
	m := newChangeMetrics(prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := &listener{w: specOnly{&warmer.Spec{Name: "p", Template: tmpl}}, m: m, ctx: ctx, leading: func() bool { return false }, now: time.Now}
	q := &queue{name: "p", coalesce: time.Hour, batch: 100, l: l, pending: map[string]int64{}}
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
	} {
		_, err := parsePayload(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("parsePayload(%q) error %v, want ok %v", tc.in, err, tc.ok)
		}
	}
}

// TestFullRefreshesSpaced: a full refresh asked for sooner than
// MinFullInterval after the last one waits for the rest of the interval (a
// flapping connection must not reload the origin back to back).
func TestFullRefreshesSpaced(t *testing.T) {
	tmpl, err := warmer.ParseTemplate("p:{id}")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	now := time.Unix(1000, 0)
	l := &listener{w: specOnly{&warmer.Spec{Name: "p", Template: tmpl}}, m: newChangeMetrics(prometheus.NewRegistry()), ctx: ctx,
		leading: func() bool { return false }, now: func() time.Time { return now }}
	q := &queue{name: "p", coalesce: 20 * time.Millisecond, minFull: time.Hour, batch: 100, l: l, pending: map[string]int64{}}
	q.full()
	testenv.Eventually(t, 10*time.Second, "the first full refresh done", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return !q.armed && !q.running && !q.lastFull.IsZero()
	})
	now = now.Add(time.Minute)
	q.full() // an hour's spacing: waits ~59 minutes
	q.add(payload{Hearth: 1, IDs: []string{"1"}}, now)
	time.Sleep(100 * time.Millisecond)
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.armed || !q.all || q.lastFull != time.Unix(1000, 0) {
		t.Errorf("armed %v, all %v, last full %v: want the second full refresh still waiting", q.armed, q.all, q.lastFull)
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
