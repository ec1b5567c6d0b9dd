package main_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// propSeed is the fixed seed. Against the binary before units and bounds
// (HEARTH_BIN), it runs a family with interval: 1.5 (1.5 ns), which validate
// accepted there: its keys expired, the daemon burnt a quarter of a core and
// ignored SIGTERM.
const propSeed = 2

// The property test's sizes: validate-only cases per seed (fast), and how
// many of the accepted configs each seed runs for real.
const (
	propValidateCases = 30
	propRunsPerSeed   = 1
)

// edgeDurations are what a careless or hostile config writes for a
// duration: bare numbers (YAML int, float, string), a nanosecond, negative,
// huge, NaN and Inf. A millisecond is among them for the fields where
// Hearth must refuse it; origin-facing timeouts leave it out, since an
// origin given 1 ms is not a healthy origin (every load fails by design).
var edgeDurations = []string{"0", "1", "1.5", `"1"`, "1ns", "-1s", "2562047h", ".nan", ".inf", "1e300"}

// edgeNumbers are the same for a fraction or a count.
var edgeNumbers = []string{"0", "1", "-1", "1.5", ".nan", ".inf", "-.inf", "1e300"}

// propField is one value of the generated config: where it goes, its sane
// values (what a run can live with) and whether 1ms is one of its edges.
type propField struct {
	slot   string
	sane   []string
	number bool
	ms     bool
}

var propFields = []propField{
	{slot: "TTL", sane: []string{"1s", "2s"}},
	{slot: "INTERVAL", sane: []string{"0", "300ms", "500ms"}, ms: true},
	{slot: "FTTL", sane: []string{"2s"}},
	{slot: "FINTERVAL", sane: []string{"0", "1s"}, ms: true},
	{slot: "LOAD", sane: []string{"200ms", "300ms"}},
	{slot: "SPREAD", sane: []string{"0", "0.2", "0.5"}, number: true},
	{slot: "JITTER", sane: []string{"0", "0.1", "0.2"}, number: true},
	{slot: "NEG", sane: []string{"1s"}, ms: true},
	{slot: "SHUTDOWN", sane: []string{"1s", "5s"}, ms: true},
	{slot: "LEASE", sane: []string{"0"}, ms: true},
	{slot: "RENEW", sane: []string{"0", "200ms"}, ms: true},
	{slot: "RETRY", sane: []string{"0"}, ms: true},
	{slot: "ROLLUP", sane: []string{"0", "15s"}, ms: true},
	{slot: "RANK", sane: []string{"0", "1m"}, ms: true},
	{slot: "REWARM", sane: []string{"0", "500ms"}, ms: true},
	{slot: "READ", sane: []string{"2s"}, ms: true},
	{slot: "DIAL", sane: []string{"2s"}, ms: true},
	{slot: "TIMEOUT", sane: []string{"1s"}},
	{slot: "BATCH", sane: []string{"2", "500"}, number: true},
	{slot: "LOADS", sane: []string{"4", "8"}, number: true},
}

const propTemplate = `redis: {addrs: [{{ADDR}}], namespace: {{NS}}, read_timeout: {{READ}}, dial_timeout: {{DIAL}}}
log: {level: info, format: json}
refresh: {load_timeout: {{LOAD}}, spread: {{SPREAD}}, jitter: {{JITTER}}, negative_ttl: {{NEG}}, shutdown_timeout: {{SHUTDOWN}}, batch_size: {{BATCH}}, max_concurrent_loads: {{LOADS}}}
leader: {lease: {{LEASE}}, renew_interval: {{RENEW}}, retry_period: {{RETRY}}}
access_log: {rollup_interval: {{ROLLUP}}, rank_interval: {{RANK}}}
prewarm: {rewarm_check: {{REWARM}}}
sources:
  - {name: up, type: http, base_url: {{URL}}, timeout: {{TIMEOUT}}}
keys:
  - {name: single, key: "{{PREFIX}}single", source: up, ttl: {{TTL}}, interval: {{INTERVAL}}, path: /single}
  - {name: fam, key: "{{PREFIX}}fam:{id}", source: up, ttl: {{FTTL}}, interval: {{FINTERVAL}}, members: [a, b, c, d, e, f], path: "/fam/{id}"}
`

// propCase is one generated config.
type propCase struct {
	values map[string]string
	edges  []string // the slots given an edge value, for the log
}

