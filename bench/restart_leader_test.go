package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// restartTrials is how many Redis restarts each build meets.
const restartTrials = 9

// BenchmarkRestartLeader runs the daemon binary as the soak runs it (leader
// election on, lease 1.5 s, two families of 40 members, one version-checked),
// restarts its private Redis after 1 s down (no persistence: the data, the lease and the
// fences go) restartTrials times 1-2.5 s apart, and prints the time from the
// restarted Redis accepting connections (a client's first PONG) to every key
// back, read by a separate client every 2 ms: p50 and max. The first restart
// is re-warmed; the later ones come within the re-warm's minimum gap (10 s),
// so the keys come back through a new term's catch-up, as soon as the leader
// sees its lease gone. Each build meets it twice: connected to Redis
// directly, and through a TCP proxy (Toxiproxy, as the soak connects its
// instances), where a Redis that is down is not a refused dial but a
// connection the proxy accepts and closes. HEARTH_BASELINE_BIN=path runs that
// binary first.
func BenchmarkRestartLeader(b *testing.B) {
	pg := testenv.Postgres(b)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `CREATE TABLE restart_items (id bigint PRIMARY KEY, version bigint NOT NULL);
		INSERT INTO restart_items SELECT i, 1 FROM generate_series(1, 40) i`); err != nil {
		b.Fatal(err)
	}
	var members, keys []string
	for i := 1; i <= 40; i++ {
		members = append(members, strconv.Quote(strconv.Itoa(i)))
		keys = append(keys, "item:"+strconv.Itoa(i), "row:"+strconv.Itoa(i))
	}
	type build struct {
		label, bin string
		proxied    bool
	}
	bins := []build{{label: "this build", bin: e2e.PlainBinary(b)}}
	if base := os.Getenv("HEARTH_BASELINE_BIN"); base != "" {
		bins = append([]build{{label: "baseline", bin: base}}, bins...)
	}
	var builds []build
	for _, proxied := range []bool{false, true} {
		for _, bd := range bins {
			bd.proxied = proxied
			if proxied {
				bd.label += ", proxied"
			}
			builds = append(builds, bd)
		}
	}
	for b.Loop() {
		fmt.Printf("\nRedis restart after 1s down, leader election on (lease 1.5s, 80 keys; first PONG -> every key back, seen by another client every 2ms; %d restarts each)\n", restartTrials)
		for _, bd := range builds {
			srv := testenv.PrivateRedis(b)
			redisAddr := srv.Addr
			if bd.proxied {
				redisAddr = testenv.NewProxy(b, srv.Addr).Addr
			}
			cfg := filepath.Join(b.TempDir(), "hearth.yaml")
			if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`redis: {addrs: [%q], namespace: hearth, dial_timeout: 500ms, read_timeout: 500ms, write_timeout: 500ms}
log: {level: warn, format: json}
refresh: {load_timeout: 1s, spread: 0.5, max_stale: 60s, jitter: 0.05}
leader: {lease: 1.5s, retry_period: 300ms}
prewarm: {rewarm_check: 1s}
sources:
  - {name: db, type: postgres, dsn: %q, max_conns: 2, attempt_timeout: 400ms, retries: 1}
keys:
  - {name: item, key: "item:{id}", source: db, ttl: 8s, interval: 2s, param_pattern: "[0-9]+", members: [%s], query: "SELECT id, 'v' || version FROM restart_items WHERE id = ANY($1)"}
  - {name: row, key: "row:{id}", source: db, ttl: 8s, interval: 2s, param_pattern: "[0-9]+", members: [%[3]s], query: "SELECT id, 'v' || version, version FROM restart_items WHERE id = ANY($1)", version_column: version}
`, redisAddr, pg.DSN, strings.Join(members, ", "))), 0o600); err != nil {
				b.Fatal(err)
			}
			addr := e2e.FreeAddr(b)
			proc := e2e.StartBinary(b, bd.bin, []string{"run", "--config", cfg, "--listen", addr})
			proc.WaitHTTP(b, "http://"+addr+"/readyz", http.StatusOK, 30*time.Second)
			var first time.Duration
			var later []time.Duration
			for i := range restartTrials {
				time.Sleep(time.Second + time.Duration(i*397%1500)*time.Millisecond) // a random phase of the renew interval
				t0 := srv.RestartTimed(b, time.Second)
				c := srv.Client(b)
				for {
					if n, err := c.Exists(ctx, keys...).Result(); err == nil && int(n) == len(keys) {
						break
					}
					if time.Since(t0) > 30*time.Second {
						b.Fatalf("%s: keys not back within 30s of restart %d:\n%s", bd.label, i, proc.Output())
					}
					time.Sleep(2 * time.Millisecond)
				}
				took := time.Since(t0)
				_ = c.Close()
				if i == 0 {
					first = took
				} else {
					later = append(later, took)
				}
			}
			proc.Signal(b, syscall.SIGTERM)
			proc.Wait(b, 10*time.Second)
			slices.Sort(later)
			fmt.Printf("  %-19s  re-warmed (first restart) %6s   within the re-warm gap: p50 %6s  max %6s\n", bd.label,
				first.Round(time.Millisecond), later[len(later)/2].Round(time.Millisecond), later[len(later)-1].Round(time.Millisecond))
			if strings.HasPrefix(bd.label, "this build") {
				unit := "gap"
				if bd.proxied {
					unit = "proxied-gap"
				}
				b.ReportMetric(float64(later[len(later)/2].Microseconds())/1000, unit+"-p50-ms")
				b.ReportMetric(float64(later[len(later)-1].Microseconds())/1000, unit+"-max-ms")
			}
		}
	}
}
