package config_test

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/config"
)

// base is a valid config the tables below break one value of.
const base = `
sources:
  - name: db
    type: postgres
    dsn: postgres://u@127.0.0.1/test
keys:
  - name: p
    key: "p:{id}"
    source: db
    ttl: 60s
    members: ["1"]
    query: "SELECT id, v FROM t WHERE id = ANY($1)"
`

// TestEnvOverrideChecks: a HEARTH_… override goes through every check a file
// value does, and the message names the variable it came from.
func TestEnvOverrideChecks(t *testing.T) {
	const year = "8760h0m0s"
	for _, tc := range []struct{ env, value, want string }{
		{"HEARTH_REFRESH_JITTER", "NaN", "refresh.jitter: must be a finite number (got NaN) (from environment variable HEARTH_REFRESH_JITTER)"},
		{"HEARTH_REFRESH_JITTER", "+Inf", "refresh.jitter: must be a finite number (got +Inf) (from environment variable HEARTH_REFRESH_JITTER)"},
		{"HEARTH_REFRESH_JITTER", "1", "refresh.jitter: must be at least 0 and below 1 (got 1) (from environment variable HEARTH_REFRESH_JITTER)"},
		{"HEARTH_REFRESH_JITTER", "abc", "refresh.jitter: cannot parse value as 'float64': strconv.ParseFloat: invalid syntax (from environment variable HEARTH_REFRESH_JITTER)"},
		{"HEARTH_REFRESH_SPREAD", "nan", "refresh.spread: must be a finite number (got NaN) (from environment variable HEARTH_REFRESH_SPREAD)"},
		{"HEARTH_PREWARM_RATE", "inf", "prewarm.rate: must be a finite number (got +Inf) (from environment variable HEARTH_PREWARM_RATE)"},
		{"HEARTH_REFRESH_LOAD_TIMEOUT", "2562047h", "refresh.load_timeout: must be at most " + year + ", a year (got 2562047h0m0s) (from environment variable HEARTH_REFRESH_LOAD_TIMEOUT)"},
		{"HEARTH_REFRESH_LOAD_TIMEOUT", "0s", "refresh.load_timeout: must be at least 1ms (got 0s) (from environment variable HEARTH_REFRESH_LOAD_TIMEOUT)"},
		{"HEARTH_REDIS_READ_TIMEOUT", "9000h", "redis.read_timeout: must be at most 5m0s (got 9000h0m0s) (from environment variable HEARTH_REDIS_READ_TIMEOUT)"},
		{"HEARTH_REDIS_POOL_SIZE", "-3", "redis.pool_size: must be 0 (the client's default) or between 1 and 10000 (got -3) (from environment variable HEARTH_REDIS_POOL_SIZE)"},
		{"HEARTH_LEADER_LEASE", "9000h", "leader.lease: must be at most " + year + ", a year (got 9000h0m0s) (from environment variable HEARTH_LEADER_LEASE)"},
		{"HEARTH_ACCESS_LOG_RANK_INTERVAL", "2562047h", "access_log.rank_interval: must be at most " + year + ", a year (got 2562047h0m0s) (from environment variable HEARTH_ACCESS_LOG_RANK_INTERVAL)"},
		{"HEARTH_PREWARM_REWARM_CHECK", "9000h", "prewarm.rewarm_check: must be at most " + year + ", a year (got 9000h0m0s) (from environment variable HEARTH_PREWARM_REWARM_CHECK)"},
		{"HEARTH_REFRESH_LOAD_TIMEOUT", "1", `refresh.load_timeout: a duration needs a unit, e.g. "1s" (got 1) (from environment variable HEARTH_REFRESH_LOAD_TIMEOUT)`},
		{"HEARTH_LEADER_RENEW_INTERVAL", "1", `leader.renew_interval: a duration needs a unit, e.g. "1s" (got 1) (from environment variable HEARTH_LEADER_RENEW_INTERVAL)`},
		{"HEARTH_LEADER_RETRY_PERIOD", "1ns", "leader.retry_period: must be 0 (1s or lease/5) or at least 10ms (got 1ns) (from environment variable HEARTH_LEADER_RETRY_PERIOD)"},
		{"HEARTH_ACCESS_LOG_ROLLUP_INTERVAL", "0.5", `access_log.rollup_interval: a duration needs a unit, e.g. "0.5s" (got 0.5) (from environment variable HEARTH_ACCESS_LOG_ROLLUP_INTERVAL)`},
		{"HEARTH_REDIS_READ_TIMEOUT", "1", `redis.read_timeout: a duration needs a unit, e.g. "1s" (got 1) (from environment variable HEARTH_REDIS_READ_TIMEOUT)`},
		{"HEARTH_REDIS_READ_TIMEOUT", "1ns", "redis.read_timeout: must be at least 10ms (got 1ns) (from environment variable HEARTH_REDIS_READ_TIMEOUT)"},
		{"HEARTH_REDIS_ADDRS", "127.0.0.1:6379,nowhere", `redis.addrs[1]: must be host:port (got "nowhere") (from environment variable HEARTH_REDIS_ADDRS)`},
		{"HEARTH_HTTP_PROBE_LISTEN", "nowhere", `http.probe_listen: must be host:port (got "nowhere") (from environment variable HEARTH_HTTP_PROBE_LISTEN)`},
		{"HEARTH_REFRESH_MAX_INFLIGHT_BYTES", "1000", "refresh.max_inflight_bytes: must be between 1048576 and 17179869184 (got 1000) (from environment variable HEARTH_REFRESH_MAX_INFLIGHT_BYTES)"},
		{"HEARTH_REDIS_NAMESPACE", "p", `keys[p].key: template "p:{id}" can name a key inside Hearth's own namespace (p or p:…, redis.namespace): use another prefix or namespace`},
	} {
		t.Run(tc.env+"="+tc.value, func(t *testing.T) {
			t.Setenv(tc.env, tc.value)
			_, err := config.Parse("env.yaml", []byte(base))
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("Parse with %s=%s: err = %v, want *config.Error", tc.env, tc.value, err)
			}
			if !strings.Contains(err.Error(), "env.yaml: "+tc.want) {
				t.Errorf("error:\n%s\nwant a line containing:\nenv.yaml: %s", err, tc.want)
			}
		})
	}
	t.Run("a file value is not said to come from the environment", func(t *testing.T) {
		_, err := config.Parse("file.yaml", []byte("refresh: {jitter: .nan}\n"+base))
		if err == nil || strings.Contains(err.Error(), "environment") {
			t.Errorf("err = %v, want refresh.jitter rejected without mention of the environment", err)
		}
	})
}

