package bench_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/daemon"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// BenchmarkPrewarmLib runs the pre-warm of BenchmarkPrewarm as a library, in
// this process, so that it can be profiled:
//
//	go test ./bench/ -run '^$' -bench PrewarmLib -benchtime 5x -cpuprofile cpu.out -memprofile mem.out
//
// PREWARM_PAYLOAD=jsonb warms the jsonb payload (default text); the ranking is
// the live one unless PREWARM_STORED is set; PREWARM_WORKERS and PREWARM_CHUNK
// set the shape (default 4 × 1,000).
func BenchmarkPrewarmLib(b *testing.B) {
	pg := testenv.Postgres(b)
	rd := testenv.Redis(b)
	setupPrewarmData(b, pg.Pool, rd.Prefix)
	p := prewarmPayloads[0]
	if os.Getenv("PREWARM_PAYLOAD") == "jsonb" {
		setupPrewarmJSON(b, pg.Pool)
		p = prewarmPayloads[1]
	}
	fillAccessLog(b, pg.Pool, rd.Prefix+p.family)
	ctx := context.Background()
	workers, chunk := 4, prewarmChunk
	if n, err := strconv.Atoi(os.Getenv("PREWARM_WORKERS")); err == nil {
		workers = n
	}
	if n, err := strconv.Atoi(os.Getenv("PREWARM_CHUNK")); err == nil {
		chunk = n
	}
	cfg, err := config.Load(writePrewarmConfigShaped(b, pg.DSN, rd.Addr, rd.Prefix, p, workers, chunk))
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, prewarmKeys)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
	}
	keyOf := func(id string) string { return rd.Prefix + p.family + id }
	want := loadValues(b, pg.Pool, p.table)
	ranking := "live"
	if os.Getenv("PREWARM_STORED") != "" {
		ranking = "stored"
	}
	for b.Loop() {
		b.StopTimer()
		if ranking == "stored" {
			// Fresh for each run, as a leader keeps it: a bucket may have
			// closed since the last ranking.
			clearOfBucketEdge()
			if _, err := accesslog.New(pg.Pool).Rank(ctx, time.Hour, prewarmKeys); err != nil {
				b.Fatal(err)
			}
		}
		clearKeys(b, rd.Client, ids, keyOf)
		pw, err := daemon.OpenPrewarmFrom(ctx, cfg, rd.Client, false, nil, false, zerolog.Nop())
		if err != nil {
			b.Fatal(err)
		}
		if err := pw.SetRanking(ranking); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		rep, err := pw.Run(ctx, nil)
		b.StopTimer()
		if err != nil || rep.Written != prewarmKeys {
			b.Fatalf("pre-warm: %v, %+v", err, rep)
		}
		b.ReportMetric(rep.KeysPerSecond, "keys/s")
		pw.Close()
		checkValues(b, rd.Client, ids, keyOf, want)
		b.StartTimer()
	}
}
