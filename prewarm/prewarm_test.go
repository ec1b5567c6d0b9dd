package prewarm_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/internal/prewarmtest"
	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/prewarm"
)

// TestPrewarmSkipsHostileKeys: access-log keys that match no declaration or
// whose parameter is invalid are skipped and counted by reason, never sent to
// the origin and never written; the valid ones and the declared single key load.
func TestPrewarmSkipsHostileKeys(t *testing.T) {
	rd := testenv.Redis(t)
	e := prewarmtest.New(t, rd.Client, rd.Prefix, 20, 100, "")
	p := rd.Prefix
	hostile := map[string]string{
		p + "product:{id}":                                prewarm.SkipInvalidMember, // a template look-alike
		p + "product:1;DROP_TABLE_products":               prewarm.SkipInvalidMember, // SQL-looking, fails param_pattern
		p + "product:" + strings.Repeat("9", 200):         prewarm.SkipInvalidMember, // member too long
		p + "product:1' OR '1'='1":                        prewarm.SkipMalformed,     // SQL with spaces
		p + "product:1\x01":                               prewarm.SkipMalformed,     // control character
		p + "product:\u00a02":                             prewarm.SkipMalformed,     // unicode space
		p + "user:7":                                      prewarm.SkipUnknown,       // wrong family
		"product:3":                                       prewarm.SkipUnknown,       // right family name, wrong namespace
		p + "top:extra":                                   prewarm.SkipUnknown,       // single-key look-alike
		p + strings.Repeat("x", prewarm.MaxLogKeyBytes+1): prewarm.SkipTooLong,
	}
	valid := []string{p + "product:3", p + "product:5", p + "top", p + "product:404"}
	var logged []string
	for k := range hostile {
		logged = append(logged, k)
	}
	sort.Strings(logged)
	// Hostile keys are the hottest: they must not crowd out or stop the rest.
	// The table's guard drops a key over accesslog.MaxKeyBytes; a row written
	// before it existed (or with it off) still reaches the pre-warm.
	if _, err := e.PG.Pool.Exec(context.Background(), `ALTER TABLE hearth_access_log DISABLE TRIGGER hearth_access_log_guard`); err != nil {
		t.Fatal(err)
	}
	e.Record(t, append(logged, valid...)...)

	rep, err := e.PW.Run(context.Background(), e.Options(100))
	if err != nil {
		t.Fatal(err)
	}
	wantSkipped := map[string]int{}
	for _, r := range hostile {
		wantSkipped[r]++
	}
	for r, n := range wantSkipped {
		if got := rep.Skipped[r]; got != n {
			t.Errorf("skipped[%s] = %d, want %d (all: %v)", r, got, n, rep.Skipped)
		}
		if got := promtest.Value(t, e.Reg, "hearth_prewarm_keys_total", "outcome", "skipped_"+r); got != float64(n) {
			t.Errorf("hearth_prewarm_keys_total{outcome=skipped_%s} = %g, want %d", r, got, n)
		}
	}
	// top (single key) + products 3, 5 (values) and 404 (no such row: negative).
	if got, want := [4]int{rep.Wanted, rep.Written, rep.Negative, rep.Failed}, [4]int{4, 3, 1, 0}; got != want {
		t.Errorf("wanted, written, negative, failed = %v, want %v", got, want)
	}
	if got, want := rep.Coverage, 1.0; got != want {
		t.Errorf("coverage = %g, want %g", got, want)
	}
	if got, want := e.Src.Sorted(), []string{"", "3", "404", "5"}; !slices.Equal(got, want) {
		t.Errorf("origin asked for %q, want %q (nothing hostile)", got, want)
	}
	if got, want := e.Keys(t), []string{"product:3", "product:404", "product:5", "top"}; !slices.Equal(got, want) {
		t.Errorf("redis keys = %q, want %q", got, want)
	}
	if got, want := rd.Client.Get(context.Background(), p+"product:5").Val(), "p5"; got != want {
		t.Errorf("product:5 = %q, want %q", got, want)
	}
}

