package config_test

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/config"
)

// numberFields lists, from the Config type (not a value: a list need not
// have an item), the table path of every duration and number field.
func numberFields(t reflect.Type, path string, out *[]string) {
	switch t.Kind() {
	case reflect.Pointer:
		numberFields(t.Elem(), path, out)
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Struct {
			numberFields(t.Elem(), path+"[]", out)
		}
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
			switch {
			case !f.IsExported() || name == "-":
			case opts == "squash":
				numberFields(f.Type, path, out)
			default:
				numberFields(f.Type, strings.TrimPrefix(path+"."+name, "."), out)
			}
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Float32, reflect.Float64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		*out = append(*out, path)
	}
}

// TestEveryFieldBounded: every duration and number of the config has an
// entry in config.Bounds, of its kind, and every entry names a field. A
// field added without one fails here.
func TestEveryFieldBounded(t *testing.T) {
	var fields []string
	numberFields(reflect.TypeFor[config.Config](), "", &fields)
	if len(fields) < 50 {
		t.Fatalf("found %d number fields; the walk missed part of the struct", len(fields))
	}
	kinds := map[string]bool{}
	var visit func(reflect.Type, string)
	visit = func(rt reflect.Type, path string) {
		switch rt.Kind() {
		case reflect.Pointer:
			visit(rt.Elem(), path)
		case reflect.Slice:
			visit(rt.Elem(), path+"[]")
		case reflect.Struct:
			for i := range rt.NumField() {
				f := rt.Field(i)
				name, opts, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
				switch {
				case !f.IsExported() || name == "-":
				case opts == "squash":
					visit(f.Type, path)
				default:
					visit(f.Type, strings.TrimPrefix(path+"."+name, "."))
				}
			}
		default:
			kinds[path] = rt == reflect.TypeFor[time.Duration]()
		}
	}
	visit(reflect.TypeFor[config.Config](), "")
	seen := map[string]bool{}
	for _, f := range fields {
		seen[f] = true
		b, ok := config.BoundFor(f)
		if !ok {
			t.Errorf("%s has no entry in config.Bounds", f)
			continue
		}
		if b.IsDuration() != kinds[f] {
			t.Errorf("%s: bound is a duration %v, field is a duration %v", f, b.IsDuration(), kinds[f])
		}
	}
	for _, b := range config.Bounds {
		if !seen[b.Path] {
			t.Errorf("config.Bounds has %s, which is no number field of the config", b.Path)
		}
	}
}