// genCase draws a config. Case i < len(propFields) sweeps field i: it alone
// takes an edge value, so that every field is tried on its own each run;
// later cases draw every field edge or sane, some all sane.
func genCase(rng *rand.Rand, i int) propCase {
	c := propCase{values: map[string]string{}}
	p := rng.Float64() * 0.2 // how edgy this config is
	for j, f := range propFields {
		v := f.sane[rng.IntN(len(f.sane))]
		if edge := (i < len(propFields) && i == j) || (i >= len(propFields) && rng.Float64() < p); edge {
			pool := edgeDurations
			if f.number {
				pool = edgeNumbers
			} else if f.ms {
				pool = append(pool[:len(pool):len(pool)], "1ms")
			}
			v = pool[rng.IntN(len(pool))]
			c.edges = append(c.edges, f.slot+"="+v)
		}
		c.values[f.slot] = v
	}
	return c
}

// suspicious counts the edge values other than 0.
func (c propCase) suspicious() int {
	n := 0
	for _, e := range c.edges {
		if !strings.HasSuffix(e, "=0") {
			n++
		}
	}
	return n
}

func (c propCase) render(rd *opsRedis, url string) string {
	s := propTemplate
	for k, v := range c.values {
		s = strings.ReplaceAll(s, "{{"+k+"}}", v)
	}
	return strings.NewReplacer("{{ADDR}}", strconv.Quote(rd.Addr), "{{NS}}", strconv.Quote(rd.Namespace),
		"{{URL}}", strconv.Quote(url), "{{PREFIX}}", rd.Prefix).Replace(s)
}

// fieldNamed is a validate error line that names a field: file[:line]: path: message.
var fieldNamed = regexp.MustCompile(`config\.yaml(:[0-9]+)?: [a-z_]+(\[[^\]]*\])?(\.[a-z_]+(\[[^\]]*\])?)*: \S`)

// TestPropertyEdgeConfigs throws configs whose every duration and number is
// drawn from edge values (bare numbers, 1ns, 1ms, negative, huge, NaN, Inf)
// or sane ones at `hearth validate` (the built binary): each is either
// refused with exit 2 and an error naming a field, or accepted, and then an
// accepted one run for real (`hearth run`, real Redis, an HTTP origin) for
// three TTLs keeps its own CPU below 25% of a core, keeps every declared key
// present (an outside client polls them all) and exits within 2s of SIGTERM.
// A fixed seed and a random one (logged) run; HEARTH_PROPERTY_SEED replays one.
func TestPropertyEdgeConfigs(t *testing.T) {
	t.Parallel()
	seeds := []uint64{propSeed}
	if s := os.Getenv("HEARTH_PROPERTY_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("HEARTH_PROPERTY_SEED=%q: %v", s, err)
		}
		seeds = []uint64{n}
	} else {
		seeds = append(seeds, rand.Uint64())
	}
	bin := e2e.Binary(t)
	rd := sharedRedis(t)
	up := newOrigin(t)
	dir := t.TempDir()
	for _, seed := range seeds {
		t.Logf("seed %d (replay: HEARTH_PROPERTY_SEED=%d go test ./cmd/hearth -run TestPropertyEdgeConfigs)", seed, seed)
		rng := rand.New(rand.NewPCG(seed, seed>>7|1))
		var accepted []propCase
		refused := 0
		for i := range propValidateCases {
			c := genCase(rng, i)
			path := filepath.Join(dir, fmt.Sprintf("%d-%d", seed, i), "config.yaml")
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(c.render(rd, up.URL)), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(bin, "validate", "--config", path).CombinedOutput()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			switch code {
			case 0:
				accepted = append(accepted, c)
			case 2:
				refused++
				if len(c.edges) == 0 {
					t.Logf("seed %d case %d: sane config refused:\n%s", seed, i, out)
				}
				if !fieldNamed.Match(out) {
					t.Errorf("seed %d case %d (%v): refused without naming a field:\n%s", seed, i, c.edges, out)
				}
			default:
				t.Errorf("seed %d case %d (%v): validate exited %d, want 0 or 2:\n%s", seed, i, c.edges, code, out)
			}
		}
		t.Logf("seed %d: %d refused, %d accepted", seed, refused, len(accepted))
		// The accepted configs with the most suspicious values run, the
		// likeliest to hurt (0 is a documented value of most fields; a
		// bare 1 or 1ns is not); among equals, a random one.
		rng.Shuffle(len(accepted), func(i, j int) { accepted[i], accepted[j] = accepted[j], accepted[i] })
		slices.SortStableFunc(accepted, func(a, b propCase) int { return b.suspicious() - a.suspicious() })
		for i, c := range accepted[:min(propRunsPerSeed, len(accepted))] {
			t.Run(fmt.Sprintf("seed %d run %d", seed, i), func(t *testing.T) {
				t.Logf("edges: %v", c.edges)
				runProperty(t, c.render(rd, up.URL), rd, []string{"single", "fam:a", "fam:b", "fam:c", "fam:d", "fam:e", "fam:f"})
			})
		}
	}
	// The tight-timing rule's neighbour, just inside it: three batches paced
	// over half a 1s interval, a 300ms load, a 2s TTL jittered by 0.2: 1s +
	// 333ms + 300ms + 50ms = 1.68s < 1.8s. It must run without a gap.
	t.Run("just inside the timing rule", func(t *testing.T) {
		c := propCase{values: map[string]string{}}
		for _, f := range propFields {
			c.values[f.slot] = f.sane[0]
		}
		for k, v := range map[string]string{"TTL": "2s", "INTERVAL": "1s", "FTTL": "2s", "FINTERVAL": "1s", "LOAD": "300ms", "SPREAD": "0.5", "JITTER": "0.2", "BATCH": "2", "LEASE": "0", "RETRY": "0"} {
			c.values[k] = v
		}
		cfg := c.render(rd, up.URL)
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bin, "validate", "--config", path).CombinedOutput(); err != nil {
			t.Fatalf("the config just inside the rule was refused: %v\n%s", err, out)
		}
		runProperty(t, cfg, rd, []string{"single", "fam:a", "fam:b", "fam:c", "fam:d", "fam:e", "fam:f"})
	})
}

