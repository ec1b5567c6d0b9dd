// Package behind follows a refresh run's progress against its keys' TTLs: it
// projects, from the run's rate so far, whether keys will expire before the
// run writes them, and logs, counts and publishes that shortfall (and a run
// that overran its interval) per family. docs/operations.md says what to do.
package behind

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/rs/zerolog"
)

// Every is how often, at most, a run's projection is recomputed (on a
// batch's completion): each costs a pass over the batches left.
const Every = time.Second

// Metrics are the falling-behind series of one registry.
type Metrics struct {
	behind   *prometheus.CounterVec
	seconds  *prometheus.GaugeVec
	overruns *prometheus.CounterVec
	log      zerolog.Logger
	now      func() time.Time

	// running holds, per family, each running run's latest figure: a
	// family's catch-up and its scheduled run can overlap, and the gauge is
	// the worse of the two, not whichever spoke last. Taken after a Run's
	// own lock, never before it.
	mu      sync.Mutex
	running map[string]map[*Run]time.Duration
}

// NewMetrics registers the series with f; runs log to log and read the time
// from now.
func NewMetrics(f promauto.Factory, log zerolog.Logger, now func() time.Time) *Metrics {
	return &Metrics{
		behind: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_refresh_behind_total",
			Help: "Refresh runs that, at their progress rate, would write (or wrote) keys after their TTLs ran out.",
		}, []string{"family"}),
		seconds: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_refresh_behind_seconds",
			Help: "How far past their TTL end the running refresh would write its latest keys at its rate so far (the worst of the family's runs and catch-ups running; once none runs, the last one's actual figure); 0 when on time.",
		}, []string{"family"}),
		overruns: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_refresh_overruns_total",
			Help: "Scheduled refresh runs that took longer than their declaration's interval.",
		}, []string{"family"}),
		log:     log,
		now:     now,
		running: map[string]map[*Run]time.Duration{},
	}
}

// publish records run r's figure d (its projected shortfall, or once it
// has finished its actual lateness) and sets its family's gauge: the worst
// figure of the family's running runs, or, when none is left running, the
// figure of the run that finished last.
func (m *Metrics) publish(r *Run, d time.Duration, finished bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	runs := m.running[r.family]
	if finished {
		delete(runs, r)
	} else {
		if runs == nil {
			runs = map[*Run]time.Duration{}
			m.running[r.family] = runs
		}
		runs[r] = d
	}
	if len(runs) == 0 {
		delete(m.running, r.family)
	} else {
		d = 0
		for _, v := range runs {
			d = max(d, v)
		}
	}
	m.seconds.WithLabelValues(r.family).Set(max(d, 0).Seconds())
}

// Overran counts and logs a scheduled run of family that took duration,
// longer than its interval; a run within its interval is not counted.
func (m *Metrics) Overran(family string, duration, interval time.Duration, members int) {
	over := duration - interval
	if interval <= 0 || over <= 0 {
		return
	}
	m.overruns.WithLabelValues(family).Inc()
	m.log.Warn().Str("family", family).Dur("overrun_ms", over).Dur("duration_ms", duration).
		Dur("interval_ms", interval).Int("members", members).
		Msg("refresh run overran its interval")
}

// Run follows one run's progress against its keys' TTLs.
type Run struct {
	m      *Metrics
	family string
	kind   string    // "catch-up" for a catch-up's batches, else "" (a run)
	start  time.Time // when the batches began
	due    []int64   // per batch in run order, 0: no deadline (see Watch)
	ends   []int     // members in batches 0..i
	// expired is how many members' TTLs had already run out when the run
	// began (a previous run's shortfall, or values kept by stale extension):
	// no order saves them, and they are reported, not projected.
	expired int

	mu      sync.Mutex
	started int // batches started
	done    int // members in completed batches
	checked time.Time
	behind  bool          // the last projection said keys will expire
	counted bool          // this run was counted behind
	late    time.Duration // the worst lateness of a completed batch
}

// Watch starts watching a run of family's batches, in the order they start;
// due[i] is the earliest TTL end among batch i's members (unix nanoseconds;
// 0 when none was written yet). The batches begin at start. Watch keeps due
// and changes it.
func (m *Metrics) Watch(family string, batches [][]string, due []int64, start time.Time) *Run {
	return m.watch(family, "", batches, due, start)
}

