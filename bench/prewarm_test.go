package bench_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/migrations"
)

const (
	prewarmKeys  = 100_000
	prewarmValue = 512
	prewarmChunk = 1000
	prewarmTTL   = 10 * time.Minute
)

// prewarmPayload is one of the benchmark's payloads: a table of (id bigint,
// v) rows and the family that caches them.
type prewarmPayload struct {
	name   string // text, jsonb
	table  string
	family string // the key template's literal before {id}
}

var prewarmPayloads = []prewarmPayload{
	{name: "text", table: "items", family: "item:"},
	{name: "jsonb", table: "docs", family: "doc:"},
}

// BenchmarkPrewarm pre-warms 100,000 keys from PostgreSQL (a bigint primary
// key, the typed query id = ANY($1::bigint[])) into Redis, for two payloads —
// text of 512 bytes, and a jsonb object of about 500 bytes as an application
// stores one — and two rankings, and prints keys/s of each side by side:
//
//	(a)  `hearth prewarm`, the real binary, reading the ranking a running leader
//	     stores every access_log.rank_interval: every key matched and validated,
//	     loaded in batches of 1,000 with 4 loads in flight, written with
//	     pipelined SET … NX PX with jittered TTLs;
//	(a') the same command when no leader has stored a ranking: it ranks the
//	     access log itself;
//	(b)  the honest ceiling for (a): plain Go (bench/ceiling, a process of its
//	     own like (a)) streaming the same top 100,000 keys of the stored
//	     ranking, cutting the ids out of the keys, and copying the rows with a
//	     prepared typed query per chunk and a pipeline of SET … PX with
//	     jittered TTLs per chunk, while the ranking is still being read; its
//	     clock starts as Hearth's does, with one connection open to each
//	     server, and it opens its workers' connections all at once while the
//	     ranking query runs; its
//	     workers and chunk size are the fastest of a sweep (2/4/8 × 500/1,000/
//	     2,000) run first on the same data, whose runs pick the shape only;
//	     (a) runs with the same shape (prewarm.concurrency, batch_size), and
//	     the two sides then run in pairs, one right after the other, in
//	     alternating order (BENCH_PREWARM_ROUNDS pairs, 5 by default);
//	(b') the same ceiling ranking the access log live, the ceiling for (a');
//	(d)  the same ceiling doing, as well, the two things a pre-warm owes its
//	     users beyond the copy: SET … NX, and no value over max_value_bytes
//	     sent (1 MiB, Hearth's default); it runs after each pair of (a) and
//	     (b), and (a)'s ratio to it (that pair's) is printed beside the
//	     target's, to show what the copy's extra duties cost;
//	(c)  the naive loop: one SELECT and one SET per key (text only).
//
// Every run is checked to have written every key with the row's value byte
// for byte and a TTL within the jitter. Each cell's ratio is the median of its
// pairs' ratios (each pair's two runs are seconds apart, so a machine that
// slows down or speeds up between pairs moves both alike), printed with their
// range and beside the ratio of each side's best run. Targets: a ≥ 0.95 × b,
// a' ≥ 0.95 × b' (the median), a ≥ 25 × c. Run with `make bench`.
func BenchmarkPrewarm(b *testing.B) {
	pg := testenv.Postgres(b)
	rd := testenv.Redis(b)
	setupPrewarmData(b, pg.Pool, rd.Prefix)
	setupPrewarmJSON(b, pg.Pool)
	ids := make([]string, prewarmKeys)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
	}
	ctx := context.Background()
	bin := e2e.Binary(b)
	log := accesslog.New(pg.Pool)
	rounds := 5
	if s := os.Getenv("BENCH_PREWARM_ROUNDS"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			rounds = n
		}
	}

	type result struct {
		hearth, hearthWall, ceiling time.Duration
		hearthCPU, ceilingCPU       time.Duration // whole processes
		workers, chunk              int
		pairs                       []float64 // each pair's Hearth / ceiling keys/s
		duties                      []float64 // each round's Hearth / ceiling with NX and the bound
	}
	best := func(cur *time.Duration, d time.Duration) {
		if *cur == 0 || d < *cur {
			*cur = d
		}
	}
	for b.Loop() {
		var results [2][2]result // payload × (live, stored)
		var rankDur, naiveDur time.Duration
		for pi, p := range prewarmPayloads {
			keyOf := func(id string) string { return rd.Prefix + p.family + id }
			want := loadValues(b, pg.Pool, p.table)
			fillAccessLog(b, pg.Pool, rd.Prefix+p.family)
			prewarm := func(wantRanking string, workers, chunk int) (d, wall, cpu time.Duration) {
				b.Helper()
				cfgPath := writePrewarmConfigShaped(b, pg.DSN, rd.Addr, rd.Prefix, p, workers, chunk)
				if wantRanking == accesslog.RankingStored {
					// Fresh as a leader keeps it (a minute may have
					// closed since the last ranking): not measured.
					clearOfBucketEdge()
					if _, err := log.Rank(ctx, time.Hour, prewarmKeys); err != nil {
						b.Fatal(err)
					}
				}
				clearKeys(b, rd.Client, ids, keyOf)
				t0 := time.Now()
				cmd := exec.Command(bin, "prewarm", "--config", cfgPath, "--top", strconv.Itoa(prewarmKeys))
				out, err := cmd.CombinedOutput()
				wall = time.Since(t0)
				if err != nil {
					b.Fatalf("hearth prewarm: %v\n%s", err, out)
				}
				if os.Getenv("BENCH_VERBOSE") != "" {
					fmt.Printf("%s\n", out)
				}
				if !regexp.MustCompile(`(?m)^  ranking +` + wantRanking + `,`).Match(out) {
					b.Fatalf("hearth prewarm did not rank %s:\n%s", wantRanking, out)
				}
				d = summaryDuration(b, string(out))
				checkValues(b, rd.Client, ids, keyOf, want)
				return d, wall, processCPU(cmd)
			}
			ceiling := func(stored bool, workers, chunk int, flags ...string) (time.Duration, time.Duration) {
				b.Helper()
				clearKeys(b, rd.Client, ids, keyOf)
				d, cpu := rawPrewarmWith(b, pg.DSN, rd.Addr, rd.Prefix+p.family, p.table, stored, workers, chunk, flags...)
				checkValues(b, rd.Client, ids, keyOf, want)
				return d, cpu
			}
			for ri, stored := range []bool{false, true} {
				// (a') ranks the access log on the spot: no leader has
				// stored a ranking. (a) reads the ranking the leader stores
				// every access_log.rank_interval (this same call).
				wantRanking := accesslog.RankingLive
				if stored {
					wantRanking = accesslog.RankingStored
					t0 := time.Now()
					if _, err := log.Rank(ctx, time.Hour, prewarmKeys); err != nil {
						b.Fatal(err)
					}
					best(&rankDur, time.Since(t0))
				} else if _, err := pg.Pool.Exec(ctx, "DELETE FROM "+accesslog.RankInfoTable); err != nil {
					b.Fatal(err)
				}
				r := &results[pi][ri]
				// The ceiling's shape: the fastest of the sweep.
				var fastest time.Duration
				for _, workers := range []int{2, 4, 8} {
					for _, chunk := range []int{500, 1000, 2000} {
						if d, _ := ceiling(stored, workers, chunk); fastest == 0 || d < fastest {
							fastest, r.workers, r.chunk = d, workers, chunk
						}
					}
				}
				// The sweep only picks the shape: its runs do not count.
				// The machine is shared: the sides run in pairs, in both
				// orders, so that whatever the step before leaves behind (a
				// clear leaves Redis freeing memory) falls on both alike.
				// The ceiling with the duties runs after each pair (not
				// between its two runs).
				for round := range rounds {
					var hd, cd time.Duration
					h := func() {
						d, w, cpu := prewarm(wantRanking, r.workers, r.chunk)
						hd = d
						best(&r.hearth, d)
						best(&r.hearthWall, w)
						best(&r.hearthCPU, cpu)
					}
					c := func() {
						d, cpu := ceiling(stored, r.workers, r.chunk)
						cd = d
						best(&r.ceiling, d)
						best(&r.ceilingCPU, cpu)
					}
					if round%2 == 0 {
						h()
						c()
					} else {
						c()
						h()
					}
					dd, _ := ceiling(stored, r.workers, r.chunk, "-nx", "-bound", strconv.Itoa(1<<20))
					r.pairs = append(r.pairs, cd.Seconds()/hd.Seconds())
					r.duties = append(r.duties, dd.Seconds()/hd.Seconds())
				}
			}
			if pi == 0 {
				// (c) naive loop: too slow to repeat.
				clearKeys(b, rd.Client, ids, keyOf)
				naiveDur = naivePrewarm(b, pg.Pool, rd.Client, ids, keyOf)
				checkValues(b, rd.Client, ids, keyOf, want)
			}
			clearKeys(b, rd.Client, ids, keyOf)
		}

		rate := func(d time.Duration) float64 { return prewarmKeys / d.Seconds() }
		fmt.Printf("\npre-warm of %d keys, PostgreSQL -> Redis (GOMAXPROCS %d; %d pairs of runs; the leader's ranking took %s)\n",
			prewarmKeys, runtime.GOMAXPROCS(0), rounds, rankDur.Round(time.Millisecond))
		fmt.Printf("  %-7s %-7s %-22s %14s %14s %7s  %-22s  %s\n", "payload", "ranking", "ratio: median (range)", "hearth best", "ceiling best", "ratio",
			"vs NX+bound: median", "ceiling shape (workers x chunk), hearth whole process, CPU per key hearth / ceiling (best runs, whole processes)")
		for pi, p := range prewarmPayloads {
			for ri, rk := range []string{"live", "stored"} {
				r := results[pi][ri]
				h, c := rate(r.hearth), rate(r.ceiling)
				perKey := func(d time.Duration) float64 { return float64(d.Microseconds()) / prewarmKeys }
				med, lo, hi := medianRange(r.pairs)
				dmed, dlo, dhi := medianRange(r.duties)
				fmt.Printf("  %-7s %-7s %5.3f (%5.3f-%5.3f)  %14.0f %14.0f %7.3f  %5.3f (%5.3f-%5.3f)   %d x %d, %s, %.2f / %.2f µs\n", p.name, rk, med, lo, hi, h, c, h/c,
					dmed, dlo, dhi, r.workers, r.chunk, r.hearthWall.Round(time.Millisecond), perKey(r.hearthCPU), perKey(r.ceilingCPU))
				b.ReportMetric(h, p.name+"-"+rk+"-hearth-keys/s")
				b.ReportMetric(c, p.name+"-"+rk+"-ceiling-keys/s")
				b.ReportMetric(med, p.name+"-"+rk+"-ratio")
				b.ReportMetric(dmed, p.name+"-"+rk+"-nx-bound-ratio")
				b.ReportMetric(h/c, p.name+"-"+rk+"-best-ratio")
			}
		}
		naive := rate(naiveDur)
		fmt.Printf("  naive loop (text)  %.0f keys/s; stored hearth (best) / naive = %.1f (target >= 25); target ratio (median) >= 0.95\n\n",
			naive, rate(results[0][1].hearth)/naive)
		b.ReportMetric(naive, "naive-keys/s")
	}
}

