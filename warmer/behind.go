package warmer

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// A run that cannot keep up writes the oldest writes first (oldestFirst) and
// projects, logs and counts its shortfall (runWatch; docs/operations.md).

// ordered is a run's batches in the order they start, and for each the
// earliest TTL end among its members (unix nanoseconds: last write plus the
// declaration's shortest jittered TTL; 0 when none of them was written yet).
type ordered struct {
	batches [][]string
	due     []int64
	// at is where each batch starts in the members list.
	at []int
}

// oldestFirst cuts members into batches and orders the batches by the oldest
// last write among their members, never written first, ties in member order:
// a sort of the batches, not of the members, whose batches were written
// together by the previous run.
func (w *Warmer) oldestFirst(spec *Spec, st *declState, members []string) ordered {
	batches := spec.Batches(members)
	oldest := make([]int64, len(batches)) // 0: a member never written
	due := make([]int64, len(batches))
	at := make([]int, len(batches))
	ttl := int64(spec.MinTTL())
	sorted := true
	next := 0
	for i, b := range batches {
		at[i] = next
		next += len(b)
		o, d := int64(-1), int64(0)
		st.mu.Lock() // per batch: writers of other batches are not held for long
		// The members just declared (the usual case) are read by position.
		okAt := []int64(nil)
		if sameSlice(st.declared, members) {
			okAt = st.okAt[at[i] : at[i]+len(b)]
		}
		for j, m := range b {
			var t int64
			if okAt != nil {
				t = okAt[j]
			} else {
				t = st.lastSuccess(m)
			}
			if o < 0 || t < o {
				o = t
			}
			if t != 0 && (d == 0 || t+ttl < d) {
				d = t + ttl
			}
		}
		st.mu.Unlock()
		oldest[i], due[i] = max(o, 0), d
		if i > 0 && oldest[i] < oldest[i-1] {
			sorted = false
		}
	}
	if sorted {
		return ordered{batches: batches, due: due, at: at}
	}
	idx := make([]int, len(batches))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		return cmp.Or(cmp.Compare(oldest[a], oldest[b]), cmp.Compare(a, b))
	})
	out := ordered{batches: make([][]string, len(batches)), due: make([]int64, len(batches)), at: make([]int, len(batches))}
	for j, i := range idx {
		out.batches[j], out.due[j], out.at[j] = batches[i], due[i], at[i]
	}
	return out
}

// behindEvery is how often, at most, a run's projection is recomputed (on a
// batch's completion): each costs a pass over the batches left.
const behindEvery = time.Second

// runWatch follows one run's progress against its keys' TTLs.
type runWatch struct {
	w     *Warmer
	spec  *Spec
	start time.Time // when the batches began
	due   []int64   // per batch in run order, 0: no deadline (see watchRun)
	ends  []int     // members in batches 0..i
	// expired is how many members' TTLs had already run out when the run
	// began (a previous run's shortfall, or values kept by stale extension):
	// no order saves them, and they are reported, not projected.
	expired int

	mu        sync.Mutex
	started   int // batches started
	done      int // members in completed batches
	checked   time.Time
	behind    bool          // the last projection said keys will expire
	counted   bool          // this run was counted behind
	projected time.Duration // the last projected shortfall
	late      time.Duration // the worst lateness of a completed batch
}

// watchRun starts watching a run of the batches in o, which begin at start.
func (w *Warmer) watchRun(spec *Spec, o ordered, start time.Time) *runWatch {
	rw := &runWatch{w: w, spec: spec, start: start, due: o.due, ends: make([]int, len(o.batches)), checked: start}
	n := 0
	for i, b := range o.batches {
		n += len(b)
		rw.ends[i] = n
		if d := o.due[i]; d != 0 && d <= start.UnixNano() {
			rw.expired += len(b)
			rw.due[i] = 0
		}
	}
	w.metrics.behindSeconds.WithLabelValues(spec.Name).Set(0)
	// From 0, so that the first increase shows in a rate (alerts on it).
	w.metrics.behind.WithLabelValues(spec.Name)
	w.metrics.overruns.WithLabelValues(spec.Name)
	return rw
}

// begun notes that batch i was started.
func (rw *runWatch) begun(i int) {
	rw.mu.Lock()
	rw.started = i + 1
	rw.mu.Unlock()
}

