package bench

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// BenchmarkRefreshAtScale runs the real binary with one family of 100,000
// members, TTL 60 s (interval 30 s, so 3,333 key writes/s intended), and measures
// over two whole intervals of steady state (one interval after the start-up load): achieved vs intended refresh
// rate, scheduling lag p99, the daemon's CPU and its peak RSS.
func BenchmarkRefreshAtScale(b *testing.B) {
	const (
		members  = 100_000
		ttl      = 60 * time.Second
		interval = ttl / 2
	)
	rd := testenv.Redis(b)
	pg := testenv.Postgres(b)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE members (id text PRIMARY KEY, v text NOT NULL);
		INSERT INTO members SELECT i::text, repeat('x', 64) || i FROM generate_series(1, %d) i;
		ANALYZE members;`, members)); err != nil {
		b.Fatal(err)
	}
	listen := e2e.FreeAddr(b)
	cfg := filepath.Join(b.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
redis:
  addrs: [%q]
  namespace: %s
http:
  listen: %q
log:
  format: json
refresh:
  max_members: 200000
sources:
  - name: db
    type: postgres
    dsn: %q
keys:
  - name: member
    key: "%sm:{id}"
    source: db
    ttl: %s
    members_query: "SELECT id FROM members"
    query: "SELECT id, v FROM members WHERE id = ANY($1)"
`, rd.Addr, e2e.Namespace(b, rd.Client), listen, pg.DSN, rd.Prefix, ttl)), 0o600); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		proc := e2e.Start(b, []string{"run", "--config", cfg})
		t0 := time.Now()
		proc.WaitHTTP(b, "http://"+listen+"/readyz", http.StatusOK, 2*time.Minute)
		startup := time.Since(t0)

		// The start-up load writes everything at once; steady state starts one
		// interval later, when every key has been refreshed on schedule once.
		time.Sleep(interval)
		pid := proc.Cmd.Process.Pid
		m0 := e2e.Metrics(b, "http://"+listen+"/metrics")
		cpu0, w0 := cpuTime(b, pid), time.Now()
		time.Sleep(2 * interval)
		m1 := e2e.Metrics(b, "http://"+listen+"/metrics")
		cpu1, w1 := cpuTime(b, pid), time.Now()
		peak := peakRSS(b, pid)

		window := w1.Sub(w0)
		f := steadyFigures(m0, m1, cpu1-cpu0, window, members, interval)
		achieved, intended, cpu, p99 := f.achieved, f.intended, f.cpu, f.p99

		b.ReportMetric(achieved, "writes/s")
		b.ReportMetric(achieved/intended*100, "%rate")
		b.ReportMetric(p99*1000, "lag-p99-ms")
		b.ReportMetric(cpu, "%cpu")
		b.ReportMetric(float64(peak)/(1<<20), "peak-MiB")
		fmt.Printf("\nrefresh at scale: %d members, ttl %s, interval %s, measured over %s after a %s start-up load\n",
			members, ttl, interval, window.Round(time.Millisecond), startup.Round(time.Millisecond))
		fmt.Printf("  refresh rate   %.0f keys/s achieved vs %.0f intended = %.2f%% (target ≥ 99.9%%)\n", achieved, intended, achieved/intended*100)
		fmt.Printf("  schedule lag   p99 ≤ %.1f ms (bucket bound; target < 100 ms)\n", p99*1000)
		fmt.Printf("  daemon CPU     %.1f%% of one core (target < 25%%)\n", cpu)
		fmt.Printf("  peak RSS       %.1f MiB (target < 150 MB)\n", float64(peak)/(1<<20))

		proc.Signal(b, 15)
		if code := proc.Wait(b, 30*time.Second); code != 0 {
			b.Fatalf("exit %d", code)
		}
	}
}

// steady holds what a refresh benchmark measures between two scrapes of the
// daemon's /metrics: value writes per second achieved and intended, the
// daemon's CPU in % of one core, and the scheduling lag's p50 and p99
// (bucket bounds, seconds).
type steady struct {
	achieved, intended, cpu, p50, p99 float64
}