// medianRange is the median of xs (the mean of the middle two for an even
// count) and their smallest and largest.
func medianRange(xs []float64) (med, lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	s := slices.Sorted(slices.Values(xs))
	med = s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return med, s[0], s[len(s)-1]
}

// setupPrewarmData fills items (id bigint, v text of 512 bytes) and an access log
// that ranks every item (keys under prefix), in the benchmark's own schema.
func setupPrewarmData(b *testing.B, pool *pgxpool.Pool, prefix string) {
	b.Helper()
	ctx := context.Background()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := migrations.NewProvider(db)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE items (id bigint PRIMARY KEY, v text NOT NULL)`,
		fmt.Sprintf(`INSERT INTO items SELECT i, repeat(md5(i::text), %d) FROM generate_series(1, %d) i`, prewarmValue/32, prewarmKeys),
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	_, err = pool.Exec(ctx, `INSERT INTO hearth_access_log (bucket, key, hits)
		SELECT $1, $2 || 'item:' || i, $3 - i FROM generate_series(1, $4::int) i`,
		accesslog.BucketStart(time.Now(), time.Minute), prefix, prewarmKeys+1, prewarmKeys)
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{`ANALYZE items`, `ANALYZE hearth_access_log`} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
}

func writePrewarmConfig(b *testing.B, dsn, redisAddr, prefix string) string {
	b.Helper()
	return writePrewarmConfigFor(b, dsn, redisAddr, prefix, prewarmPayloads[0])
}

// writePrewarmConfigFor writes the config that pre-warms payload p in batches
// of 1,000, 4 at a time.
func writePrewarmConfigFor(b *testing.B, dsn, redisAddr, prefix string, p prewarmPayload) string {
	b.Helper()
	return writePrewarmConfigShaped(b, dsn, redisAddr, prefix, p, 4, prewarmChunk)
}

// writePrewarmConfigShaped writes the config that pre-warms payload p in
// batches of chunk, workers at a time.
func writePrewarmConfigShaped(b *testing.B, dsn, redisAddr, prefix string, p prewarmPayload, workers, chunk int) string {
	b.Helper()
	cfg := fmt.Sprintf(`
redis:
  addrs: [%q]
  namespace: %q
log: {level: warn, format: json}
refresh:
  max_concurrent_loads: 8
sources:
  - name: items
    type: postgres
    dsn: %q
    max_conns: 10
    max_in_flight: 8
    rate: 0           # no origin rate limit: the benchmark measures capacity
access_log:
  source: items
prewarm:
  top_n: %d
  concurrency: %d
  rate: 0
keys:
  - name: %s
    key: %q
    source: items
    ttl: %s
    batch_size: %d
    param_pattern: "[0-9]{1,9}"
    members: ["1"]
    query: "SELECT id, v FROM %s WHERE id = ANY($1::bigint[])"
`, redisAddr, "bench-"+strings.Trim(strings.NewReplacer(":", "-").Replace(prefix), "-"), dsn, prewarmKeys,
		workers, strings.TrimSuffix(p.family, ":"), prefix+p.family+"{id}", prewarmTTL, chunk, p.table)
	path := filepath.Join(b.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		b.Fatal(err)
	}
	return path
}

var durationLine = regexp.MustCompile(`(?m)^\s+duration\s+(\S+)$`)

// summaryDuration reads the pre-warm's own duration from `hearth prewarm`'s summary.
func summaryDuration(b *testing.B, out string) time.Duration {
	b.Helper()
	if !strings.Contains(out, "coverage              100.000%") {
		b.Fatalf("hearth prewarm did not cover every key:\n%s", out)
	}
	m := durationLine.FindStringSubmatch(out)
	if m == nil {
		b.Fatalf("no duration in the summary:\n%s", out)
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// rawPrewarmWith runs the ceiling (bench/ceiling: plain Go, a process of its own
// as `hearth prewarm` is) and returns the duration it measured from the moment
// it had one connection to each server, and the CPU time the whole process used.
// flags are the ceiling's own (-nx, -bound N).
func rawPrewarmWith(b *testing.B, dsn, redisAddr, keyPrefix, table string, stored bool, workers, chunk int, flags ...string) (time.Duration, time.Duration) {
	b.Helper()
	args := append([]string{"-dsn", dsn, "-redis", redisAddr, "-prefix", keyPrefix,
		"-table", table, "-stored=" + strconv.FormatBool(stored), "-n", strconv.Itoa(prewarmKeys), "-chunk", strconv.Itoa(chunk),
		"-workers", strconv.Itoa(workers), "-ttl", prewarmTTL.String(), "-jitter", "0.2"}, flags...)
	cmd := exec.Command(e2e.Build(b, "./bench/ceiling"), args...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			b.Fatalf("ceiling: %v\n%s", err, ee.Stderr)
		}
		b.Fatalf("ceiling: %v", err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		b.Fatalf("ceiling printed %q, not a duration in nanoseconds", out)
	}
	return time.Duration(ns), processCPU(cmd)
}

// clearOfBucketEdge waits, when an access-log bucket (a minute) closes
// within the next few seconds, until it has: a ranking stored just before
// that edge predates the newest closed bucket by the time a pre-warm reads
// it, and the pre-warm rightly ranks live instead.
func clearOfBucketEdge() {
	const margin = 3 * time.Second
	if d := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); d < margin {
		time.Sleep(d + 50*time.Millisecond)
	}
}

// processCPU is the user and system CPU time a finished command used.
func processCPU(cmd *exec.Cmd) time.Duration {
	return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

// naivePrewarm is the loop everyone writes first: one SELECT and one SET per key.
func naivePrewarm(b *testing.B, pool *pgxpool.Pool, rdb *redis.Client, ids []string, keyOf func(string) string) time.Duration {
	b.Helper()
	ctx := context.Background()
	t0 := time.Now()
	for _, id := range ids {
		var v []byte
		if err := pool.QueryRow(ctx, "SELECT v FROM items WHERE id = $1::bigint", id).Scan(&v); err != nil {
			b.Fatal(err)
		}
		if err := rdb.Set(ctx, keyOf(id), v, prewarmTTL).Err(); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(t0)
}

// clearKeys deletes the benchmark's cache keys between measurements.
func clearKeys(b *testing.B, rdb redis.UniversalClient, ids []string, keyOf func(string) string) {
	b.Helper()
	ctx := context.Background()
	for i := 0; i < len(ids); i += 10_000 {
		pipe := rdb.Pipeline()
		for _, id := range ids[i:min(i+10_000, len(ids))] {
			pipe.Unlink(ctx, keyOf(id))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// checkKeys makes sure a measurement wrote every key, with a 512-byte value.
func checkKeys(b *testing.B, rdb redis.UniversalClient, ids []string, keyOf func(string) string) {
	b.Helper()
	ctx := context.Background()
	missing := 0
	for i := 0; i < len(ids); i += 10_000 {
		pipe := rdb.Pipeline()
		cmds := make([]*redis.IntCmd, 0, 10_000)
		for _, id := range ids[i:min(i+10_000, len(ids))] {
			cmds = append(cmds, pipe.StrLen(ctx, keyOf(id)))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		for _, c := range cmds {
			if c.Val() != prewarmValue {
				missing++
			}
		}
	}
	if missing > 0 {
		b.Fatalf("%d of %d keys missing or not %d bytes", missing, len(ids), prewarmValue)
	}
}

// setupPrewarmJSON fills docs (id bigint, v jsonb): an object of about 500
// bytes per row, as an application stores one (nested object, array, numbers,
// a boolean, strings that vary by row).
func setupPrewarmJSON(b *testing.B, pool *pgxpool.Pool) {
	b.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`CREATE TABLE docs (id bigint PRIMARY KEY, v jsonb NOT NULL)`,
		fmt.Sprintf(`INSERT INTO docs SELECT i, jsonb_build_object(
			'id', i, 'name', 'user ' || md5(i::text), 'email', substr(md5(i::text), 1, 12) || '@example.com',
			'active', i %% 3 <> 0, 'score', (i * 7919) %% 100000 / 100.0, 'created_at', '2026-01-01T00:00:00Z',
			'tags', jsonb_build_array('tag' || i %% 17, 'tag' || i %% 23, 'tag' || i %% 31),
			'address', jsonb_build_object('street', (i %% 997) || ' ' || substr(md5((i+1)::text), 1, 10) || ' Street',
				'city', 'City ' || i %% 101, 'zip', lpad((i %% 100000)::text, 5, '0'), 'country', 'NL'),
			'prefs', jsonb_build_object('theme', 'dark', 'lang', 'en', 'notify', jsonb_build_array('email', 'push')),
			'bio', md5((i+2)::text) || md5((i+3)::text) || md5((i+4)::text) || md5((i+5)::text))
			FROM generate_series(1, %d) i`, prewarmKeys),
		`ANALYZE docs`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
}

// fillAccessLog makes the access log rank every row's key under keyPrefix
// (and nothing else): id 1 the hottest.
func fillAccessLog(b *testing.B, pool *pgxpool.Pool, keyPrefix string) {
	b.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `DELETE FROM hearth_access_log`); err != nil {
		b.Fatal(err)
	}
	_, err := pool.Exec(ctx, `INSERT INTO hearth_access_log (bucket, key, hits)
		SELECT $1, $2 || i, $3 - i FROM generate_series(1, $4::int) i`,
		accesslog.BucketStart(time.Now(), time.Minute), keyPrefix, prewarmKeys+1, prewarmKeys)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE hearth_access_log`); err != nil {
		b.Fatal(err)
	}
}

