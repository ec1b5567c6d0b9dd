package config_test

import (
	"fmt"
	"strings"
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
			// 54s − (30s + 5s + 50ms) − (5s + 250ms) leaves 13.7s: the
			// defaults (5s + 4 × 1s × 1.2 = 9.8s) fit.
			name: "defaults with ttl 60s", yaml: leaderConfig("60s", "5s", 0.2, ""),
			lease: 5 * time.Second, renew: 5 * time.Second / 3, retry: time.Second, margin: 13700 * time.Millisecond, fits: true,
		},
		{
			// 10s − 6.05s − 1.25s leaves 2.7s: the lease shrinks to half of
			// it, and 1.35s + 4.8 × 270ms fit.
			name: "short ttl shortens the default lease", yaml: leaderConfig("10s", "1s", 0, ""),
			lease: 1350 * time.Millisecond, renew: 450 * time.Millisecond, retry: 270 * time.Millisecond, margin: 2700 * time.Millisecond, fits: true,
		},
		{
			// 26s − 14.05s − 1.25s leaves 10.7s: 9.8s fit, the defaults stay.
			name: "defaults when they fit", yaml: leaderConfig("26s", "1s", 0, ""),
			lease: 5 * time.Second, renew: 5 * time.Second / 3, retry: time.Second, margin: 10700 * time.Millisecond, fits: true,
		},
		{
			// 20s − 11.05s − 1.25s leaves 7.7s: 9.8s do not fit.
			name: "margin below the defaults", yaml: leaderConfig("20s", "1s", 0, ""),
			lease: 3850 * time.Millisecond, renew: 3850 * time.Millisecond / 3, retry: 770 * time.Millisecond, margin: 7700 * time.Millisecond, fits: true,
		},
		{
			// 3.6s − 3.05s − 1.25s leaves nothing: the lease stops at 1s,
			// and the daemon warns instead of refusing a config nobody tuned.
			name: "tiny margin keeps the minimum lease", yaml: leaderConfig("4s", "1s", 0.2, ""),
			lease: time.Second, renew: time.Second / 3, retry: 200 * time.Millisecond, margin: -700 * time.Millisecond, fits: false,
		},
		{
			name: "explicit values", yaml: leaderConfig("60s", "5s", 0.2, "leader:\n  lease: 8s\n  renew_interval: 2s\n  retry_period: 1s"),
			lease: 8 * time.Second, renew: 2 * time.Second, retry: time.Second, margin: 13700 * time.Millisecond, fits: true,
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
			t.Fatal("a 30s lease against a 13.7s margin was accepted")
		}
	})
	t.Run("the campaign's backoff counts", func(t *testing.T) {
		// 8s + 3s fit in 13.7s, but a standby backing off waits up to 4 × 3s × 1.2.
		_, err := config.Parse("test.yaml", []byte(leaderConfig("60s", "5s", 0.2, "leader:\n  lease: 8s\n  retry_period: 3s")))
		want := "test.yaml: leader.lease: lease 8s + campaign backoff 14.4s (4 × retry_period 3s, +20%) = 22.4s must be shorter than the takeover margin 13.7s of keys[product]"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want %q", err, want)
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

// TestFailoverGrace: leader.failover_grace defaults to 30s, 0 turns it off,
// and it is bounded by MaxFailoverGrace (the generic bound was a year).
func TestFailoverGrace(t *testing.T) {
	for _, tc := range []struct {
		leader string
		want   time.Duration
		err    string
	}{
		{"", config.DefaultFailoverGrace, ""},
		{"leader: {failover_grace: 45s}", 45 * time.Second, ""},
		{"leader: {failover_grace: 0s}", 0, ""},
		{"leader: {failover_grace: 5m}", config.MaxFailoverGrace, ""},
		{"leader: {failover_grace: 5m1s}", 0, "leader.failover_grace: must be at most 5m0s (got 5m1s)"},
		{"leader: {failover_grace: 8760h}", 0, "leader.failover_grace: must be at most 5m0s (got 8760h0m0s)"},
		{"leader: {failover_grace: 1ms}", 0, "leader.failover_grace: must be 0 (off; default 30s, a Cluster only) or at least 10ms (got 1ms)"},
	} {
		cfg, err := config.Parse("grace.yaml", []byte(leaderConfig("60s", "1s", 0.2, tc.leader)))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), "grace.yaml: "+tc.err) {
				t.Errorf("%q: err = %v, want %q", tc.leader, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.leader, err)
			continue
		}
		if got := cfg.Leader.Grace(); got != tc.want {
			t.Errorf("%q: grace %s, want %s", tc.leader, got, tc.want)
		}
	}
}
