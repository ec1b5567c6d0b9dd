package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/migrations"
)

// Zipf workload of the traffic-driven family benchmark, in compressed time.
const (
	zipfProducts = 100_000
	zipfRanks    = 20_000 // distinct keys read in one phase
	zipfS        = 1.1
	zipfTopN     = 200
	zipfPhase    = 10 * time.Second // the hot set moves every phase
	zipfPhases   = 5
	zipfReadRate = 2000 // reads per second per reader
	zipfShift    = 20_011
)

// zipfID is the product a rank names in a phase: each phase reads another
// stretch of the catalogue, so the hot set moves entirely.
func zipfID(rank, phase int) int { return (rank+phase*zipfShift)%zipfProducts + 1 }

// BenchmarkHotSetZipf runs two daemons side by side on one Redis and one
// catalogue, each read by its own reader at 2,000 reads/s with a Zipf(1.1)
// workload over 20,000 keys whose hot set moves every 10 s (a compressed
// hour): "static" declares the top 200 keys of the first phase (what an
// operator would list at deploy time), "hotset" takes its top 200 from the
// access log (members_from.access_log, window 3 s, re-ranked every 1 s) that
// its reader feeds. TTL 4 s. It prints, after the first shift, the share of
// reads of the current top 200 that hit, the hit ratio of all reads, and the
// origin load: the readers' misses (each a query the application makes)
// plus the rows Hearth loads.
func BenchmarkHotSetZipf(b *testing.B) {
	rs := testenv.PrivateRedis(b)
	rdb := rs.Client(b)
	pg := testenv.Postgres(b)
	ctx := context.Background()
	migrate(b, pg.Pool)
	if _, err := pg.Pool.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE products (id bigint PRIMARY KEY, v text NOT NULL);
		INSERT INTO products SELECT i, repeat('x', 256) || i FROM generate_series(1, %d) i;
		ANALYZE products;`, zipfProducts)); err != nil {
		b.Fatal(err)
	}
	var static []string
	for r := range zipfTopN {
		static = append(static, strconv.Quote(strconv.Itoa(zipfID(r, 0))))
	}
	write := func(name, prefix, members string) (cfg, listen string) {
		listen = e2e.FreeAddr(b)
		cfg = filepath.Join(b.TempDir(), name+".yaml")
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`
redis: {addrs: [%q], namespace: hz-%s}
http: {listen: %q}
log: {format: json}
leader: {enabled: false}
prewarm: {enabled: false}
sources: [{name: db, type: postgres, dsn: %q}]
access_log: {source: db, bucket: 1s, rollup_interval: 0, rank_interval: 0}
keys:
  - name: product
    key: "%sproduct:{id}"
    source: db
    ttl: 4s
    load_timeout: 500ms
    param_pattern: "[0-9]{1,12}"
    query: "SELECT id::text, v FROM products WHERE id = ANY($1::bigint[])"
%s
`, rs.Addr, name, listen, pg.DSN, prefix, members)), 0o600); err != nil {
			b.Fatal(err)
		}
		return cfg, listen
	}
	for range b.N {
		type arm struct {
			name, prefix, listen string
			record               bool
			proc                 *e2e.Proc
			r                    *zipfReader
		}
		arms := []*arm{{name: "static", prefix: "s:"}, {name: "hotset", prefix: "h:", record: true}}
		for _, a := range arms {
			members := "    members: [" + joinComma(static) + "]"
			if a.record {
				members = fmt.Sprintf("    members_from: {access_log: {top_n: %d, window: 3s, rank_interval: 1s, hysteresis: 0.2, demote_after: 2}}", zipfTopN)
			}
			var cfg string
			cfg, a.listen = write(a.name, a.prefix, members)
			a.proc = e2e.Start(b, []string{"run", "--config", cfg})
		}
		for _, a := range arms {
			a.proc.WaitHTTP(b, "http://"+a.listen+"/readyz", http.StatusOK, time.Minute)
		}
		m0 := make([]map[string]float64, len(arms))
		start := time.Now()
		for i, a := range arms {
			m0[i] = e2e.Metrics(b, "http://"+a.listen+"/metrics")
			a.r = startZipfReader(rdb, pg.Pool, a.prefix, a.record, start)
		}
		time.Sleep(zipfPhases * zipfPhase)
		fmt.Printf("\ntraffic-driven family: Zipf(%.1f) over %d keys, %d reads/s per reader, hot set moves every %s, top_n %d, ttl 4s, %d phases\n",
			zipfS, zipfRanks, zipfReadRate, zipfPhase, zipfTopN, zipfPhases)
		fmt.Printf("  %-8s %14s %14s %14s %16s %16s\n", "family", "top-N hit 1st", "top-N hit", "all-read hit", "app misses/s", "hearth rows/s")
		for i, a := range arms {
			st := a.r.stop()
			m1 := e2e.Metrics(b, "http://"+a.listen+"/metrics")
			secs := time.Since(start).Seconds()
			rows := e2e.Sum(m1, "hearth_keys_written_total") - e2e.Sum(m0[i], "hearth_keys_written_total")
			first, later := st.phase[0], st.later()
			fmt.Printf("  %-8s %13.1f%% %13.1f%% %13.1f%% %16.0f %16.0f\n", a.name,
				pct(first.topHits, first.topReads), pct(later.topHits, later.topReads), pct(later.hits, later.reads),
				float64(st.total().reads-st.total().hits)/secs, rows/secs)
			b.ReportMetric(pct(later.topHits, later.topReads), a.name+"-topN-hit-%")
			a.proc.Signal(b, 15)
			if code := a.proc.Wait(b, 30*time.Second); code != 0 {
				b.Fatalf("%s exit %d\n%s", a.name, code, a.proc.Output())
			}
		}
		fmt.Printf("  (top-N hit 1st: the first phase, before any shift; the rest: phases 2-%d, after the hot set moved)\n", zipfPhases)
	}
}

func migrate(b *testing.B, pool *pgxpool.Pool) {
	b.Helper()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := migrations.NewProvider(db)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := p.Up(context.Background()); err != nil {
		b.Fatal(err)
	}
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ", "
		}
		out += x
	}
	return out
}

func pct(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b) * 100
}

type zipfCounts struct{ reads, hits, topReads, topHits int64 }

func (c *zipfCounts) add(o zipfCounts) {
	c.reads += o.reads
	c.hits += o.hits
	c.topReads += o.topReads
	c.topHits += o.topHits
}

type zipfStats struct{ phase [zipfPhases + 1]zipfCounts }

func (s *zipfStats) later() zipfCounts {
	var c zipfCounts
	for _, p := range s.phase[1:] {
		c.add(p)
	}
	return c
}

func (s *zipfStats) total() zipfCounts {
	c := s.phase[0]
	c.add(s.later())
	return c
}

// zipfReader reads like an application: pipelined GETs at zipfReadRate,
// counting hits per phase, and (record) counts its reads into the access
// log every second with the documented statement.
type zipfReader struct {
	stopc chan struct{}
	wg    sync.WaitGroup
	stats zipfStats
	errs  atomic.Int64
}

func startZipfReader(rdb *redis.Client, pool *pgxpool.Pool, prefix string, record bool, start time.Time) *zipfReader {
	r := &zipfReader{stopc: make(chan struct{})}
	r.wg.Go(func() {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(1, 2))
		z := rand.NewZipf(rng, zipfS, 1, zipfRanks-1)
		const tick = 10 * time.Millisecond
		per := zipfReadRate * int(tick) / int(time.Second)
		t := time.NewTicker(tick)
		defer t.Stop()
		counts := map[string]int64{}
		lastFlush := time.Now()
		for {
			select {
			case <-r.stopc:
				return
			case <-t.C:
			}
			phase := min(int(time.Since(start)/zipfPhase), zipfPhases)
			pipe := rdb.Pipeline()
			cmds := make([]*redis.StringCmd, per)
			top := make([]bool, per)
			for i := range per {
				rank := int(z.Uint64())
				top[i] = rank < zipfTopN
				k := prefix + "product:" + strconv.Itoa(zipfID(rank, phase))
				cmds[i] = pipe.Get(ctx, k)
				if record {
					counts[k]++
				}
			}
			_, _ = pipe.Exec(ctx)
			var c zipfCounts
			for i, cmd := range cmds {
				hit := cmd.Err() == nil
				c.reads++
				if hit {
					c.hits++
				}
				if top[i] {
					c.topReads++
					if hit {
						c.topHits++
					}
				}
			}
			r.stats.phase[phase].add(c)
			if record && time.Since(lastFlush) >= time.Second {
				keys := make([]string, 0, len(counts))
				hits := make([]int64, 0, len(counts))
				for k, n := range counts {
					keys, hits = append(keys, k), append(hits, n)
				}
				if _, err := pool.Exec(ctx, accesslog.RecordSQL, accesslog.BucketStart(lastFlush, time.Second), keys, hits); err != nil {
					r.errs.Add(1)
				}
				clear(counts)
				lastFlush = time.Now()
			}
		}
	})
	return r
}

func (r *zipfReader) stop() zipfStats {
	close(r.stopc)
	r.wg.Wait()
	return r.stats
}
