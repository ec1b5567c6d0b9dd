package warmer_test

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/sourcetest"
	"github.com/hearth-dev/hearth/internal/testenv"
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

// staticSource answers every member with "v:<member>".
func staticSource() *sourcetest.Fake {
	f := sourcetest.New("s")
	f.Answer(func(m string) (warmer.Result, bool) { return warmer.Result{Value: []byte("v:" + m)}, true })
	return f
}

type keyList []string

func (l keyList) EachTopKey(_ context.Context, _ time.Duration, n int, fn func(string)) error {
	for _, k := range l[:min(n, len(l))] {
		fn(k)
	}
	return nil
}

// TestPrewarmNeverWritesNamespaceKeys is the defence behind validation: even
// with a declaration whose template reaches into Hearth's namespace (built
// here without config, which rejects it), access-log keys naming Hearth's own
// keys are skipped, counted and never written, and the other keys still load.
func TestPrewarmNeverWritesNamespaceKeys(t *testing.T) {
	rd := testenv.Redis(t)
	ctx := context.Background()
	ns := rd.Prefix + "ns"
	spec := func(name, key string) *warmer.Spec {
		tpl, err := warmer.ParseTemplate(key)
		if err != nil {
			t.Fatal(err)
		}
		return &warmer.Spec{Name: name, Template: tpl.WithNamespace(ns), Source: "s", TTL: time.Minute,
			Interval: 30 * time.Second, LoadTimeout: time.Second, Members: []string{"seed"}, MaxMembers: 100,
			BatchSize: 10, NegativeTTL: time.Second, MaxValueBytes: 1 << 10}
	}
	reg := prometheus.NewRegistry()
	w, err := warmer.New(warmer.Options{
		Store: &warmer.RedisStore{Client: rd.Client}, Sources: map[string]warmer.Source{"s": staticSource()},
		Specs:              []*warmer.Spec{spec("inside", ns+"{id}"), spec("app", rd.Prefix+"app:{id}")},
		MaxConcurrentLoads: 4, Registerer: reg, Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	log := keyList{ns + ":warm", ns + ":fence", ns, ns + ":access:1700000000", rd.Prefix + "app:1", rd.Prefix + "app:2"}
	rep, err := w.Prewarm(ctx, warmer.PrewarmOptions{AccessLog: log, TopN: 100, Window: time.Hour, Concurrency: 2, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rep.Skipped[warmer.SkipNamespace], 4; got != want {
		t.Errorf("skipped[namespace] = %d, want %d: %v", got, want, rep.Skipped)
	}
	if got := promtest.Value(t, reg, "hearth_prewarm_keys_total", "outcome", "skipped_"+warmer.SkipNamespace); got != 4 {
		t.Errorf("hearth_prewarm_keys_total{outcome=skipped_namespace} = %g, want 4", got)
	}
	for _, k := range log[:4] {
		if n := rd.Client.Exists(ctx, k).Val(); n != 0 {
			t.Errorf("%s was written: Hearth's own key overwritten from the access log", k)
		}
	}
	var written []string
	for _, k := range []string{rd.Prefix + "app:1", rd.Prefix + "app:2"} {
		if rd.Client.Get(ctx, k).Val() != "" {
			written = append(written, k)
		}
	}
	if !slices.Equal(written, []string(log[4:])) {
		t.Errorf("application keys written = %q, want %q", written, log[4:])
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