// TestBoundsDocumented: docs/configuration.md prints config.Bounds as
// BoundsMarkdown renders it. HEARTH_UPDATE_DOCS=1 rewrites the doc.
func TestBoundsDocumented(t *testing.T) {
	const path = "../docs/configuration.md"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	i := strings.Index(doc, "<!-- bounds:begin")
	j := strings.Index(doc, "<!-- bounds:end -->")
	if i < 0 || j < i {
		t.Fatalf("%s has no bounds:begin / bounds:end markers", path)
	}
	i += strings.Index(doc[i:], "\n") + 1
	want := config.BoundsMarkdown()
	if doc[i:j] == want {
		return
	}
	if os.Getenv("HEARTH_UPDATE_DOCS") != "" {
		if err := os.WriteFile(path, []byte(doc[:i]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's bounds table differs from config.Bounds; run HEARTH_UPDATE_DOCS=1 go test ./config -run TestBoundsDocumented\nwant:\n%s", path, want)
}

// TestBareNumbersRefused: a duration written as a bare number is refused,
// naming the field, in the file and in the environment alike, and 0 stays
// accepted bare.
func TestBareNumbersRefused(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"refresh: {load_timeout: 1}", `refresh.load_timeout: a duration needs a unit, e.g. "1s" (got 1)`},
		{"refresh: {load_timeout: -2}", `refresh.load_timeout: a duration needs a unit, e.g. "1s" (got -2)`},
		{"refresh: {load_timeout: .nan}", `refresh.load_timeout: a duration needs a unit, e.g. "1s" (got NaN)`},
		{"refresh: {load_timeout: 1e300}", `refresh.load_timeout: a duration needs a unit, e.g. "1e+300s" (got 1e+300)`},
		{"leader: {retry_period: \" 2 \"}", `leader.retry_period: a duration needs a unit, e.g. "2s" (got  2 )`},
		{"prewarm: {rewarm_check: 0.25}", `prewarm.rewarm_check: a duration needs a unit, e.g. "0.25s" (got 0.25)`},
	} {
		_, err := config.Parse("bare.yaml", []byte(tc.yaml+"\n"+base))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.yaml, err, tc.want)
		}
	}
	t.Run("in a list item, by name and line", func(t *testing.T) {
		_, err := config.Parse("bare.yaml", []byte(strings.Replace(base, "    ttl: 60s\n", "    ttl: 60s\n    interval: 1\n", 1)))
		if want := `bare.yaml:11: keys[p].interval: a duration needs a unit, e.g. "1s" (got 1)`; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want %q", err, want)
		}
	})
	t.Run("0 stays bare", func(t *testing.T) {
		if _, err := config.Parse("zero.yaml", []byte("prewarm: {rewarm_check: 0}\naccess_log: {rollup_interval: \"0\"}\n"+base)); err != nil {
			t.Errorf("bare 0 refused: %v", err)
		}
	})
	t.Run("environment and file agree", func(t *testing.T) {
		t.Setenv("HEARTH_REFRESH_LOAD_TIMEOUT", "1")
		_, err := config.Parse("env.yaml", []byte(base))
		var ce *config.Error
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), `env.yaml: refresh.load_timeout: a duration needs a unit, e.g. "1s" (got 1) (from environment variable HEARTH_REFRESH_LOAD_TIMEOUT)`) {
			t.Errorf("err = %v", err)
		}
	})
}

// TestWholeNumbers: the weakly typed decoder truncated a fraction in a
// whole-number field (batch_size: 1.5 ran as 1, max_concurrent_loads: 0.9
// was refused as "got 0") and read true as 1, where the same values from the
// environment were refused. Both are refused, naming the field and the value.
func TestWholeNumbers(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"refresh: {batch_size: 1.5}", "refresh.batch_size: must be a whole number (got 1.5)"},
		{"refresh: {max_concurrent_loads: 0.9}", "refresh.max_concurrent_loads: must be a whole number (got 0.9)"},
		{"refresh: {batch_size: true}", "refresh.batch_size: must be a whole number (got true)"},
		{"redis: {db: 1e-9}", "redis.db: must be a whole number (got 1e-09)"},
		{"prewarm: {top_n: .inf}", "prewarm.top_n: must be a whole number (got +Inf)"},
		{"prewarm: {rate: true}", "prewarm.rate: must be a number (got true)"},
	} {
		_, err := config.Parse("whole.yaml", []byte(tc.yaml+"\n"+base))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.yaml, err, tc.want)
		}
	}
	t.Run("in a list item, by name and line", func(t *testing.T) {
		_, err := config.Parse("whole.yaml", []byte(strings.Replace(base, "    ttl: 60s\n", "    ttl: 60s\n    batch_size: 2.5\n", 1)))
		if want := "whole.yaml:11: keys[p].batch_size: must be a whole number (got 2.5)"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want %q", err, want)
		}
	})
	t.Run("whole values in any spelling pass", func(t *testing.T) {
		cfg, err := config.Parse("whole.yaml", []byte("refresh: {batch_size: 1e3, max_concurrent_loads: \"4\"}\nprewarm: {rate: 2.5}\n"+base))
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		if cfg.Refresh.BatchSize != 1000 || cfg.Refresh.MaxConcurrentLoads != 4 {
			t.Errorf("batch_size %d, max_concurrent_loads %d, want 1000 and 4", cfg.Refresh.BatchSize, cfg.Refresh.MaxConcurrentLoads)
		}
	})
}