// runProperty runs hearth on cfg until every key exists, then for three of
// its longest TTLs polls every key from outside every 20ms (none may be
// missing) and reads the process's CPU time, then sends SIGTERM.
func runProperty(t *testing.T, cfg string, rd *opsRedis, members []string) {
	t.Helper()
	d := startDaemon(t, cfg)
	keys := make([]string, len(members))
	for i, m := range members {
		keys[i] = rd.Prefix + m
	}
	ctx := context.Background()
	testenv.Eventually(t, 10*time.Second, "every key written", func() bool {
		return rd.Exists(ctx, keys...).Val() == int64(len(keys))
	})
	pid := d.Cmd.Process.Pid
	cpu0, wall0 := cpuTime(t, pid), time.Now()
	window := 3 * 2 * time.Second // three of the longest TTL the generator draws
	missing := map[string]int{}
	polls := 0
	for time.Since(wall0) < window {
		pipe := rd.Pipeline()
		cmds := make([]interface{ Val() int64 }, len(keys))
		for i, k := range keys {
			cmds[i] = pipe.Exists(ctx, k)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatalf("poll: %v", err)
		}
		for i, c := range cmds {
			if c.Val() != 1 {
				missing[keys[i]]++
			}
		}
		polls++
		time.Sleep(20 * time.Millisecond)
	}
	cpu, wall := cpuTime(t, pid)-cpu0, time.Since(wall0)
	if len(missing) > 0 {
		t.Errorf("keys missing in %v of %d polls", missing, polls)
	}
	share := cpu.Seconds() / wall.Seconds()
	if share >= 0.25 {
		t.Errorf("hearth used %s of CPU in %s: %.0f%% of a core, want < 25%%", cpu, wall.Round(time.Millisecond), 100*share)
	}
	t.Logf("%d polls, %d keys ever missing; CPU %s in %s (%.1f%% of a core)", polls, len(missing), cpu, wall.Round(time.Millisecond), 100*share)
	start := time.Now()
	d.Signal(t, syscall.SIGTERM)
	if code := d.Wait(t, 2*time.Second); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0:\n%s", code, d.Output())
	}
	t.Logf("exited %s after SIGTERM", time.Since(start).Round(time.Millisecond))
}

// cpuTime reads a process's user + system CPU time from /proc/<pid>/stat.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The command (field 2) may hold spaces: fields count from after its ')'.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("parse /proc/%d/stat: %q", pid, data)
	}
	const clkTck = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / clkTck
}
