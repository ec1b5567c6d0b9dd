package behind_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/behind"
	"github.com/hearth-dev/hearth/internal/promtest"
)

// clock is a hand-moved time.
type clock struct{ t time.Time }

func (c *clock) now() time.Time           { return c.t }
func (c *clock) advance(d time.Duration)  { c.t = c.t.Add(d) }
func (c *clock) at(d time.Duration) int64 { return c.t.Add(d).UnixNano() }

// one is n batches of one member each.
func one(n int) (out [][]string) {
	for range n {
		out = append(out, []string{"m"})
	}
	return out
}

func setup() (*behind.Metrics, *prometheus.Registry, *bytes.Buffer, *clock) {
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	c := &clock{t: time.Unix(1_000_000, 0)}
	return behind.NewMetrics(promauto.With(reg), zerolog.New(&logs), c.now), reg, &logs, c
}

// A run whose rate so far would write its last batches after their keys
// expire is logged, counted once and published with its shortfall; when its
// rate recovers it is logged as caught up, and its late writes are what the
// gauge holds after it ends.
func TestProjectedShortfall(t *testing.T) {
	m, reg, logs, c := setup()
	due := make([]int64, 10)
	for i := range due {
		due[i] = c.at(5 * time.Second) // every key expires 5 s from now
	}
	r := m.Watch("f", one(10), due, c.now())
	r.Begun(0)
	c.advance(2 * time.Second) // one member in 2 s: 9 more take 18 s
	r.Completed(0, 1, true)
	if got := promtest.Value(t, reg, "hearth_refresh_behind_total", "family", "f"); got != 1 {
		t.Errorf("behind_total = %g, want 1", got)
	}
	if got := promtest.Value(t, reg, "hearth_refresh_behind_seconds", "family", "f"); got != 15 {
		t.Errorf("behind_seconds = %g, want 15 (last batch at +20 s, due at +5 s)", got)
	}
	if !strings.Contains(logs.String(), "falling behind") {
		t.Errorf("no falling-behind warning in %q", logs.String())
	}
	for i := 1; i < 10; i++ { // the rest a second each: caught up, counted once
		r.Begun(i)
		c.advance(time.Second)
		r.Completed(i, 1, true)
	}
	r.Finish()
	if got := promtest.Value(t, reg, "hearth_refresh_behind_total", "family", "f"); got != 1 {
		t.Errorf("behind_total = %g, want 1 (one run)", got)
	}
	if !strings.Contains(logs.String(), "caught up") {
		t.Errorf("no caught-up line in %q", logs.String())
	}
	// The last batch completed 2 + 9×1 s = 11 s after its keys' 5 s.
	if got := promtest.Value(t, reg, "hearth_refresh_behind_seconds", "family", "f"); got != 6 {
		t.Errorf("behind_seconds after the run = %g, want 6 (its latest write's lateness)", got)
	}
}

// A run that keeps its keys' TTLs is neither counted nor logged; keys that
// had expired before it began (no order saves them) do not make it behind.
func TestOnTimeAndExpiredAtStart(t *testing.T) {
	m, reg, logs, c := setup()
	due := []int64{c.at(-time.Second), c.at(time.Hour), 0}
	r := m.Watch("f", one(3), due, c.now())
	for i := range 3 {
		r.Begun(i)
		c.advance(behind.Every)
		r.Completed(i, 1, true)
	}
	r.Finish()
	if got := promtest.Sum(t, reg, "hearth_refresh_behind_total"); got != 0 {
		t.Errorf("behind_total = %g, want 0", got)
	}
	if got := promtest.Value(t, reg, "hearth_refresh_behind_seconds", "family", "f"); got != 0 {
		t.Errorf("behind_seconds = %g, want 0", got)
	}
	if logs.Len() != 0 {
		t.Errorf("logged %q for a run on time", logs.String())
	}
}

// Overran counts a run longer than its interval, and only such a run.
func TestOverran(t *testing.T) {
	m, reg, logs, _ := setup()
	m.Overran("f", 9*time.Second, 10*time.Second, 5)
	m.Overran("f", 10*time.Second, 0, 5) // no interval: a one-off run
	if got := promtest.Sum(t, reg, "hearth_refresh_overruns_total"); got != 0 {
		t.Errorf("overruns = %g, want 0", got)
	}
	m.Overran("f", 12*time.Second, 10*time.Second, 5)
	if got := promtest.Value(t, reg, "hearth_refresh_overruns_total", "family", "f"); got != 1 {
		t.Errorf("overruns = %g, want 1", got)
	}
	if !strings.Contains(logs.String(), `"overrun_ms":2000`) {
		t.Errorf("overrun not logged with its 2 s: %q", logs.String())
	}
}

// A family's catch-up and its scheduled run can overlap: the gauge is the
// worse of the two, so a run on time does not hide a catch-up falling
// behind by starting or projecting after it; once none runs, it is the
// last one's actual figure.
func TestOverlappingRunsShowTheWorse(t *testing.T) {
	m, reg, _, c := setup()
	gauge := func() float64 { return promtest.Value(t, reg, "hearth_refresh_behind_seconds", "family", "f") }
	due := make([]int64, 10)
	for i := range due {
		due[i] = c.at(5 * time.Second)
	}
	catchUp := m.WatchCatchUp("f", one(10), due, c.now())
	catchUp.Begun(0)
	c.advance(2 * time.Second)
	catchUp.Completed(0, 1, true)
	if got := gauge(); got != 15 {
		t.Fatalf("catch-up alone: behind_seconds = %g, want 15", got)
	}

	later := make([]int64, 10)
	for i := range later {
		later[i] = c.at(time.Minute)
	}
	run := m.Watch("f", one(10), later, c.now())
	if got := gauge(); got != 15 {
		t.Errorf("a run starting beside the catch-up set behind_seconds to %g, want the catch-up's 15", got)
	}
	run.Begun(0)
	c.advance(time.Second)
	run.Completed(0, 1, true) // on time: 9 more at 1/s, due in 59 s
	if got := gauge(); got != 15 {
		t.Errorf("a run on time beside the catch-up: behind_seconds = %g, want the catch-up's 15", got)
	}

	catchUp.Finish() // its one batch written in time: late 0
	if got := gauge(); got != 0 {
		t.Errorf("catch-up finished, run on time: behind_seconds = %g, want 0", got)
	}
	run.Begun(1)
	c.advance(3 * time.Minute) // the run's second batch lands 121 s past its TTL end (62 s)
	run.Completed(1, 1, true)
	if got := gauge(); got <= 0 {
		t.Errorf("a run projecting a shortfall alone: behind_seconds = %g, want > 0", got)
	}
	run.Finish()
	if got := gauge(); got != 121 {
		t.Errorf("after the last run: behind_seconds = %g, want its lateness, 121", got)
	}
}