// TestEdgeDurations: the values that used to pass validation and then spin a
// loop or switch a timeout off are each refused with their field.
func TestEdgeDurations(t *testing.T) {
	key := func(extra string) string {
		return strings.Replace(base, "    ttl: 60s\n", "    ttl: 60s\n    "+extra+"\n", 1)
	}
	src := func(extra string) string {
		return strings.Replace(base, "    dsn: postgres://u@127.0.0.1/test\n", "    dsn: postgres://u@127.0.0.1/test\n    "+extra+"\n", 1)
	}
	for _, tc := range []struct{ yaml, want string }{
		{key("interval: 1ns"), "keys[p].interval: must be 0 (ttl/2) or at least 100ms (got 1ns)"},
		{key("interval: 99ms"), "keys[p].interval: must be 0 (ttl/2) or at least 100ms (got 99ms)"},
		{"leader: {renew_interval: 1ns}\n" + base, "leader.renew_interval: must be 0 (lease/3) or at least 10ms (got 1ns)"},
		{"leader: {retry_period: 1ms}\n" + base, "leader.retry_period: must be 0 (1s or lease/5) or at least 10ms (got 1ms)"},
		{"access_log: {rollup_interval: 1ns}\n" + base, "access_log.rollup_interval: must be 0 (no roll-up) or at least 1s (got 1ns)"},
		{src("statement_timeout: 500us"), "sources[db].statement_timeout: must be 0 (no timeout) or at least 1ms (got 500µs)"},
		{src("statement_timeout: 1ns"), "sources[db].statement_timeout: must be 0 (no timeout) or at least 1ms (got 1ns)"},
		{src("statement_timeout: 2500us"), "sources[db].statement_timeout: must be a whole number of milliseconds (got 2.5ms)"},
		{"redis: {read_timeout: 1ns}\n" + base, "redis.read_timeout: must be at least 10ms (got 1ns)"},
		{"redis: {dial_timeout: 1ms}\n" + base, "redis.dial_timeout: must be at least 10ms (got 1ms)"},
		{"refresh: {shutdown_timeout: 1ns}\n" + base, "refresh.shutdown_timeout: must be at least 100ms (got 1ns)"},
		{key("notify: {channel: c, coalesce: 1ns}"), "keys[p].notify.coalesce: must be 0 (no extra wait) or at least 1ms (got 1ns)"},
		{key("notify: {channel: c, gather: 1ns}"), "keys[p].notify.gather: must be 0 (the default 3ms) or at least 1ms (got 1ns)"},
	} {
		_, err := config.Parse("edge.yaml", []byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), "edge.yaml: "+tc.want) {
			t.Errorf("err = %v\nwant %q", err, tc.want)
		}
	}
}

// TestNotifyGather: notify.gather defaults to config.DefaultGather and
// takes what is set, within its bounds (TestEdgeDurations has the refusals).
func TestNotifyGather(t *testing.T) {
	key := func(extra string) string {
		return strings.Replace(base, "    ttl: 60s\n", "    ttl: 60s\n    "+extra+"\n", 1)
	}
	for _, tc := range []struct {
		notify string
		want   time.Duration
	}{
		{"notify: {channel: c}", config.DefaultGather},
		{"notify: {channel: c, gather: 0s}", config.DefaultGather},
		{"notify: {channel: c, gather: 1ms}", time.Millisecond},
		{"notify: {channel: c, gather: 10s}", 10 * time.Second},
	} {
		cfg, err := config.Parse("gather.yaml", []byte(key(tc.notify)))
		if err != nil {
			t.Fatalf("%s: refused: %v", tc.notify, err)
		}
		if got := cfg.Specs()[0].Gather; got != tc.want {
			t.Errorf("%s: gather %v, want %v", tc.notify, got, tc.want)
		}
	}
	for _, bad := range []struct{ gather, want string }{
		{"11s", "keys[p].notify.gather: must be"},
		{"5", `keys[p].notify.gather: a duration needs a unit, e.g. "5s" (got 5)`},
		{"-1ms", "keys[p].notify.gather: must be"},
	} {
		_, err := config.Parse("gather.yaml", []byte(key("notify: {channel: c, gather: "+bad.gather+"}")))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("gather %s: err = %v, want %q", bad.gather, err, bad.want)
		}
	}
}

