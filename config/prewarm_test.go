package config_test

import (
	"testing"
	"time"

	"github.com/hearth-dev/hearth/config"
)

func TestAccessLogDefaultsAndOverrides(t *testing.T) {
	const keys = `
sources:
  - {name: catalog, type: postgres, dsn: "postgres://postgres@127.0.0.1:5432/test"}
keys:
  - name: top
    key: "top:global"
    source: catalog
    ttl: 60s
    query: "SELECT 'x'"
`
	t.Run("defaults", func(t *testing.T) {
		cfg, err := config.Parse("defaults.yaml", []byte(keys))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := cfg.AccessLog.Source, ""; got != want {
			t.Errorf("access_log.source = %q, want %q", got, want)
		}
		if got, want := cfg.AccessLog.Bucket, time.Minute; got != want {
			t.Errorf("access_log.bucket = %s, want %s", got, want)
		}
		if got, want := cfg.Prewarm.Enabled, true; got != want {
			t.Errorf("prewarm.enabled = %v, want %v", got, want)
		}
		if got, want := cfg.Prewarm.TopN, 10_000; got != want {
			t.Errorf("prewarm.top_n = %d, want %d", got, want)
		}
	})
	t.Run("overrides", func(t *testing.T) {
		t.Setenv("HEARTH_PREWARM_TOP_N", "25")
		data := keys + `
access_log:
  source: catalog
  bucket: 10s
  rollup_interval: 5s
  retention: 0s
  rank_interval: 0s
prewarm:
  enabled: false
  window: 30m
  concurrency: 2
  rate: 7.5
  rewarm_check: 1s
`
		cfg, err := config.Parse("overrides.yaml", []byte(data))
		if err != nil {
			t.Fatal(err)
		}
		got, want := cfg.AccessLog, config.AccessLog{Source: "catalog", Bucket: 10 * time.Second, RollupInterval: 5 * time.Second}
		if got != want {
			t.Errorf("access_log = %+v, want %+v", got, want)
		}
		gotP, wantP := cfg.Prewarm, config.Prewarm{TopN: 25, Window: 30 * time.Minute, Concurrency: 2, Rate: 7.5, RewarmCheck: time.Second}
		if gotP != wantP {
			t.Errorf("prewarm = %+v, want %+v", gotP, wantP)
		}
	})
}
