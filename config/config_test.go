package config_test

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/config"
)

// TestInvalidConfigs pins the message of every testdata/invalid-*.yaml: its first
// line is "# want: <message>", which must appear in the error, prefixed by the file.
func TestInvalidConfigs(t *testing.T) {
	files, err := filepath.Glob("testdata/invalid-*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 15 {
		t.Fatalf("only %d invalid configs", len(files))
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			want := wantLine(t, f)
			_, err := config.Load(f)
			if err == nil {
				t.Fatalf("Load(%s) succeeded, want error %q", f, want)
			}
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("error is %T, want *config.Error", err)
			}
			// "# want: :12: msg" pins a line number: file:12: msg.
			line := f + ": " + want
			if strings.HasPrefix(want, ":") {
				line = f + want
			}
			if got := err.Error(); !strings.Contains(got, line) {
				t.Errorf("error:\n%s\nwant a line containing:\n%s", got, line)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error leaks the DSN password:\n%s", err)
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
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "# want: ") {
		t.Fatalf("%s: first line must be '# want: <message>'", path)
	}
	return strings.TrimPrefix(sc.Text(), "# want: ")
}

func TestValidConfig(t *testing.T) {
	t.Setenv("HEARTH_TEST_TOKEN", "from-env")
	cfg, err := config.Load("testdata/valid-full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	specs := cfg.Specs()
	if got, want := len(specs), 3; got != want {
		t.Fatalf("specs = %d, want %d", got, want)
	}
	t.Run("defaults and derived interval", func(t *testing.T) {
		top := specs[0]
		if got, want := top.Interval, 30*time.Second; got != want {
			t.Errorf("interval = %s, want ttl/2 = %s", got, want)
		}
		if got, want := top.Jitter, 0.2; got != want {
			t.Errorf("jitter = %g, want default %g", got, want)
		}
		if got, want := top.BatchSize, 100; got != want {
			t.Errorf("batch size = %d, want refresh.batch_size %d", got, want)
		}
		if top.Template.IsFamily() {
			t.Error("top-products:global parsed as a family")
		}
	})
	t.Run("per-key overrides", func(t *testing.T) {
		p := specs[1]
		if got, want := p.Jitter, 0.0; got != want {
			t.Errorf("jitter = %g, want explicit 0", got)
		}
		if got, want := p.BatchSize, 50; got != want {
			t.Errorf("batch size = %d, want %d", got, want)
		}
		if err := p.Template.ValidateMember("12x"); err == nil {
			t.Error("param_pattern [0-9]+ accepted 12x")
		}
		price := specs[2]
		if got, want := price.Interval, 5*time.Second; got != want {
			t.Errorf("interval = %s, want %s", got, want)
		}
		if got, want := price.MaxStale, time.Duration(0); got != want {
			t.Errorf("max_stale = %s, want explicit 0", got)
		}
		if got, want := string(price.NegativeValue), "<none>"; got != want {
			t.Errorf("negative value = %q, want %q", got, want)
		}
	})
	t.Run("expansion leaves SQL placeholders alone", func(t *testing.T) {
		if got := specs[1].Query; !strings.Contains(got, "ANY($1::bigint[])") {
			t.Errorf("query = %q: $1 was expanded", got)
		}
		if got, want := cfg.Sources[1].Headers["authorization"], "Bearer from-env"; got != want {
			t.Errorf("header = %q, want %q", got, want)
		}
	})
}

func TestEnvOverrides(t *testing.T) {
	t.Setenv("HEARTH_REDIS_PASSWORD", "pw-from-env")
	t.Setenv("HEARTH_HTTP_LISTEN", "127.0.0.1:19999")
	t.Setenv("HEARTH_REFRESH_MAX_CONCURRENT_LOADS", "3")
	cfg, err := config.Load("testdata/valid-full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Redis.Password, "pw-from-env"; got != want {
		t.Errorf("redis.password = %q, want %q", got, want)
	}
	if got, want := cfg.HTTP.Listen, "127.0.0.1:19999"; got != want {
		t.Errorf("http.listen = %q, want %q", got, want)
	}
	if got, want := cfg.Refresh.MaxConcurrentLoads, 3; got != want {
		t.Errorf("refresh.max_concurrent_loads = %d, want %d", got, want)
	}
}

func TestEveryProblemListed(t *testing.T) {
	data := []byte(`
sources:
  - name: db
    type: postgres
    dsn: postgres://127.0.0.1/test
keys:
  - name: a
    key: "a:{id}"
    source: db
    ttl: -1s
    members: ["1"]
    query: "SELECT id, v FROM t WHERE id = ANY($1)"
  - name: b
    key: "b"
    source: missing
    ttl: 60s
`)
	_, err := config.Parse("inline.yaml", data)
	var ce *config.Error
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *config.Error", err)
	}
	want := []string{"keys[a].ttl: must be at least 100ms (got -1s)", `keys[b].source: names no configured source (got "missing")`}
	for _, w := range want {
		if !strings.Contains(err.Error(), "inline.yaml: "+w) {
			t.Errorf("missing problem %q in:\n%s", w, err)
		}
	}
}

func TestShippedConfigsValidate(t *testing.T) {
	for _, f := range []string{"../config.yaml"} {
		if _, err := config.Load(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}
