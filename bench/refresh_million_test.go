package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
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
// p99 (run starts and paced batches), the daemon's CPU, RSS (at the end and
// peak), and, from a separate client polling 1,000 sampled keys every 250 ms,
// the smallest remaining TTL seen and how many samples found a key missing.
// HEARTH_BENCH_MEMBERS and HEARTH_BENCH_TTL scale it down,
// HEARTH_BENCH_VERSIONED=1 version-checks every write;
// HEARTH_BENCH_CPUPROFILE=path saves a 20 s CPU profile of the daemon (and
// its heap profile at path.heap) from inside the window, for go tool pprof.
func BenchmarkRefreshMillion(b *testing.B) {
	members := envInt("HEARTH_BENCH_MEMBERS", 1_000_000)
	ttl := envDuration("HEARTH_BENCH_TTL", 60*time.Second)
	interval := ttl / 2
	rs := testenv.PrivateRedis(b)
	rdb := rs.Client(b)
	pg := testenv.Postgres(b)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE members (id bigint PRIMARY KEY, v text NOT NULL);
		INSERT INTO members SELECT i, repeat('x', 64) || i FROM generate_series(1, %d) i;
		ANALYZE members;`, members)); err != nil {
		b.Fatal(err)
	}
	// HEARTH_BENCH_VERSIONED=1 version-checks every write (the row's xmin as
	// its version), as a declaration with notify or a version_column is.
	query := `    query: "SELECT id::text, v FROM members WHERE id = ANY($1::bigint[])"` + "\n"
	versioned := os.Getenv("HEARTH_BENCH_VERSIONED") == "1"
	if versioned {
		query = `    query: "SELECT id::text, v, xmin::text::bigint AS ver FROM members WHERE id = ANY($1::bigint[])"` + "\n" +
			"    version_column: ver\n"
	}
	pprof := "" // only when asked: a binary of another commit may not know the field
	if os.Getenv("HEARTH_BENCH_CPUPROFILE") != "" {
		pprof = "\n  pprof: true"
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
%s`, rs.Addr, listen, pprof, members+1, pg.DSN, ttl, query)), 0o600); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		proc := e2e.Start(b, []string{"run", "--config", cfg})
		t0 := time.Now()
		e2e.WaitHTTP(b, "http://"+listen+"/readyz", http.StatusOK, 3*time.Minute)
		startup := time.Since(t0)

		// Steady state starts one interval later, when every key has been
		// refreshed on schedule once after the start-up load.
		time.Sleep(interval)
		s := startSampler(rdb, members, 1000)
		pid := proc.Cmd.Process.Pid
		m0 := e2e.Metrics(b, "http://"+listen+"/metrics")
		cpu0, w0 := cpuTime(b, pid), time.Now()
		if path := os.Getenv("HEARTH_BENCH_CPUPROFILE"); path != "" {
			fetchProfile(b, "http://"+listen+"/debug/pprof/profile?seconds=20", path)
			fetchProfile(b, "http://"+listen+"/debug/pprof/heap", path+".heap")
		}
		time.Sleep(time.Until(w0.Add(3 * interval)))
		m1 := e2e.Metrics(b, "http://"+listen+"/metrics")
		cpu1, w1 := cpuTime(b, pid), time.Now()
		rss, peak := rssNow(b, pid), peakRSS(b, pid)
		minTTL, missing, polls := s.stop()

		window := w1.Sub(w0)
		f := steadyFigures(m0, m1, cpu1-cpu0, window, members, interval)
		achieved, intended, cpu, p50, p99 := f.achieved, f.intended, f.cpu, f.p50, f.p99

		b.ReportMetric(achieved, "writes/s")
		b.ReportMetric(achieved/intended*100, "%rate")
		b.ReportMetric(p99*1000, "lag-p99-ms")
		b.ReportMetric(cpu, "%cpu")
		b.ReportMetric(float64(rss)/(1<<20), "rss-MiB")
		b.ReportMetric(minTTL.Seconds(), "min-ttl-s")
		fmt.Printf("\nrefresh of %d members (version-checked: %v), ttl %s, interval %s, measured over %s (3 intervals) after a %s start-up load\n",
			members, versioned, ttl, interval, window.Round(time.Millisecond), startup.Round(time.Millisecond))
		fmt.Printf("  write rate     %.0f keys/s achieved vs %.0f intended = %.2f%% (target ≥ 99.9%%)\n", achieved, intended, achieved/intended*100)
		fmt.Printf("  schedule lag   p50 ≤ %.1f ms, p99 ≤ %.1f ms (bucket bounds; target p99 < 100 ms)\n", p50*1000, p99*1000)
		fmt.Printf("  daemon CPU     %.1f%% of one core (target < 15%%)\n", cpu)
		fmt.Printf("  RSS            %.1f MiB at the end, %.1f MiB peak (target < 300 MB)\n", float64(rss)/(1<<20), float64(peak)/(1<<20))
		fmt.Printf("  sampled keys   min remaining TTL %.1f s of %s; %d of %d polls found a key missing\n", minTTL.Seconds(), ttl, missing, polls)

		proc.Signal(b, 15)
		if code := proc.Wait(b, 60*time.Second); code != 0 {
			b.Fatalf("exit %d", code)
		}
	}
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
func rssNow(b *testing.B, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

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
