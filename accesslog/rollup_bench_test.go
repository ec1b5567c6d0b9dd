package accesslog_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/testenv"
)

// BenchmarkRollup rolls up one bucket of 200,000 members (rename, read by
// rank, add to the table through its guard, commit, delete) and reports
// members/s.
//
//	go test -run '^$' -bench Rollup -benchtime 3x ./accesslog/
func BenchmarkRollup(b *testing.B) {
	pg := testenv.Postgres(b)
	rd := testenv.Redis(b)
	migrate(b, pg.Pool)
	e := newRollupEnv(b, pg.Pool, rd.Client, strings.TrimSuffix(rd.Prefix, ":"))
	ctx := ctxT(b)
	const members = 200_000
	var total time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		key, _ := e.bucket(time.Duration(2+i) * time.Minute)
		zs := make([]redis.Z, 0, 10_000)
		for m := range members {
			zs = append(zs, redis.Z{Score: float64(1 + m%50), Member: fmt.Sprintf("product:%d", m)})
			if len(zs) == cap(zs) {
				if err := rd.Client.ZAdd(ctx, key, zs...).Err(); err != nil {
					b.Fatal(err)
				}
				zs = zs[:0]
			}
		}
		b.StartTimer()
		t0 := time.Now()
		res, err := e.roller.RollupOnce(ctx)
		total += time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		if res.Rows != members {
			b.Fatalf("rolled up %d rows, want %d", res.Rows, members)
		}
	}
	b.ReportMetric(float64(members*b.N)/total.Seconds(), "members/s")
}