// loadValues reads every row's value as pgx gives it (text as is, jsonb as
// its JSON text): what a pre-warm must write, byte for byte.
func loadValues(b *testing.B, pool *pgxpool.Pool, table string) map[string][]byte {
	b.Helper()
	rows, err := pool.Query(context.Background(), "SELECT id::text, v FROM "+pgx.Identifier{table}.Sanitize())
	if err != nil {
		b.Fatal(err)
	}
	want := make(map[string][]byte, prewarmKeys)
	var (
		id string
		v  []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &v}, func() error {
		want[id] = v
		v = nil
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return want
}

// checkValues makes sure a measurement wrote every key with its row's value
// byte for byte and a TTL within prewarmTTL's jitter (0.2).
func checkValues(b *testing.B, rdb *redis.Client, ids []string, keyOf func(string) string, want map[string][]byte) {
	b.Helper()
	ctx := context.Background()
	bad, badTTL := 0, 0
	lo, hi := time.Duration(float64(prewarmTTL)*0.9)-time.Minute, time.Duration(float64(prewarmTTL)*1.1)
	for i := 0; i < len(ids); i += 10_000 {
		part := ids[i:min(i+10_000, len(ids))]
		pipe := rdb.Pipeline()
		gets := make([]*redis.StringCmd, len(part))
		ttls := make([]*redis.DurationCmd, len(part))
		for j, id := range part {
			gets[j] = pipe.Get(ctx, keyOf(id))
			ttls[j] = pipe.PTTL(ctx, keyOf(id))
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			b.Fatal(err)
		}
		for j, id := range part {
			if gets[j].Val() != string(want[id]) || len(want[id]) == 0 {
				bad++
			}
			if t := ttls[j].Val(); t < lo || t > hi {
				badTTL++
			}
		}
	}
	if bad > 0 || badTTL > 0 {
		b.Fatalf("%d of %d keys missing or not their row's value, %d with a TTL outside [%s, %s]", bad, len(ids), badTTL, lo, hi)
	}
}