// TestNamespaceNeighbours: templates next to Hearth's namespace but unable to
// name a key in it are accepted; the check is not a blanket ban on a prefix.
func TestNamespaceNeighbours(t *testing.T) {
	for _, tc := range []struct{ key, pattern string }{
		{"hearthstone:{id}", ""}, // diverges from "hearth:" before the member
		{"hearth-{id}", ""},      // '-' is not ':'
		{"h{id}", "[0-9]+"},      // no digit member completes "earth:"
		{"{id}:warm", "[0-9]+"},  // nor "hearth:"
		{"app:hearth:{id}", ""},  // the namespace is a prefix, not a substring
		{"hea{id}", "rt[a-g]+"},  // "rth" is not a member, "rth:" never begins one
		{"Hearth:{id}", ""},      // keys are case-sensitive
	} {
		t.Run(tc.key, func(t *testing.T) {
			yaml := strings.Replace(base, `key: "p:{id}"`, `key: "`+tc.key+`"`, 1)
			member := "1"
			if tc.pattern == "rt[a-g]+" {
				member = "rtab"
			}
			yaml = strings.Replace(yaml, `members: ["1"]`, `members: ["`+member+`"]`, 1)
			if tc.pattern != "" {
				yaml = strings.Replace(yaml, "    ttl: 60s\n", "    ttl: 60s\n    param_pattern: \""+tc.pattern+"\"\n", 1)
			}
			if _, err := config.Parse("near.yaml", []byte(yaml)); err != nil {
				t.Errorf("template %q (pattern %q) rejected:\n%v", tc.key, tc.pattern, err)
			}
		})
	}
}

