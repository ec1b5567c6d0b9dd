package config_test

import (
	"testing"
	"time"

	"github.com/hearth-dev/hearth/config"
)

// TestSpecsBuiltOnce: loading a config yields its declarations, built once by
// Validate; nothing rebuilds them, and a config that did not pass Validate has
// none rather than the subset that happened to build.
func TestSpecsBuiltOnce(t *testing.T) {
	cfg, err := config.Load("testdata/valid-full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a, b := cfg.Specs(), cfg.Specs()
	if len(a) != len(cfg.Keys) || len(a) == 0 {
		t.Fatalf("%d specs for %d keys", len(a), len(cfg.Keys))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Errorf("spec %s built twice", a[i].Name)
		}
	}
	if lt := cfg.LeaseTiming(); lt.Lease <= 0 || lt.RenewInterval <= 0 || lt.RetryPeriod <= 0 {
		t.Errorf("lease timing %+v, want it resolved by the load", lt)
	}

	// One bad declaration: Validate fails, and Specs does not drop it silently.
	bad := *cfg
	bad.Keys = append([]config.Key(nil), cfg.Keys...)
	bad.Keys[0].TTL = -time.Second
	if err := bad.Validate(); err == nil {
		t.Fatal("a negative ttl passed Validate")
	}
	if got := bad.Specs(); len(got) != 0 {
		t.Errorf("a config that failed Validate has %d specs, want none", len(got))
	}
	if lt := bad.LeaseTiming(); lt != (config.LeaseTiming{}) {
		t.Errorf("a config that failed Validate has lease timing %+v", lt)
	}
}
