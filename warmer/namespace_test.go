package warmer_test

import (
	"math"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/warmer"
)

func TestTemplateCanName(t *testing.T) {
	for _, tc := range []struct {
		key, pattern string
		maxLen       int
		want         bool
	}{
		{key: "hearth:{id}", want: true},
		{key: "hearth:fence", want: true},
		{key: "hearth", want: true},
		{key: "hearth:x:{id}:y", want: true},
		{key: "hea{id}", want: true},                       // member "rth" makes hearth, "rth:warm" hearth:warm
		{key: "h{id}", want: true},                         // member "earth:warm"
		{key: "{id}:warm", want: true},                     // member "hearth"
		{key: "{id}:fence", pattern: "[a-z]+", want: true}, // member "hearth", suffix ":fence"
		{key: "hearth{id}", pattern: ":[a-z]+", want: true},
		{key: "h{id}", pattern: "(?i)EARTH:.*", want: true}, // case folding counts
		{key: "hearthstone:{id}"},
		{key: "hearth-{id}"},
		{key: "Hearth:{id}"},
		{key: "app:hearth:{id}"},
		{key: "hearth-fence"},
		{key: "h{id}", pattern: "[0-9]+"},
		{key: "{id}:warm", pattern: "[0-9]+"},
		{key: "hea{id}", pattern: "rt[a-g]+"},
		{key: "h{id}", maxLen: 4},              // neither "earth" nor "earth:" fits
		{key: "h{id}", maxLen: 5, want: true},  // "earth": the key hearth itself
		{key: "hearth{id}", pattern: "[a-z]+"}, // ':' never begins a member
	} {
		t.Run(tc.key+" "+tc.pattern, func(t *testing.T) {
			tpl, err := warmer.ParseTemplate(tc.key)
			if err != nil {
				t.Fatal(err)
			}
			if tpl, err = tpl.WithMemberRules(tc.pattern, tc.maxLen); err != nil {
				t.Fatal(err)
			}
			if got := tpl.CanName("hearth"); got != tc.want {
				t.Errorf("CanName(hearth) = %v, want %v", got, tc.want)
			}
		})
	}
}

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
