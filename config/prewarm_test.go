package config_test

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/config"
)

// TestAccessLogInvalid pins the message of every invalid-accesslog-*.yaml case
// (first line: "# want: <substring>").
func TestAccessLogInvalid(t *testing.T) {
	files, err := filepath.Glob("testdata/invalid-accesslog-*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files (%v)", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			want := wantLine(t, f)
			_, err := config.Load(f)
			if err == nil {
				t.Fatalf("Load(%s) succeeded, want an error containing %q", f, want)
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Load(%s) error:\n%v\nwant it to contain %q", f, err, want)
			}
			if !strings.HasPrefix(err.Error(), f+": ") {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

func wantLine(t *testing.T, path string) string {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	sc.Scan()
	want, ok := strings.CutPrefix(sc.Text(), "# want: ")
	if !ok || want == "" {
		t.Fatalf("%s: first line must be '# want: <substring>'", path)
	}
	return want
}

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