// TestPrewarmBatchesHottestFirst: one origin query per batch of the
// declaration's batch size, the hottest keys in the first batch, and never
// more batches in flight than the concurrency bound.
func TestPrewarmBatchesHottestFirst(t *testing.T) {
	rd := testenv.Redis(t)
	// A slow origin, so that batches overlap if nothing bounds them.
	e := prewarmtest.New(t, rd.Client, rd.Prefix, 100, 10,
		"SELECT id::text, v FROM products, pg_sleep(0.05) WHERE id::text = ANY($1)")
	var hot []string
	for i := 100; i >= 51; i-- { // 100 is the hottest
		hot = append(hot, fmt.Sprintf("%sproduct:%d", rd.Prefix, i))
	}
	e.Record(t, hot...)
	run := func(t *testing.T, concurrency int) ([][]string, int, []prewarm.Progress) {
		t.Helper()
		e.Src.Reset()
		opts := e.Options(50)
		opts.Concurrency = concurrency
		var progress []prewarm.Progress
		opts.Progress = func(p prewarm.Progress) { progress = append(progress, p) }
		rep, err := e.PW.Run(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := rep.Written, 51; got != want {
			t.Errorf("written = %d, want %d (50 products and the single key)", got, want)
		}
		loads := e.Src.Loads()
		if got, want := len(loads), 6; got != want {
			t.Fatalf("origin queries = %d, want %d (the single key, then 5 batches of 10)", got, want)
		}
		return loads, e.Src.Peak(), progress
	}

	t.Run("hottest first", func(t *testing.T) {
		calls, _, progress := run(t, 1) // one at a time: loads start in dispatch order
		first := slices.Clone(calls[1])
		sort.Strings(first)
		want := []string{"100", "91", "92", "93", "94", "95", "96", "97", "98", "99"}
		if calls[0] != nil || !slices.Equal(first, want) {
			t.Errorf("loads = %q, %q, …; want the single key, then the 10 hottest %q", calls[0], first, want)
		}
		if len(progress) == 0 || !progress[0].Reading {
			t.Fatalf("progress = %+v, want a first report while the access log is read", progress)
		}
		for i := 1; i < len(progress); i++ {
			if progress[i].Wanted < progress[i-1].Wanted || progress[i].Done < progress[i-1].Done {
				t.Errorf("progress went backwards: %+v then %+v", progress[i-1], progress[i])
			}
		}
		if last := progress[len(progress)-1]; last.Wanted != 51 || last.Done != 51 || last.Reading {
			t.Errorf("last progress = %+v, want 51 wanted and 51 done", last)
		}
	})
	t.Run("concurrency bound", func(t *testing.T) {
		if _, maxIn, _ := run(t, 2); maxIn > 2 {
			t.Errorf("%d loads in flight at once, want at most the concurrency bound 2", maxIn)
		}
	})
}

// TestPrewarmRateBound: batch loads start no faster than the rate allows.
func TestPrewarmRateBound(t *testing.T) {
	rd := testenv.Redis(t)
	e := prewarmtest.New(t, rd.Client, rd.Prefix, 50, 10, "")
	var hot []string
	for i := 1; i <= 50; i++ {
		hot = append(hot, fmt.Sprintf("%sproduct:%d", rd.Prefix, i))
	}
	e.Record(t, hot...)
	opts := e.Options(50)
	opts.Rate = 20 // 6 batches (the single key and 5 of 10): at least 5 intervals of 50ms
	rep, err := e.PW.Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if min := 250 * time.Millisecond; rep.Duration < min {
		t.Errorf("6 batches at 20/s took %s, want at least %s", rep.Duration, min)
	}
}

// TestPrewarmCoverage: a member the origin cannot load counts as failed and
// lowers the coverage; a member with no row is a negative sentinel and does not.
func TestPrewarmCoverage(t *testing.T) {
	rd := testenv.Redis(t)
	e := prewarmtest.New(t, rd.Client, rd.Prefix, 20, 100, "")
	e.Record(t, rd.Prefix+"product:1", rd.Prefix+"product:13", rd.Prefix+"product:999")
	rep, err := e.PW.Run(context.Background(), e.Options(10))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := [4]int{rep.Wanted, rep.Written, rep.Negative, rep.Failed}, [4]int{4, 2, 1, 1}; got != want {
		t.Errorf("wanted, written, negative, failed = %v, want %v", got, want)
	}
	if got, want := rep.Coverage, 0.75; got != want {
		t.Errorf("coverage = %g, want %g", got, want)
	}
	if got, want := promtest.Value(t, e.Reg, "hearth_prewarm_coverage_ratio"), 0.75; got != want {
		t.Errorf("hearth_prewarm_coverage_ratio = %g, want %g", got, want)
	}
	if got, want := promtest.Value(t, e.Reg, "hearth_prewarm_runs_total", "result", "partial"), 1.0; got != want {
		t.Errorf("hearth_prewarm_runs_total{result=partial} = %g, want %g", got, want)
	}
}

// TestPrewarmRepeatedKeysLoadOnce: a stored ranking that repeats keys
// (another client can write it), within a chunk and across chunks, loads each
// key once and counts it once as wanted.
func TestPrewarmRepeatedKeysLoadOnce(t *testing.T) {
	rd := testenv.Redis(t)
	e := prewarmtest.New(t, rd.Client, rd.Prefix, 20, 2, "")
	p := rd.Prefix
	// A stored chunk holds 1,000 keys: the first is filled with keys of no
	// declaration.
	first := []string{p + "product:1", p + "product:2", p + "product:1"}
	for i := len(first); i < 1000; i++ {
		first = append(first, fmt.Sprintf("%sother:%d", p, i))
	}
	if _, err := e.PG.Pool.Exec(context.Background(), `INSERT INTO hearth_access_rank (chunk, keys) VALUES (0, $1::text[]), (1, $2::text[])`,
		first, []string{p + "product:2", p + "product:3", p + "top"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.PG.Pool.Exec(context.Background(), `INSERT INTO hearth_access_rank_info (computed_at, window_ms, top_n, keys) VALUES (now(), 3600000, 2000, 1003)`); err != nil {
		t.Fatal(err)
	}
	e.Log.UseRanking(time.Hour)
	rep, err := e.PW.Run(context.Background(), e.Options(2000))
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Log.LastRanking(); got != accesslog.RankingStored {
		t.Fatalf("ranking %q, want the stored one", got)
	}
	if !strings.HasPrefix(rep.Ranking, "stored, ") || !strings.Contains(rep.Ranking, "buckets ") {
		t.Errorf("report ranking %q, want the stored ranking's age and buckets", rep.Ranking)
	}
	if got, want := e.Src.Sorted(), []string{"", "1", "2", "3"}; !slices.Equal(got, want) {
		t.Errorf("origin asked for %q, want each member once %q", got, want)
	}
	if got, want := [3]int{rep.Candidates, rep.Wanted, rep.Written}, [3]int{1003, 4, 4}; got != want {
		t.Errorf("candidates, wanted, written = %v, want %v", got, want)
	}
	// The repeats are counted as skipped, with the keys of no declaration.
	if got, want := [2]int{rep.Skipped[prewarm.SkipDuplicate], rep.Skipped[prewarm.SkipUnknown]}, [2]int{2, 997}; got != want {
		t.Errorf("skipped duplicate, unknown = %v, want %v", got, want)
	}
	if got := promtest.Value(t, e.Reg, "hearth_prewarm_keys_total", "outcome", "skipped_duplicate"); got != 2 {
		t.Errorf("hearth_prewarm_keys_total{outcome=skipped_duplicate} = %g, want 2", got)
	}
	if rep.Coverage != 1 {
		t.Errorf("coverage = %g, want 1: every key asked for once was loaded", rep.Coverage)
	}
}

// TestPrewarmRepeatsKeepBatchesFull is a property test: for stored rankings
// that repeat keys anywhere (next to each other, across a batch's end, long
// after), at random batch sizes, each member is loaded exactly once, in the
// order of its first place in the ranking, in full batches but the last; and
// every repeat is counted as skipped, never as wanted.
func TestPrewarmRepeatsKeepBatchesFull(t *testing.T) {
	rd := testenv.Redis(t)
	const products = 60
	for round := range 8 {
		r := mrand.New(mrand.NewPCG(uint64(round), 7))
		batch := 2 + r.IntN(6)
		t.Run(fmt.Sprintf("round %d batch %d", round, batch), func(t *testing.T) {
			prefix := fmt.Sprintf("%sr%d:", rd.Prefix, round)
			e := prewarmtest.New(t, rd.Client, prefix, products, batch, "")
			ctx := context.Background()
			var ranking, first []string
			seen := map[string]bool{}
			for len(ranking) < 90 {
				m := strconv.Itoa(1 + r.IntN(products))
				if r.IntN(4) == 0 && len(ranking) > 0 { // the last key again
					m = strings.TrimPrefix(ranking[len(ranking)-1], prefix+"product:")
				}
				ranking = append(ranking, prefix+"product:"+m)
				if !seen[m] {
					seen[m] = true
					first = append(first, m)
				}
			}
			if _, err := e.PG.Pool.Exec(ctx, `INSERT INTO hearth_access_rank (chunk, keys) VALUES (0, $1::text[])`, ranking); err != nil {
				t.Fatal(err)
			}
			if _, err := e.PG.Pool.Exec(ctx, `INSERT INTO hearth_access_rank_info (computed_at, window_ms, top_n, keys) VALUES (now(), 3600000, 1000, $1)`, len(ranking)); err != nil {
				t.Fatal(err)
			}
			e.Log.UseRanking(time.Hour)
			opts := e.Options(1000)
			opts.Concurrency = 1 // loads start in queue order
			rep, err := e.PW.Run(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			var asked []string
			loads := e.Src.Loads()[1:] // after the single key's
			for i, l := range loads {
				if i < len(loads)-1 && len(l) != batch {
					t.Errorf("load %d of %d asked for %d members %q: want full batches of %d but the last", i+1, len(loads), len(l), l, batch)
				}
				asked = append(asked, l...)
			}
			if !slices.Equal(asked, first) {
				t.Errorf("members asked %q, want each once in ranking order %q", asked, first)
			}
			dups := len(ranking) - len(first)
			if got, want := [3]int{rep.Candidates, rep.Wanted, rep.Skipped[prewarm.SkipDuplicate]}, [3]int{len(ranking), len(first) + 1, dups}; got != want {
				t.Errorf("candidates, wanted, skipped duplicate = %v, want %v (%d repeats)", got, want, dups)
			}
		})
	}
}

// TestPrewarmAccessLogUnreadable: without a readable access log the declared
// single keys still load, and the error is returned.
func TestPrewarmAccessLogUnreadable(t *testing.T) {
	rd := testenv.Redis(t)
	e := prewarmtest.New(t, rd.Client, rd.Prefix, 5, 100, "")
	if _, err := e.PG.Pool.Exec(context.Background(), "DROP TABLE hearth_access_log"); err != nil {
		t.Fatal(err)
	}
	rep, err := e.PW.Run(context.Background(), e.Options(10))
	if err == nil || !strings.Contains(err.Error(), accesslog.Table) || !strings.Contains(err.Error(), "hearth migrate up") {
		t.Fatalf("err = %v, want one naming %s and the fix", err, accesslog.Table)
	}
	if got, want := e.Keys(t), []string{"top"}; !slices.Equal(got, want) {
		t.Errorf("redis keys = %q, want %q", got, want)
	}
	if got, want := rep.Written, 1; got != want {
		t.Errorf("written = %d, want %d", got, want)
	}
	if got, want := promtest.Value(t, e.Reg, "hearth_prewarm_access_log_errors_total"), 1.0; got != want {
		t.Errorf("hearth_prewarm_access_log_errors_total = %g, want %g", got, want)
	}
	// The ranking failed: the run failed, whatever it loaded. The top 10 keys
	// asked for count as wanted and not loaded, next to the one single key.
	if !rep.AccessLogFailed || rep.Error == "" {
		t.Errorf("report: access_log_failed %v, error %q; want the failure", rep.AccessLogFailed, rep.Error)
	}
	if got, want := rep.Coverage, 1.0/11; got != want {
		t.Errorf("coverage = %g, want %g", got, want)
	}
	if got, want := promtest.Value(t, e.Reg, "hearth_prewarm_coverage_ratio"), 1.0/11; got != want {
		t.Errorf("hearth_prewarm_coverage_ratio = %g, want %g", got, want)
	}
	if got, want := promtest.Value(t, e.Reg, "hearth_prewarm_runs_total", "result", "error"), 1.0; got != want {
		t.Errorf("hearth_prewarm_runs_total{result=error} = %g, want %g", got, want)
	}
}

// TestPrewarmFromHostileBuckets: Redis access-log buckets holding, next to
// good keys, a member of 3,000 bytes and scores of inf, -inf, a negative count
// and 1e300 (in three buckets) are rolled up, ranked and pre-warmed: the good
// keys load, the bad members are skipped and counted, the absurd count is
// lowered. (The long member failed the whole roll-up every run, and the sum of
// the absurd counts made the ranking fail with "bigint out of range" while the
// coverage said 1.)
func TestPrewarmFromHostileBuckets(t *testing.T) {
	rd := testenv.Redis(t)
	e := prewarmtest.New(t, rd.Client, rd.Prefix, 20, 100, "")
	ctx := context.Background()
	p, ns := rd.Prefix, strings.TrimSuffix(rd.Prefix, ":")
	reg := prometheus.NewRegistry()
	roller, err := accesslog.NewRoller(accesslog.RollerOptions{
		Log: e.Log, Client: rd.Client, Namespace: ns, Bucket: time.Minute, Lookback: time.Hour, Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Random digits: PostgreSQL compresses a repeated one below the btree limit.
	long := make([]byte, 3000)
	for i := range long {
		long[i] = byte('0' + mrand.IntN(10))
	}
	for _, ago := range []time.Duration{2, 3, 4} {
		key := accesslog.BucketKey(ns, accesslog.BucketStart(time.Now().Add(-ago*time.Minute), time.Minute))
		for _, z := range []redis.Z{
			{Score: 5, Member: p + "product:3"}, {Score: 3, Member: p + "product:5"},
			{Score: 9, Member: p + "product:" + string(long)},
			{Score: math.Inf(1), Member: p + "product:7"}, {Score: math.Inf(-1), Member: p + "product:8"},
			{Score: -2, Member: p + "product:9"}, {Score: 1e300, Member: p + "product:11"},
		} {
			if err := rd.Client.ZAdd(ctx, key, z).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	res, err := roller.RollupOnce(ctx)
	if err != nil {
		t.Fatalf("roll-up: %v", err)
	}
	if got, want := [4]int{res.Buckets, res.Rows, res.Skipped, res.Clamped}, [4]int{3, 9, 12, 3}; got != want {
		t.Errorf("roll-up buckets, rows, skipped, clamped = %v, want %v", got, want)
	}
	if got, want := promtest.Value(t, reg, "hearth_access_log_skipped_keys_total", "reason", accesslog.SkipTooLong), 3.0; got != want {
		t.Errorf("skipped{too_long} = %g, want %g", got, want)
	}
	if got, want := promtest.Value(t, reg, "hearth_access_log_skipped_keys_total", "reason", accesslog.SkipBadScore), 9.0; got != want {
		t.Errorf("skipped{bad_score} = %g, want %g", got, want)
	}
	if _, err := roller.RankOnce(ctx); err != nil {
		t.Errorf("ranking: %v", err)
	}

	rep, err := e.PW.Run(ctx, e.Options(100))
	if err != nil {
		t.Fatalf("pre-warm: %v", err)
	}
	// top (single key) + products 11 (the lowered count), 3 and 5.
	if got, want := [4]int{rep.Candidates, rep.Wanted, rep.Written, rep.Failed}, [4]int{3, 4, 4, 0}; got != want {
		t.Errorf("candidates, wanted, written, failed = %v, want %v", got, want)
	}
	if rep.Coverage != 1 || rep.AccessLogFailed {
		t.Errorf("coverage %g, access log failed %v; want 1, false", rep.Coverage, rep.AccessLogFailed)
	}
	if got, want := e.Keys(t), []string{"product:11", "product:3", "product:5", "top"}; !slices.Equal(got, want) {
		t.Errorf("redis keys = %q, want %q", got, want)
	}
	if got, want := promtest.Value(t, e.Reg, "hearth_prewarm_runs_total", "result", "ok"), 1.0; got != want {
		t.Errorf("hearth_prewarm_runs_total{result=ok} = %g, want %g", got, want)
	}
}

// TestStartPrewarm: a background pre-warm reports progress while it runs,
// refuses a second one, survives a reload, and leaves its report behind.
func TestStartPrewarm(t *testing.T) {
	rd := testenv.Redis(t)
	e := prewarmtest.New(t, rd.Client, rd.Prefix, 30, 5,
		"SELECT id::text, v FROM products, pg_sleep(0.1) WHERE id::text = ANY($1)")
	var hot []string
	for i := 1; i <= 30; i++ {
		hot = append(hot, fmt.Sprintf("%sproduct:%d", rd.Prefix, i))
	}
	e.Record(t, hot...)
	opts := e.Options(30)
	opts.Concurrency = 1
	done, err := e.PW.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if st := e.PW.Status(); !st.Current.Running {
		t.Errorf("status right after start = %+v, want running", st.Current)
	}
	if _, err := e.PW.Start(context.Background(), opts); !errors.Is(err, prewarm.ErrBusy) {
		t.Errorf("second Start: err = %v, want ErrBusy", err)
	}
	// A config reload while it runs (the race detector watches).
	if _, err := e.W.Apply(e.W.Specs()); err != nil {
		t.Fatal(err)
	}
	rep := <-done
	if got, want := rep.Wanted, 31; got != want {
		t.Errorf("wanted = %d, want %d", got, want)
	}
	st := e.PW.Status()
	if st.Current.Running || st.Last == nil || st.Last.Wanted != 31 {
		t.Errorf("status after the run = %+v (last %+v), want idle with the last report", st.Current, st.Last)
	}
}
