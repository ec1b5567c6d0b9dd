package warmer_test

import (
	"math"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/warmer"
)

// TestJitteredTTLNeverCollapses: whatever reaches a Spec (config rejects
// both), a NaN or infinite jitter and a TTL near the Duration limit give the
// TTL itself, never a negative or 1 ms expiry.
func TestJitteredTTLNeverCollapses(t *testing.T) {
	const huge = 2562047 * time.Hour
	for _, tc := range []struct {
		name   string
		ttl    time.Duration
		jitter float64
		r      float64
		want   time.Duration
	}{
		{"NaN jitter", time.Minute, math.NaN(), 0.9, time.Minute},
		{"+Inf jitter", time.Minute, math.Inf(1), 0.9, time.Minute},
		{"-Inf jitter", time.Minute, math.Inf(-1), 0.1, time.Minute},
		{"jitter 1.5", time.Minute, 1.5, 0, time.Minute},
		{"overflowing product", huge, 0.2, 1, huge},
		{"valid jitter low", time.Minute, 0.2, 0, 54 * time.Second},
		{"valid jitter high", time.Minute, 0.2, 1, 66 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &warmer.Spec{TTL: tc.ttl, Jitter: tc.jitter}
			if got := s.JitteredTTL(tc.r); got != tc.want {
				t.Errorf("JitteredTTL(%g) with ttl %s, jitter %g = %s, want %s", tc.r, tc.ttl, tc.jitter, got, tc.want)
			}
		})
	}
}
