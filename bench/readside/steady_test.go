package readside_test

import (
	"math"
	"testing"
	"time"
)

// TestSteadyWindow pins the steady-state rate's sample on hand-made load
// times: gaps are taken within a segment only, a second load of one expiry
// is a gap (and a repeat), and windows shortened by an early refresh score
// above 1.
func TestSteadyWindow(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(s ...float64) []time.Time {
		var ts []time.Time
		for _, x := range s {
			ts = append(ts, t0.Add(time.Duration(x*float64(time.Second))))
		}
		return ts
	}
	for _, tc := range []struct {
		name      string
		starts    []time.Time
		flushAt   time.Time
		intervals int64
		span      time.Duration
		repeats   int64
		steady    float64
	}{
		// One load per TTL, the flush's segment starting with its own load.
		{"flush", at(0, 10, 20, 29.5, 39.5, 49.5), t0.Add(29 * time.Second), 4, 40 * time.Second, 0, 1},
		// A second load 200 ms after the flush's: one more gap, short.
		{"repeat", at(0, 10, 20, 29.5, 29.7, 39.5, 49.5), t0.Add(29 * time.Second), 5, 40 * time.Second, 1, 1.25},
		// Early refreshes 500 ms before each expiry: 2 gaps in 19 s.
		{"early", at(19, 9.5, 0), time.Time{}, 2, 19 * time.Second, 0, 20.0 / 19},
		{"one load", at(3), time.Time{}, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r result
			r.gaps(tc.starts, tc.flushAt)
			if r.intervals != tc.intervals || r.span != tc.span || r.repeats != tc.repeats {
				t.Errorf("gaps: intervals %d, span %s, repeats %d; want %d, %s, %d", r.intervals, r.span, r.repeats, tc.intervals, tc.span, tc.repeats)
			}
			if tc.repeats > 0 && (len(r.repeatAt) != 1 || r.repeatAt[0] != 700*time.Millisecond) {
				t.Errorf("repeatAt = %v, want [700ms] (from the FLUSHDB)", r.repeatAt)
			}
			if got := r.steadyWindow(); math.Abs(got-tc.steady) > 1e-9 {
				t.Errorf("steadyWindow = %v, want %v", got, tc.steady)
			}
		})
	}
}