func steadyFigures(m0, m1 map[string]float64, cpu, window time.Duration, members int, interval time.Duration) steady {
	written := e2e.Sum(m1, "hearth_keys_written_total", `kind="value"`) - e2e.Sum(m0, "hearth_keys_written_total", `kind="value"`)
	return steady{
		achieved: written / window.Seconds(),
		intended: float64(members) / interval.Seconds(),
		cpu:      cpu.Seconds() / window.Seconds() * 100,
		p50:      histQuantile(0.50, lagBuckets(m1), lagBuckets(m0)),
		p99:      histQuantile(0.99, lagBuckets(m1), lagBuckets(m0)),
	}
}

// cpuTime is the user+system CPU a process has used (from /proc).
func cpuTime(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration((utime + stime) / ticks * float64(time.Second))
}

// peakRSS is the process's high-water resident set (VmHWM), in bytes.
func peakRSS(b *testing.B, pid int) int64 { return procStatus(b, pid, "VmHWM") }

// procStatus reads one size field (in kB) of /proc/pid/status, in bytes.
func procStatus(b *testing.B, pid int, field string) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	b.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

type bucket struct {
	le    float64
	count float64
}

func lagBuckets(m map[string]float64) []bucket {
	var out []bucket
	for series, v := range m {
		if !strings.HasPrefix(series, "hearth_schedule_lag_seconds_bucket{") {
			continue
		}
		i := strings.Index(series, `le="`)
		le, err := strconv.ParseFloat(strings.TrimSuffix(series[i+4:], `"}`), 64)
		if err != nil {
			le = math.Inf(1)
		}
		out = append(out, bucket{le, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].le < out[j].le })
	return out
}

// histQuantile returns the upper bound of the bucket holding quantile q of the
// observations made between two scrapes.
func histQuantile(q float64, after, before []bucket) float64 {
	prev := map[float64]float64{}
	for _, b := range before {
		prev[b.le] = b.count
	}
	if len(after) == 0 {
		return math.NaN()
	}
	total := after[len(after)-1].count - prev[after[len(after)-1].le]
	for _, b := range after {
		if b.count-prev[b.le] >= q*total {
			return b.le
		}
	}
	return math.Inf(1)
}

// median is the middle of xs (the mean of the two middle ones when even),
// sorting xs in place.
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n == 0 {
		return math.NaN()
	}
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// machineCPU reads /proc/stat's first line: the time every core of the
// machine spent busy (all but idle and iowait) and in all, in seconds.
func machineCPU(b *testing.B) (busy, total float64) {
	busy, total, _ = machineCPUSteal(b)
	return busy, total
}

// machineCPUSteal is machineCPU with the time the hypervisor took from the
// machine's cores (steal, counted in busy too): a stall no process on the
// machine caused.
func machineCPUSteal(b *testing.B) (busy, total, steal float64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseFloat(f, 64)
		if i < 8 { // user nice system idle iowait irq softirq steal (guest is in user)
			total += v / 100
			if i != 3 && i != 4 {
				busy += v / 100
			}
			if i == 7 {
				steal += v / 100
			}
		}
	}
	return busy, total, steal
}

// commandCPU sums the CPU time (user + system) of every process whose
// command name is comm (PostgreSQL's backends and workers: "postgres"); a
// process that ended in between is not counted.
func commandCPU(comm string) time.Duration {
	dirs, _ := os.ReadDir("/proc")
	var sum time.Duration
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(data)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || s[open+1:end] != comm {
			continue
		}
		fields := strings.Fields(s[end+2:])
		utime, _ := strconv.ParseFloat(fields[11], 64)
		stime, _ := strconv.ParseFloat(fields[12], 64)
		sum += time.Duration((utime + stime) / 100 * float64(time.Second))
	}
	return sum
}
