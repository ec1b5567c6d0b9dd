package config_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/config"
)

func leaderConfig(ttl, loadTimeout string, jitter float64, leader string) string {
	return fmt.Sprintf(`refresh:
  jitter: %g
  load_timeout: %s
  negative_ttl: 1s
%s
sources:
  - name: db
    type: postgres
    dsn: postgres://postgres@127.0.0.1:5432/test
keys:
  - name: product
    key: "product:{id}"
    source: db
    ttl: %s
    members: ["1"]
    query: "SELECT id, v FROM t WHERE id = ANY($1)"
`, jitter, loadTimeout, leader, ttl)
}

func TestLeaseTiming(t *testing.T) {
	for _, tc := range []struct {
		name                string
		yaml                string
		lease, renew, retry time.Duration
		margin              time.Duration
		fits                bool
	}{
		{
			// config.yaml: 54s − 30s − 5s leaves 19s; the defaults fit.
			name: "defaults with ttl 60s", yaml: leaderConfig("60s", "5s", 0.2, ""),
			lease: 5 * time.Second, renew: 5 * time.Second / 3, retry: time.Second, margin: 19 * time.Second, fits: true,
		},
		{
			// 6s − 3s − 1s leaves 2s: the lease shrinks to half of it.
			name: "short ttl shortens the default lease", yaml: leaderConfig("6s", "1s", 0, ""),
			lease: time.Second, renew: time.Second / 3, retry: 200 * time.Millisecond, margin: 2 * time.Second, fits: true,
		},
		{
			// 16s − 8s − 1s leaves 7s: 5s + 1s fit, the defaults stay.
			name: "defaults when they fit", yaml: leaderConfig("16s", "1s", 0, ""),
			lease: 5 * time.Second, renew: 5 * time.Second / 3, retry: time.Second, margin: 7 * time.Second, fits: true,
		},
		{
			// 12s − 6s − 1s leaves 5s: 5s + 1s do not fit.
			name: "margin below the defaults", yaml: leaderConfig("12s", "1s", 0, ""),
			lease: 2500 * time.Millisecond, renew: 2500 * time.Millisecond / 3, retry: 500 * time.Millisecond, margin: 5 * time.Second, fits: true,
		},
		{
			// 3.6s − 2s − 1s leaves 600ms: the lease stops at 1s, and the
			// daemon warns instead of refusing a config nobody tuned.
			name: "tiny margin keeps the minimum lease", yaml: leaderConfig("4s", "1s", 0.2, ""),
			lease: time.Second, renew: time.Second / 3, retry: 200 * time.Millisecond, margin: 600 * time.Millisecond, fits: false,
		},
		{
			name: "explicit values", yaml: leaderConfig("60s", "5s", 0.2, "leader:\n  lease: 8s\n  renew_interval: 2s\n  retry_period: 3s"),
			lease: 8 * time.Second, renew: 2 * time.Second, retry: 3 * time.Second, margin: 19 * time.Second, fits: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse("test.yaml", []byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			lt := cfg.LeaseTiming()
			if lt.Lease != tc.lease || lt.RenewInterval != tc.renew || lt.RetryPeriod != tc.retry {
				t.Errorf("lease/renew/retry = %s/%s/%s, want %s/%s/%s", lt.Lease, lt.RenewInterval, lt.RetryPeriod, tc.lease, tc.renew, tc.retry)
			}
			if got := lt.Margin.Round(time.Millisecond); got != tc.margin {
				t.Errorf("margin = %s, want %s", got, tc.margin)
			}
			if got := lt.Fits(); got != tc.fits {
				t.Errorf("Fits() = %v, want %v", got, tc.fits)
			}
			if !cfg.Leader.Enabled {
				t.Error("leader election is off by default")
			}
		})
	}

	t.Run("environment override is validated", func(t *testing.T) {
		t.Setenv("HEARTH_LEADER_LEASE", "30s")
		_, err := config.Parse("test.yaml", []byte(leaderConfig("60s", "5s", 0.2, "")))
		if err == nil {
			t.Fatal("a 30s lease against a 19s margin was accepted")
		}
	})
	t.Run("disabled", func(t *testing.T) {
		cfg, err := config.Parse("test.yaml", []byte(leaderConfig("60s", "5s", 0.2, "leader:\n  enabled: false\n  lease: 1m")))
		if err != nil {
			t.Fatalf("a lease that does not fit is irrelevant without election: %v", err)
		}
		if cfg.Leader.Enabled {
			t.Error("enabled: false ignored")
		}
	})
}
