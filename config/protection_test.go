package config_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/sources/protect"
)

func TestSourceProtection(t *testing.T) {
	cfg, err := config.Parse("inline.yaml", []byte(`
sources:
  - name: plain
    type: postgres
    dsn: postgres://u@127.0.0.1/test
  - name: tuned
    type: http
    base_url: http://127.0.0.1:1
    timeout: 1s
    max_in_flight: 2
    rate: 0
    retries: 0
    attempt_timeout: 700ms
    retry_backoff: 50ms
    breaker:
      failures: 0
keys:
  - name: p
    key: "p"
    source: plain
    ttl: 60s
    query: SELECT 1
`))
	if err != nil {
		t.Fatal(err)
	}
	m := protect.NewGuardMetrics(nil)
	t.Run("defaults", func(t *testing.T) {
		got := cfg.Sources[0].Guard(m, zerolog.Nop())
		want := protect.GuardConfig{Name: "plain", MaxInFlight: config.DefaultMaxInFlight, Rate: config.DefaultRate,
			Burst: config.DefaultMaxInFlight, Retries: config.DefaultRetries, RetryBackoff: config.DefaultRetryBackoff,
			RetryMaxBackoff: config.DefaultRetryMaxBackoff, BreakerFailures: config.DefaultBreakerFailures,
			BreakerOpenFor: config.DefaultBreakerOpenFor, ProbeInterval: config.DefaultBreakerProbeInterval}
		got.Metrics, got.Logger = nil, zerolog.Logger{}
		if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
			t.Errorf("guard = %+v\nwant    %+v", got, want)
		}
	})
	t.Run("explicit zeros switch protections off", func(t *testing.T) {
		got := cfg.Sources[1].Guard(m, zerolog.Nop())
		if got.Rate != 0 || got.Retries != 0 || got.BreakerFailures != 0 {
			t.Errorf("rate %g, retries %d, breaker failures %d; want 0, 0, 0", got.Rate, got.Retries, got.BreakerFailures)
		}
		if got, want := got.MaxInFlight, 2; got != want {
			t.Errorf("max_in_flight = %d, want %d", got, want)
		}
		if got, want := got.Burst, 2; got != want {
			t.Errorf("burst = %d, want max_in_flight %d", got, want)
		}
		if got, want := got.AttemptTimeout, 700*time.Millisecond; got != want {
			t.Errorf("attempt_timeout = %s, want %s", got, want)
		}
		if got, want := got.RetryMaxBackoff, config.DefaultRetryMaxBackoff; got != want {
			t.Errorf("retry_max_backoff = %s, want %s", got, want)
		}
	})
}

// A breaker that notices the origin's return less often than a declaration of
// its source is refreshed is allowed, and warned of, naming both.
func TestBreakerSlowerThanRefreshWarned(t *testing.T) {
	parse := func(breaker string) []string {
		t.Helper()
		cfg, err := config.Parse("inline.yaml", []byte(`
sources:
  - name: db
    type: postgres
    dsn: postgres://u@127.0.0.1/test
    `+breaker+`
  - name: other
    type: postgres
    dsn: postgres://u@127.0.0.1/test
    breaker: {probe_interval: 1h}
keys:
  - {name: slow, key: "slow", source: db, ttl: 10m, query: SELECT 1}
  - {name: quick, key: "quick", source: db, ttl: 20s, query: SELECT 1}
`))
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Warnings()
	}
	got := parse("breaker: {probe_interval: 30s}")
	want := "sources[db].breaker.probe_interval: the origin's return is noticed after up to 30s, longer than the refresh interval 10s of keys[quick]"
	if len(got) != 1 || !strings.HasPrefix(got[0], want) {
		t.Errorf("warnings = %q, want one starting %q", got, want)
	}
	got = parse("breaker: {probe_interval: 30s, open_for: 15s}")
	if len(got) != 1 || !strings.HasPrefix(got[0], "sources[db].breaker.open_for: the origin's return is noticed after up to 15s") {
		t.Errorf("warnings = %q, want one naming open_for, the sooner of the two", got)
	}
	for _, ok := range []string{"breaker: {probe_interval: 5s}", "breaker: {probe_interval: 30s, open_for: 5s}", "breaker: {failures: 0, probe_interval: 30s}", ""} {
		if got := parse(ok); len(got) != 0 {
			t.Errorf("%q: warnings %q, want none", ok, got)
		}
	}
}