// completed notes that batch i (of n members) finished, having written some
// of its keys or not, and recomputes the projection when it is due.
func (rw *runWatch) completed(i, n int, wrote bool) {
	now := rw.w.now()
	rw.mu.Lock()
	defer rw.mu.Unlock()
	rw.done += n
	if d := rw.due[i]; d != 0 && wrote {
		rw.late = max(rw.late, time.Duration(now.UnixNano()-d))
	}
	if now.Sub(rw.checked) < behindEvery {
		return
	}
	rw.checked = now
	rw.project(now)
}

// project estimates, from the run's rate so far (members done / time
// elapsed), when each batch not yet started will be done, and how far past
// its earliest TTL end the latest one will be. Call with rw.mu held.
func (rw *runWatch) project(now time.Time) {
	elapsed := now.Sub(rw.start)
	if rw.done == 0 || elapsed <= 0 {
		return
	}
	rate := float64(rw.done) / elapsed.Seconds() // members per second
	short, first := time.Duration(0), int64(0)
	for i := rw.started; i < len(rw.due); i++ {
		if rw.due[i] == 0 {
			continue
		}
		if first == 0 || rw.due[i] < first {
			first = rw.due[i]
		}
		eta := now.UnixNano() + int64(float64(rw.ends[i]-rw.done)/rate*1e9)
		short = max(short, time.Duration(eta-rw.due[i]))
	}
	rw.projected = short
	rw.w.metrics.behindSeconds.WithLabelValues(rw.spec.Name).Set(short.Seconds())
	switch {
	case short > 0 && !rw.behind:
		rw.behind = true
		rw.count()
		rw.w.log.Warn().Str("family", rw.spec.Name).Dur("shortfall_ms", short).
			Int("members_done", rw.done).Int("members_left", rw.ends[len(rw.ends)-1]-rw.done).
			Float64("keys_per_s", rate).Dur("elapsed_ms", elapsed).Dur("first_expiry_in_ms", time.Duration(first-now.UnixNano())).
			Int("expired_at_start", rw.expired).
			Msg("refresh run falling behind: at its rate so far, keys will expire before it writes them (the oldest are written first)")
	case short <= 0 && rw.behind:
		rw.behind = false
		rw.w.log.Info().Str("family", rw.spec.Name).Int("members_done", rw.done).Float64("keys_per_s", rate).
			Msg("refresh run caught up: at its rate now, every key left is written before its TTL runs out")
	}
}

// count counts the run as behind, once. Call with rw.mu held.
func (rw *runWatch) count() {
	if !rw.counted {
		rw.counted = true
		rw.w.metrics.behind.WithLabelValues(rw.spec.Name).Inc()
	}
}

// finish publishes what the run did: the gauge holds, until the next run's
// first projection, how far past its TTL end the latest batch was written
// (0 when every one was in time), and a run that wrote keys late without
// being projected to is counted and logged too.
func (rw *runWatch) finish() {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	late := max(rw.late, 0)
	rw.w.metrics.behindSeconds.WithLabelValues(rw.spec.Name).Set(late.Seconds())
	if late > 0 {
		if !rw.counted {
			rw.w.log.Warn().Str("family", rw.spec.Name).Dur("late_ms", late).Int("expired_at_start", rw.expired).
				Msg("refresh run wrote keys after their TTLs ran out")
		}
		rw.count()
	}
}

func newBehindMetrics(f promauto.Factory, m *metrics) {
	m.behind = f.NewCounterVec(prometheus.CounterOpts{
		Name: "hearth_refresh_behind_total",
		Help: "Refresh runs that, at their progress rate, would write (or wrote) keys after their TTLs ran out.",
	}, []string{"family"})
	m.behindSeconds = f.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hearth_refresh_behind_seconds",
		Help: "How far past their TTL end the running refresh would write its latest keys at its rate so far (the last run's actual figure after it ended); 0 when on time.",
	}, []string{"family"})
	m.overruns = f.NewCounterVec(prometheus.CounterOpts{
		Name: "hearth_refresh_overruns_total",
		Help: "Scheduled refresh runs that took longer than their declaration's interval.",
	}, []string{"family"})
}