// TestDuplicateKeysInline: duplicates are found at every depth, with the line.
func TestDuplicateKeysInline(t *testing.T) {
	data := "prewarm:\n  top_n: 5\n  window: 1h\n  top_n: 6\n" + base
	_, err := config.Parse("dup.yaml", []byte(data))
	if err == nil {
		t.Fatal("a duplicate prewarm.top_n was accepted")
	}
	if want := `dup.yaml:4: prewarm: duplicate key "top_n" (first at line 2)`; !strings.Contains(err.Error(), want) {
		t.Errorf("error:\n%s\nwant %s", err, want)
	}
}

// TestEveryNumberChecked sets, one at a time, every float of the Config struct
// (pointers included) to NaN and +Inf and every duration past MaxDuration, on
// a valid config, and wants the field named with the specific message: a
// field added later without a check fails here.
func TestEveryNumberChecked(t *testing.T) {
	cfg, err := config.Parse("base.yaml", []byte(strings.Replace(base, "sources:\n",
		"sources:\n  - {name: api, type: http, base_url: \"http://127.0.0.1:1\", timeout: 1s}\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	var visit func(path string, v reflect.Value)
	visit = func(path string, v reflect.Value) {
		switch {
		case v.Type() == reflect.TypeFor[time.Duration]():
			n++
			b, ok := config.BoundFor(listItemName.ReplaceAllString(path, "[]"))
			if !ok {
				t.Errorf("%s has no bound", path)
				return
			}
			msg := fmt.Sprintf("must be at most %s (got %s)", b.Max, b.Max+time.Hour)
			if b.Max == config.MaxDuration {
				msg = "must be at most 8760h0m0s, a year (got 8761h0m0s)"
			}
			try(t, cfg, path, v, reflect.ValueOf(b.Max+time.Hour), msg)
			return
		case v.Kind() == reflect.Float64:
			n++
			for _, x := range []float64{math.NaN(), math.Inf(1)} {
				try(t, cfg, path, v, reflect.ValueOf(x), fmt.Sprintf("must be a finite number (got %g)", x))
			}
			return
		}
		switch v.Kind() {
		case reflect.Pointer:
			if v.IsNil() {
				v.Set(reflect.New(v.Type().Elem()))
				defer v.SetZero()
			}
			visit(path, v.Elem())
		case reflect.Struct:
			for i := range v.NumField() {
				f := v.Type().Field(i)
				name, opts, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
				switch {
				case !f.IsExported() || name == "-":
				case opts == "squash":
					visit(path, v.Field(i))
				default:
					visit(strings.TrimPrefix(path+"."+name, "."), v.Field(i))
				}
			}
		case reflect.Slice:
			if v.Type().Elem().Kind() != reflect.Struct {
				return
			}
			for i := range v.Len() {
				visit(fmt.Sprintf("%s[%s]", path, v.Index(i).FieldByName("Name").String()), v.Index(i))
			}
		}
	}
	visit("", reflect.ValueOf(cfg).Elem())
	t.Logf("%d float and duration fields checked", n)
	if n < 30 {
		t.Errorf("visited %d number fields; the walk missed part of the struct", n)
	}
}

var listItemName = regexp.MustCompile(`\[[^\]]*\]`)

// try sets the field v of cfg to x, validates, puts the old value back, and
// wants "path: msg" in the error.
func try(t *testing.T, cfg *config.Config, path string, v, x reflect.Value, msg string) {
	t.Helper()
	old := reflect.New(v.Type()).Elem()
	old.Set(v)
	v.Set(x.Convert(v.Type()))
	err := cfg.Validate()
	v.Set(old)
	if want := path + ": " + msg; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%s set to %v: error %v, want %q", path, x, err, want)
	}
}