// TestTimingRule: the tight config (members written at the start of one run
// and at the end of the next's spread, plus a load) is refused; the same
// family with a shorter spread, just inside the rule, is accepted.
func TestTimingRule(t *testing.T) {
	const family = `sources:
  - {name: db, type: postgres, dsn: "postgres://u@127.0.0.1/test"}
keys:
  - {name: p, key: "p:{id}", source: db, ttl: 4s, interval: 2s, members_query: "SELECT id FROM t", query: "SELECT id, v FROM t WHERE id = ANY($1)"}
`
	_, err := config.Parse("tight.yaml", []byte("refresh: {spread: 0.5, load_timeout: 1s, jitter: 0.2}\n"+family))
	if want := "tight.yaml: keys[p].ttl: smallest jittered ttl 3.6s is not longer than 2 × interval 2s"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("tight config: err = %v, want %q", err, want)
	}
	// 2s + 0.4s + 1s + 50ms = 3.45s < 3.6s.
	if _, err := config.Parse("inside.yaml", []byte("refresh: {spread: 0.2, load_timeout: 1s, jitter: 0.2}\n"+family)); err != nil {
		t.Errorf("a config inside the rule was refused: %v", err)
	}
	// A listed family of one batch has no spread to wait for.
	one := strings.Replace(family, `members_query: "SELECT id FROM t"`, `members: ["1", "2"]`, 1)
	if _, err := config.Parse("one.yaml", []byte("refresh: {spread: 0.5, load_timeout: 1s, jitter: 0.2}\n"+one)); err != nil {
		t.Errorf("a one-batch family was refused: %v", err)
	}
	// Two batches: the second is paced half the spread later: 2s + 0.5s + 1s + 50ms < 3.6s.
	two := strings.Replace(one, "ttl: 4s,", "ttl: 4s, batch_size: 1,", 1)
	if _, err := config.Parse("two.yaml", []byte("refresh: {spread: 0.5, load_timeout: 1s, jitter: 0.2}\n"+two)); err != nil {
		t.Errorf("a two-batch family inside the rule was refused: %v", err)
	}
}

// A source's rate bound is part of the timing: the warmer never plans two
// batches closer than the rate admits, so a rate too low for the loads its
// declarations schedule let every key expire while the origin was healthy
// (rate 0.05 with a family listed by a query, interval 4s: every poll found
// keys missing for 45 s). It is refused, naming the rate and the loads.
func TestRateTiming(t *testing.T) {
	const base = `sources:
  - {name: db, type: postgres, dsn: "postgres://u@127.0.0.1/test", rate: RATE}
keys:
  - {name: p, key: "p:{id}", source: db, ttl: 20s, interval: 4s, members_query: "SELECT id FROM t", query: "SELECT id, v FROM t WHERE id = ANY($1)"}
  - {name: q, key: "q:{id}", source: db, ttl: 20s, interval: 4s, batch_size: 10, members: [MEMBERS], query: "SELECT id, v FROM t WHERE id = ANY($1)"}
`
	var members []string
	for i := range 40 {
		members = append(members, fmt.Sprintf(`"%d"`, i))
	}
	cfg := strings.Replace(base, "MEMBERS", strings.Join(members, ", "), 1)
	for _, tc := range []struct {
		rate, want string
	}{
		// p: 2 calls / 4s, q: 4 batches / 4s = 1.5 calls/s, planned at 80%.
		// (q's own timing fails too: 4 batches 25s apart.)
		{"0.05", "x.yaml: sources[db].rate: 0.05 calls/s cannot carry the scheduled loads of its declarations (keys[p] at least 1 batch + members_query every 4s: 0.5 calls/s, planned at 80% of the rate): keys would expire while the origin is healthy; raise rate to at least 0.625"},
		{"1.8", "sources[db].rate: 1.8 calls/s cannot carry the scheduled loads of its declarations (keys[p] at least 1 batch + members_query every 4s, keys[q] 4 loads every 4s: 1.5 calls/s"},
		{"1.875", ""},
		{"0", ""}, // unlimited
	} {
		_, err := config.Parse("x.yaml", []byte(strings.Replace(cfg, "RATE", tc.rate, 1)))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("rate %s: refused: %v", tc.rate, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("rate %s: err = %v, want %q", tc.rate, err, tc.want)
		}
	}
	// Within the rate as a whole, a listed family's run is still stretched
	// by it: 4 batches 1.25s apart (rate 1, 80%) take 3.75s of a 4s
	// interval, more than the spread, and a 9s ttl no longer outlives the
	// longest gap between two writes.
	one := `sources:
  - {name: db, type: postgres, dsn: "postgres://u@127.0.0.1/test", rate: 2}
keys:
  - {name: q, key: "q:{id}", source: db, ttl: TTL, jitter: 0, interval: 4s, batch_size: 10, members: [MEMBERS], query: "SELECT id, v FROM t WHERE id = ANY($1)"}
`
	one = strings.Replace(one, "MEMBERS", strings.Join(members, ", "), 1)
	// rate 2 → gap 626ms, pace 1.878s > spread 0.5 × 4s × 3/4 = 1.5s:
	// run = 1.878 + 5 + 0.05 = 6.928s, skips 1 tick: gap 8s + 6.925s.
	_, err := config.Parse("x.yaml", []byte(strings.Replace(one, "TTL", "14.5s", 1)))
	if want := "keys[q].ttl: smallest jittered ttl 14.5s is not longer than 2 × interval 4s (a run of up to 6.928s skips 1 ticks) + spread 1.878s"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("listed family against its rate: err = %v, want %q", err, want)
	}
	if _, err := config.Parse("x.yaml", []byte(strings.Replace(one, "TTL", "15s", 1))); err != nil {
		t.Errorf("listed family inside the rule: %v", err)
	}
}

