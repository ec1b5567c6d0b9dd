package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// BenchmarkRefreshMillion runs the real binary with one family of 1,000,000
// members (a members query), TTL 60 s (interval 30 s: 33,333 key writes/s
// intended), against a private Redis, and measures over three whole
// intervals of steady state: achieved vs intended write rate, scheduling lag
// p99 (run starts and paced batches), the daemon's CPU (in % of one core and
// in µs per key written, the figure that carries across machines), RSS (at
// the end and peak), Redis's own CPU (INFO cpu, user + sys, over the same
// window) and, from a separate client polling 1,000 sampled keys every
// 250 ms, the smallest remaining TTL seen and how many samples found a key
// missing.
//
// Two declarations, one after the other in one run, each with the Redis
// flushed before it: shipped (config.yaml's style: a param_pattern, the
// leader lease, info logs, a 96-byte text payload) and versioned (the same
// with a version_column, the row's xmin: every write version-checked).
// HEARTH_BENCH_CONFIGS picks some (comma-separated, also "plain": the bench
// config of earlier rounds, no pattern, a 64–71-byte payload);
// HEARTH_BASELINE_BIN=path runs every declaration against that binary first
// (a build of main, say), so that before and after come from one run;
// HEARTH_BENCH_ROUNDS=n runs each declaration n times, the builds in
// alternating order (A B, B A, …), and prints each build's medians and the
// median of the pairs' ratios, so that the machine's drift within the run
// falls on both builds alike.
// HEARTH_BENCH_MEMBERS, HEARTH_BENCH_TTL and HEARTH_BENCH_INTERVALS (the
// window, in intervals) scale it down; HEARTH_BENCH_CPUPROFILE=path saves a
// 20 s CPU profile of each daemon (path.<build>.<config>, and its heap
// profile at .heap) from inside the window, for go tool pprof;
// HEARTH_BENCH_LOGDIR=dir keeps each daemon's log there.
//
// Beside the outside view, what the daemon said of the same run: its
// start-up catch-up (keys due, refreshed, how long) from its log, and its
// falling-behind warnings and overruns (hearth_refresh_behind_total,
// hearth_refresh_overruns_total) from start to end. A key missing from
// outside with nothing said inside is the silent expiry target 5 forbids.
func BenchmarkRefreshMillion(b *testing.B) {
	members := envInt("HEARTH_BENCH_MEMBERS", 1_000_000)
	ttl := envDuration("HEARTH_BENCH_TTL", 60*time.Second)
	intervals := envInt("HEARTH_BENCH_INTERVALS", 3)
	rounds := max(1, envInt("HEARTH_BENCH_ROUNDS", 1))
	interval := ttl / 2
	rs := testenv.PrivateRedis(b)
	rdb := rs.Client(b)
	pg := testenv.Postgres(b)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE members (id bigint PRIMARY KEY, v text NOT NULL, p text NOT NULL);
		INSERT INTO members SELECT i, repeat('x', 64) || i, lpad(i::text, 96, 'x') FROM generate_series(1, %d) i;
		`, members)); err != nil {
		b.Fatal(err)
	}
	// Vacuumed (and so not left to autovacuum) before any build runs, so
	// that no build pays for the first scan of fresh rows, which sets their
	// hint bits: the build that ran first twice took 45 s instead of 23 to
	// load at start, and fell behind.
	if _, err := pg.Pool.Exec(ctx, `VACUUM (FREEZE, ANALYZE) members`); err != nil {
		b.Fatal(err)
	}
	decls := map[string]string{
		"plain": `    query: "SELECT id::text, v FROM members WHERE id = ANY($1::bigint[])"`,
		"shipped": `    param_pattern: "[0-9]{1,12}"
    query: "SELECT id::text, p FROM members WHERE id = ANY($1::bigint[])"`,
		"versioned": `    param_pattern: "[0-9]{1,12}"
    query: "SELECT id::text, p, xmin::text::bigint AS ver FROM members WHERE id = ANY($1::bigint[])"
    version_column: ver`,
	}
	configs := []string{"shipped", "versioned"}
	if v := os.Getenv("HEARTH_BENCH_CONFIGS"); v != "" {
		configs = strings.Split(v, ",")
	}
	for _, c := range configs {
		if decls[c] == "" {
			b.Fatalf("HEARTH_BENCH_CONFIGS: no declaration %q (plain, shipped, versioned)", c)
		}
	}
	type build struct{ label, bin string }
	builds := []build{{"this build", e2e.PlainBinary(b)}}
	if base := os.Getenv("HEARTH_BASELINE_BIN"); base != "" {
		builds = append([]build{{"baseline", base}}, builds...)
	}
	profile := os.Getenv("HEARTH_BENCH_CPUPROFILE")
	pprof := "" // only when asked: a binary of another commit may not know the field
	if profile != "" {
		pprof = "\n  pprof: true"
	}
	type result struct {
		build, config string
		base          string // the build's label without its round
		f             steady
		usPerKey      float64
		rss, peak     int64
		redisCPU      float64
		minTTL        time.Duration
		missing       int
		polls         int
		startup       time.Duration
		catchUp       string
		behind        float64
		overruns      float64
	}
	for range b.N {
		var results []result
		for _, c := range configs {
			for round := range rounds {
				order := slices.Clone(builds)
				if round%2 == 1 {
					slices.Reverse(order) // A B, B A, …: the machine's drift falls on both
				}
				for _, bd := range order {
					if err := rdb.FlushAll(ctx).Err(); err != nil { // a private server
						b.Fatal(err)
					}
					listen := e2e.FreeAddr(b)
					cfg := filepath.Join(b.TempDir(), "config.yaml")
					if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
redis:
  addrs: [%q]
  namespace: hb
http:
  listen: %q%s
log:
  format: json
  level: info
leader:
  enabled: true
refresh:
  max_members: %d
prewarm:
  enabled: false
sources:
  - name: db
    type: postgres
    dsn: %q
keys:
  - name: member
    key: "m:{id}"
    source: db
    ttl: %s
    members_query: "SELECT id::text FROM members"
%s
`, rs.Addr, listen, pprof, members+1, pg.DSN, ttl, decls[c])), 0o600); err != nil {
						b.Fatal(err)
					}
					proc := e2e.StartBinary(b, bd.bin, []string{"run", "--config", cfg})
					t0 := time.Now()
					proc.WaitHTTP(b, "http://"+listen+"/readyz", http.StatusOK, 3*time.Minute)
					startup := time.Since(t0)

					// Steady state starts one interval later, when every key has
					// been refreshed on schedule once after the start-up load.
					time.Sleep(interval)
					s := startSampler(rdb, members, 1000)
					pid := proc.Cmd.Process.Pid
					m0 := e2e.Metrics(b, "http://"+listen+"/metrics")
					cpu0, r0, w0 := cpuTime(b, pid), redisCPU(b, rdb), time.Now()
					if profile != "" {
						path := profile + "." + strings.ReplaceAll(strings.Fields(bd.label)[0], " ", "") + "." + c
						fetchProfile(b, "http://"+listen+"/debug/pprof/profile?seconds=20", path)
						fetchProfile(b, "http://"+listen+"/debug/pprof/heap", path+".heap")
					}
					time.Sleep(time.Until(w0.Add(time.Duration(intervals) * interval)))
					m1 := e2e.Metrics(b, "http://"+listen+"/metrics")
					cpu1, r1, w1 := cpuTime(b, pid), redisCPU(b, rdb), time.Now()
					rss, peak := rssNow(b, pid), peakRSS(b, pid)
					minTTL, missing, polls := s.stop()
					window := w1.Sub(w0)
					f := steadyFigures(m0, m1, cpu1-cpu0, window, members, interval)
					written := f.achieved * window.Seconds()
					label := bd.label
					if rounds > 1 {
						label = fmt.Sprintf("%s #%d", bd.label, round+1)
					}
					results = append(results, result{
						build: label, base: bd.label, config: c, f: f,
						usPerKey: (cpu1 - cpu0).Seconds() * 1e6 / max(1, written),
						rss:      rss, peak: peak, redisCPU: (r1 - r0) / window.Seconds() * 100,
						minTTL: minTTL, missing: missing, polls: polls, startup: startup,
					})
					results[len(results)-1].behind = e2e.Sum(m1, "hearth_refresh_behind_total")
					results[len(results)-1].overruns = e2e.Sum(m1, "hearth_refresh_overruns_total")
					proc.Signal(b, 15)
					if code := proc.Wait(b, 60*time.Second); code != 0 {
						b.Fatalf("%s, %s: exit %d", bd.label, c, code)
					}
					results[len(results)-1].catchUp = startupCatchUp(proc.Output())
					if dir := os.Getenv("HEARTH_BENCH_LOGDIR"); dir != "" {
						name := filepath.Join(dir, strings.ReplaceAll(label, " ", "_")+"."+c+".log")
						if err := os.WriteFile(name, []byte(proc.Output()), 0o644); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
		}

		fmt.Printf("\nrefresh of %d members, ttl %s, interval %s, each measured over %d intervals after one interval of steady state (builds: %s)\n",
			members, ttl, interval, intervals, builds[len(builds)-1].bin)
		if len(builds) > 1 {
			fmt.Printf("  baseline: %s\n", builds[0].bin)
		}
		row := func(name string, cell func(r result) string) {
			fmt.Printf("  %-26s", name)
			for _, r := range results {
				fmt.Printf(" | %-26s", cell(r))
			}
			fmt.Println()
		}
		row("", func(r result) string { return r.config + ", " + r.build })
		row("write rate / intended", func(r result) string { return fmt.Sprintf("%.2f %%", r.f.achieved/r.f.intended*100) })
		row("schedule lag p50 / p99", func(r result) string { return fmt.Sprintf("≤ %.0f / ≤ %.0f ms", r.f.p50*1000, r.f.p99*1000) })
		row("daemon CPU, % of a core", func(r result) string { return fmt.Sprintf("%.1f %%", r.f.cpu) })
		row("daemon CPU per key", func(r result) string { return fmt.Sprintf("%.2f µs", r.usPerKey) })
		row("RSS end / peak", func(r result) string {
			return fmt.Sprintf("%.0f / %.0f MiB", float64(r.rss)/(1<<20), float64(r.peak)/(1<<20))
		})
		row("Redis CPU, % of a core", func(r result) string { return fmt.Sprintf("%.1f %%", r.redisCPU) })
		row("sampled: missing / polls", func(r result) string { return fmt.Sprintf("%d / %d", r.missing, r.polls) })
		row("sampled: min TTL left", func(r result) string { return fmt.Sprintf("%.1f s", r.minTTL.Seconds()) })
		row("start-up load", func(r result) string { return r.startup.Round(100 * time.Millisecond).String() })
		row("start-up catch-up", func(r result) string { return r.catchUp })
		row("said: behind / overruns", func(r result) string { return fmt.Sprintf("%.0f / %.0f", r.behind, r.overruns) })
		fmt.Println("  targets: write rate ≥ 99.9 %, lag p99 < 100 ms, daemon CPU ≤ 10 % (shipped) / ≤ 12 % (versioned), RSS < 300 MB, Redis CPU (versioned) < 40 %, no key missing")
		// With rounds, the medians per build and, against a baseline, the
		// ratio of each round's pair: what the drift between rounds does
		// not move.
		pick := func(c, base string, f func(result) float64) []float64 {
			var out []float64
			for _, r := range results {
				if r.config == c && r.base == base {
					out = append(out, f(r))
				}
			}
			return out
		}
		usKey := func(r result) float64 { return r.usPerKey }
		cpu := func(r result) float64 { return r.f.cpu }
		redisPct := func(r result) float64 { return r.redisCPU }
		for _, c := range configs {
			if rounds > 1 {
				for _, bd := range builds {
					fmt.Printf("  %s, %s: median of %d rounds %.2f µs per key, %.1f %% of a core, Redis %.1f %%\n", c, bd.label, rounds,
						median(pick(c, bd.label, usKey)), median(pick(c, bd.label, cpu)), median(pick(c, bd.label, redisPct)))
				}
				if len(builds) > 1 {
					before, after := pick(c, builds[0].label, usKey), pick(c, builds[1].label, usKey)
					ratios := make([]float64, len(before))
					lower := 0
					for i := range before {
						ratios[i] = after[i] / before[i]
						if after[i] < before[i] {
							lower++
						}
					}
					fmt.Printf("  %s: this build / baseline, µs per key, round by round: median %.3f, lower in %d of %d\n", c, median(ratios), lower, rounds)
				}
			}
			b.ReportMetric(median(pick(c, "this build", cpu)), c+"-%cpu")
			b.ReportMetric(median(pick(c, "this build", usKey)), c+"-µs/key")
			b.ReportMetric(median(pick(c, "this build", redisPct)), c+"-redis-%cpu")
			b.ReportMetric(median(pick(c, "this build", func(r result) float64 { return float64(r.peak) / (1 << 20) })), c+"-peak-MiB")
		}
	}
}