// WatchCatchUp is Watch for a catch-up's batches of family (the keys it found
// missing or about to expire, soonest first): it is projected, logged and
// counted as a run is, its log lines marked "run":"catch-up", so that a
// catch-up too slow for the TTLs it races is never a silent expiry either.
// Batches none of which has a deadline (a traffic-driven promotion) are not
// watched: there is nothing to project, and their end would reset the
// family's gauge over a real shortfall. It returns nil then, a Run that
// notes nothing.
func (m *Metrics) WatchCatchUp(family string, batches [][]string, due []int64, start time.Time) *Run {
	if !slices.ContainsFunc(due, func(d int64) bool { return d != 0 }) {
		return nil
	}
	return m.watch(family, "catch-up", batches, due, start)
}

func (m *Metrics) watch(family, kind string, batches [][]string, due []int64, start time.Time) *Run {
	r := &Run{m: m, family: family, kind: kind, start: start, due: due, ends: make([]int, len(batches)), checked: start}
	n := 0
	for i, b := range batches {
		n += len(b)
		r.ends[i] = n
		if d := due[i]; d != 0 && d <= start.UnixNano() {
			r.expired += len(b)
			r.due[i] = 0
		}
	}
	m.publish(r, 0, false)
	// From 0, so that the first increase shows in a rate (alerts on it).
	m.behind.WithLabelValues(family)
	m.overruns.WithLabelValues(family)
	return r
}

// Begun notes that batch i was started. Begun, Completed and Finish do
// nothing on a nil Run (an unwatched catch-up, see WatchCatchUp).
func (r *Run) Begun(i int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.started = i + 1
	r.mu.Unlock()
}

// Completed notes that batch i (of n members) finished, having written some
// of its keys or not, and recomputes the projection when it is due.
func (r *Run) Completed(i, n int, wrote bool) {
	if r == nil {
		return
	}
	now := r.m.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done += n
	if d := r.due[i]; d != 0 && wrote {
		r.late = max(r.late, time.Duration(now.UnixNano()-d))
	}
	if now.Sub(r.checked) < Every {
		return
	}
	r.checked = now
	r.project(now)
}

// project estimates, from the run's rate so far (members done / time
// elapsed), when each batch not yet started will be done, and how far past
// its earliest TTL end the latest one will be. Call with r.mu held.
func (r *Run) project(now time.Time) {
	elapsed := now.Sub(r.start)
	if r.done == 0 || elapsed <= 0 {
		return
	}
	rate := float64(r.done) / elapsed.Seconds() // members per second
	short, first := time.Duration(0), int64(0)
	for i := r.started; i < len(r.due); i++ {
		if r.due[i] == 0 {
			continue
		}
		if first == 0 || r.due[i] < first {
			first = r.due[i]
		}
		eta := now.UnixNano() + int64(float64(r.ends[i]-r.done)/rate*1e9)
		short = max(short, time.Duration(eta-r.due[i]))
	}
	r.m.publish(r, short, false)
	switch {
	case short > 0 && !r.behind:
		r.behind = true
		r.count()
		r.event(r.m.log.Warn()).Dur("shortfall_ms", short).
			Int("members_done", r.done).Int("members_left", r.ends[len(r.ends)-1]-r.done).
			Float64("keys_per_s", rate).Dur("elapsed_ms", elapsed).Dur("first_expiry_in_ms", time.Duration(first-now.UnixNano())).
			Int("expired_at_start", r.expired).
			Msg("refresh run falling behind: at its rate so far, keys will expire before it writes them (the oldest are written first)")
	case short <= 0 && r.behind:
		r.behind = false
		r.event(r.m.log.Info()).Int("members_done", r.done).Float64("keys_per_s", rate).
			Msg("refresh run caught up: at its rate now, every key left is written before its TTL runs out")
	}
}

// event starts a log line of this run: its family, and what it is when not
// a scheduled or requested run.
func (r *Run) event(e *zerolog.Event) *zerolog.Event {
	e = e.Str("family", r.family)
	if r.kind != "" {
		e = e.Str("run", r.kind)
	}
	return e
}

// count counts the run as behind, once. Call with r.mu held.
func (r *Run) count() {
	if !r.counted {
		r.counted = true
		r.m.behind.WithLabelValues(r.family).Inc()
	}
}

// Finish publishes what the run did: unless another run of the family is
// still running, the gauge holds, until the next run's first projection, how
// far past its TTL end the latest batch was written (0 when every one was in
// time), and a run that wrote keys late without being projected to is
// counted and logged too. Every watched run must be finished: until then it
// counts in its family's gauge.
func (r *Run) Finish() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	late := max(r.late, 0)
	r.m.publish(r, late, true)
	if late > 0 {
		if !r.counted {
			r.event(r.m.log.Warn()).Dur("late_ms", late).Int("expired_at_start", r.expired).
				Msg("refresh run wrote keys after their TTLs ran out")
		}
		r.count()
	}
}