// TestSlotWarnings: load slots too few for the loads the declarations
// schedule, each taking up to its load_timeout, are named with the field and
// the least that fits (10 single keys of up to 2s every 3s on one load slot
// had keys missing in 286 of 417 polls, with no word in the log).
func TestSlotWarnings(t *testing.T) {
	var keys strings.Builder
	for i := range 10 {
		fmt.Fprintf(&keys, "  - {name: s%d, key: \"s:%d\", source: db, ttl: 14s, interval: 3s, query: \"SELECT 1\"}\n", i, i)
	}
	cfgText := func(extra string) string {
		return "refresh: {load_timeout: 2s, max_concurrent_loads: SLOTS}\nsources:\n  - {name: db, type: postgres, dsn: \"postgres://u@127.0.0.1/test\"" + extra + "}\nkeys:\n" + keys.String()
	}
	warnings := func(t *testing.T, text string) []string {
		t.Helper()
		cfg, err := config.Parse("w.yaml", []byte(text))
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
		return cfg.Warnings()
	}
	got := warnings(t, strings.Replace(cfgText(", max_in_flight: 7"), "SLOTS", "1", 1))
	if want := "refresh.max_concurrent_loads: 1 loads at a time cannot carry the scheduled loads of the declarations if each takes up to its load_timeout (keys[s0] 1 load of up to 2s every 3s, keys[s1] 1 load of up to 2s every 3s, keys[s2] 1 load of up to 2s every 3s, keys[s3] 1 load of up to 2s every 3s and 6 more: 6.67 loads in flight on average)"; len(got) != 1 || !strings.HasPrefix(got[0], want) {
		t.Errorf("one load slot: warnings %q, want one starting %q", got, want)
	}
	got = warnings(t, strings.Replace(cfgText(", max_in_flight: 1"), "SLOTS", "8", 1))
	if want := "sources[db].max_in_flight: 1 calls in flight cannot carry"; len(got) != 1 || !strings.HasPrefix(got[0], want) || !strings.Contains(got[0], "raise max_in_flight to at least 7") {
		t.Errorf("one call slot: warnings %q, want one starting %q", got, want)
	}
	if got := warnings(t, strings.Replace(cfgText(", max_in_flight: 7"), "SLOTS", "7", 1)); len(got) != 0 {
		t.Errorf("enough slots: warnings %q", got)
	}
}