// startupCatchUp reads the daemon's "start-up catch-up finished" line (JSON
// logs): keys due, refreshed and how long it took, or "?" when not found.
func startupCatchUp(log string) string {
	for line := range strings.Lines(log) {
		var l struct {
			Message   string  `json:"message"`
			Due       int     `json:"due"`
			Refreshed int     `json:"refreshed"`
			Took      float64 `json:"took_ms"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Message == "start-up catch-up finished" {
			return fmt.Sprintf("%d due, %d in %.1fs", l.Due, l.Refreshed, l.Took/1000)
		}
	}
	return "?"
}

// redisCPU is the Redis server's CPU time so far (INFO cpu: used_cpu_user +
// used_cpu_sys), in seconds.
func redisCPU(b *testing.B, rdb *redis.Client) float64 {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	sum := 0.0
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			n, _ := strconv.ParseFloat(v, 64)
			sum += n
		}
	}
	return sum
}

// sampler polls the PTTL of sampled keys from a client of its own.
type sampler struct {
	stopc   chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	minTTL  time.Duration
	missing int
	polls   int
}

func startSampler(rdb *redis.Client, members, n int) *sampler {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "m:" + strconv.Itoa(1+rand.IntN(members))
	}
	s := &sampler{stopc: make(chan struct{}), minTTL: time.Duration(math.MaxInt64)}
	s.wg.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stopc:
				return
			case <-t.C:
			}
			pipe := rdb.Pipeline()
			cmds := make([]*redis.DurationCmd, len(keys))
			for i, k := range keys {
				cmds[i] = pipe.PTTL(context.Background(), k)
			}
			if _, err := pipe.Exec(context.Background()); err != nil && err != redis.Nil {
				continue
			}
			s.mu.Lock()
			for _, c := range cmds {
				s.polls++
				switch d := c.Val(); {
				case d < 0:
					s.missing++ // -2: no such key; -1: no TTL (not Hearth's write)
				default:
					s.minTTL = min(s.minTTL, d)
				}
			}
			s.mu.Unlock()
		}
	})
	return s
}

func (s *sampler) stop() (time.Duration, int, int) {
	close(s.stopc)
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.minTTL, s.missing, s.polls
}

// fetchProfile saves what url answers (a pprof profile) at path.
func fetchProfile(b *testing.B, url, path string) {
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("%s: %d %v", url, resp.StatusCode, err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		b.Fatal(err)
	}
}

// rssNow is the process's resident set (VmRSS), in bytes.
func rssNow(b *testing.B, pid int) int64 { return procStatus(b, pid, "VmRSS") }

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