// TestDurationMessages: a duration the decoder cannot read is named with its
// value (the decoder's own message was "unknown unit" for "1s ", and
// `invalid duration "` for " 1s"), and true is not read as 1ns.
func TestDurationMessages(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{`leader: {retry_period: "1s "}`, `leader.retry_period: invalid duration "1s " (write it like 500ms, 30s or 5m)`},
		{`leader: {retry_period: " 1s"}`, `leader.retry_period: invalid duration " 1s" (write it like 500ms, 30s or 5m)`},
		{`leader: {retry_period: "0x10s"}`, `leader.retry_period: invalid duration "0x10s"`},
		{`leader: {retry_period: "1e3s"}`, `leader.retry_period: invalid duration "1e3s"`},
		{`leader: {retry_period: true}`, `leader.retry_period: must be a duration with a unit, e.g. "1s" (got true)`},
	} {
		_, err := config.Parse("d.yaml", []byte(tc.yaml+"\n"+base))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.yaml, err, tc.want)
		}
	}
	t.Run("from the environment", func(t *testing.T) {
		t.Setenv("HEARTH_LEADER_RETRY_PERIOD", "1s ")
		_, err := config.Parse("env.yaml", []byte(base))
		if want := `leader.retry_period: invalid duration "1s " (write it like 500ms, 30s or 5m) (from environment variable HEARTH_LEADER_RETRY_PERIOD)`; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want %q", err, want)
		}
	})
}

// TestRedisAddrRedacted: a Redis URL pasted into redis.addrs is refused, and
// its password is not printed (it was: `must be host:port (got
// "redis://:hunter2@127.0.0.1:6379")`).
func TestRedisAddrRedacted(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"redis://:hunter2@127.0.0.1:6379", `redis.addrs[0]: must be host:port (got "redis://xxxxx@127.0.0.1:6379")`},
		{"rediss://bob:hunter2@cache:6380/0", `redis.addrs[0]: must be host:port (got "rediss://xxxxx@cache:6380/0")`},
		{"bob:hunter2@127.0.0.1:6379", `redis.addrs[0]: must be host:port (got "xxxxx@127.0.0.1:6379")`},
		{"redis://127.0.0.1:6379?password=hunter2", `redis.addrs[0]: must be host:port (got "redis://127.0.0.1:6379?password=xxxxx")`},
		{"cache", `redis.addrs[0]: must be host:port (got "cache")`},
	} {
		_, err := config.Parse("r.yaml", []byte(fmt.Sprintf("redis: {addrs: [%q]}\n", tc.addr)+base))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: err = %v, want %q and no password", tc.addr, err, tc.want)
		}
	}
}

// TestEnvWarnings: a HEARTH_… variable that overrides nothing (a typo, an
// item of a list) was ignored without a word, the file's value kept; it is
// named in a warning. The variables of real fields, and the admin token, are
// not.
func TestEnvWarnings(t *testing.T) {
	t.Setenv("HEARTH_KEYS_0_TTL", "1s")
	t.Setenv("HEARTH_REFRESH_BATCHSIZE", "7")
	t.Setenv("HEARTH_REFRESH_BATCH_SIZE", "7")
	t.Setenv("HEARTH_ACCESS_LOG_ROLLUP_INTERVAL", "1m")
	t.Setenv("HEARTH_ADMIN_TOKEN", "t")
	cfg, err := config.Parse("env.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	var named []string
	for _, w := range cfg.Warnings() {
		for _, v := range []string{"HEARTH_KEYS_0_TTL", "HEARTH_REFRESH_BATCHSIZE", "HEARTH_REFRESH_BATCH_SIZE", "HEARTH_ACCESS_LOG_ROLLUP_INTERVAL", "HEARTH_ADMIN_TOKEN"} {
			if strings.HasPrefix(w, "environment variable "+v+" ") {
				named = append(named, v)
			}
		}
	}
	if want := []string{"HEARTH_KEYS_0_TTL", "HEARTH_REFRESH_BATCHSIZE"}; !reflect.DeepEqual(named, want) {
		t.Errorf("warnings name %q, want %q", named, want)
	}
	if cfg.Refresh.BatchSize != 7 {
		t.Errorf("batch_size %d, want 7 from HEARTH_REFRESH_BATCH_SIZE", cfg.Refresh.BatchSize)
	}
}
