package hotset_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/hotset"
	"github.com/hearth-dev/hearth/internal/prewarmtest"
	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/sourcetest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/migrations"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// hotEnv is a catalogue in PostgreSQL, its access log, and a warmer whose
// family <prefix>product:{id} (digits only) has the static member 1 and takes
// the rest from the access log.
type hotEnv struct {
	pg     *testenv.PostgresEnv
	rdb    *redis.Client
	prefix string
	log    *accesslog.Log
	src    *prewarmtest.Counting
	reg    *prometheus.Registry
	w      *warmer.Warmer
	sets   *hotset.Sets
	cfg    *config.Config
}

const hotProducts = 50_000

func newHotEnv(t *testing.T, hotSet string) *hotEnv {
	t.Helper()
	ctx := context.Background()
	rd := testenv.Redis(t)
	e := &hotEnv{pg: testenv.Postgres(t), rdb: rd.Client, prefix: rd.Prefix, reg: prometheus.NewRegistry()}
	for _, q := range []string{
		`CREATE TABLE products (id bigint PRIMARY KEY, v text NOT NULL)`,
		fmt.Sprintf(`INSERT INTO products SELECT i, 'p' || i FROM generate_series(1, %d) i`, hotProducts),
	} {
		if _, err := e.pg.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	db := stdlib.OpenDBFromPool(e.pg.Pool)
	defer db.Close()
	p, err := migrations.NewProvider(db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	e.cfg = e.config(t, hotSet)
	src, err := postgres.New(postgres.Config{Name: "catalog", DSN: e.pg.DSN, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	e.src = &prewarmtest.Counting{Recorder: sourcetest.Record(src)}
	e.log = accesslog.New(e.pg.Pool)
	e.w, err = warmer.New(warmer.Options{
		Store: &store.RedisStore{Client: e.rdb}, Sources: map[string]warmer.Source{"catalog": e.src},
		Specs: e.cfg.Specs(), MaxConcurrentLoads: 4, Registerer: e.reg, Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.sets = hotset.New(e.w, e.reg, zerolog.Nop())
	e.sets.Declare(e.cfg.Specs())
	return e
}

// config declares the family with hotSet as its members_from.access_log
// (empty: none), TTL 2s (refreshed every 1s).
func (e *hotEnv) config(t *testing.T, hotSet string) *config.Config {
	t.Helper()
	from := ""
	if hotSet != "" {
		from = "    members_from: {access_log: {" + hotSet + "}}\n"
	}
	cfg, err := config.Parse("hot.yaml", []byte(fmt.Sprintf(`
sources:
  - {name: catalog, type: postgres, dsn: %q}
access_log: {source: catalog}
keys:
  - name: product
    key: %q
    source: catalog
    ttl: 2s
    load_timeout: 500ms
    batch_size: 100
    param_pattern: "[0-9]{1,12}"
    members: ["1"]
    query: "SELECT id::text, v FROM products WHERE id = ANY($1::bigint[])"
%s`, e.pg.DSN, e.prefix+"product:{id}", from)))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func (e *hotEnv) key(m string) string { return e.prefix + "product:" + m }

// traffic replaces the access log with reads of the given members, the
// first the most read: a workload whose hot set is exactly these, in order.
func (e *hotEnv) traffic(t *testing.T, members ...string) {
	t.Helper()
	keys := make([]string, len(members))
	for i, m := range members {
		keys[i] = e.key(m)
	}
	e.trafficKeys(t, keys...)
}

func (e *hotEnv) trafficKeys(t *testing.T, keys ...string) {
	t.Helper()
	if _, err := e.pg.Pool.Exec(context.Background(), "DELETE FROM "+accesslog.Table); err != nil {
		t.Fatal(err)
	}
	h := make(map[string]int64, len(keys))
	for i, k := range keys {
		h[k] = int64(len(keys) - i + 1)
	}
	if err := e.log.Record(context.Background(), time.Now(), time.Minute, h); err != nil {
		t.Fatal(err)
	}
}

func (e *hotEnv) rank(t *testing.T) hotset.Change {
	t.Helper()
	ch, err := e.sets.Rank(context.Background(), "product", e.log)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func memberRange(from, to int) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, strconv.Itoa(i))
	}
	return out
}

// TestHotSetFollowsShiftingTraffic: the family's hottest keys are promoted and
// written at once, refreshed on the family's schedule with its static member;
// when traffic moves to other keys, those are promoted, the old ones are no
// longer refreshed and expire. A separate client watches Redis.
func TestHotSetFollowsShiftingTraffic(t *testing.T) {
	e := newHotEnv(t, "top_n: 5, hysteresis: 0.2, demote_after: 1")
	ctx := context.Background()
	watch := redis.NewClient(&redis.Options{Addr: e.rdb.Options().Addr})
	defer watch.Close()

	old := memberRange(100, 104)
	e.traffic(t, append(old, memberRange(200, 210)...)...)
	ch := e.rank(t)
	if got, want := ch.Promoted, old; !slices.Equal(sorted(got), want) {
		t.Fatalf("promoted %v, want %v", got, want)
	}
	if got, want := ch.Loaded.Written, 5; got != want {
		t.Errorf("promoted members written at once: %d, want %d", got, want)
	}
	for _, m := range old {
		if v, err := watch.Get(ctx, e.key(m)).Result(); err != nil || v != "p"+m {
			t.Fatalf("GET %s = %q, %v; want p%s", e.key(m), v, err, m)
		}
	}
	e.src.Reset()
	if _, err := e.w.Refresh(ctx, "product", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, want := e.src.Sorted(), append([]string{"1"}, old...); !slices.Equal(got, want) {
		t.Fatalf("refresh asked %v, want %v (static member + hot set)", got, want)
	}

	// The hot set moves.
	next := memberRange(300, 304)
	e.traffic(t, append(next, memberRange(400, 420)...)...)
	ch = e.rank(t)
	if got := sorted(ch.Promoted); !slices.Equal(got, next) {
		t.Errorf("promoted %v, want %v", got, next)
	}
	if got := ch.Demoted; !slices.Equal(got, old) {
		t.Errorf("demoted %v, want %v", got, old)
	}
	if got, want := e.w.HotMembers("product"), next; !slices.Equal(got, want) {
		t.Errorf("hot set %v, want %v", got, want)
	}
	// Refreshed on schedule (every second here) for longer than the demoted
	// keys' TTL: the new ones stay, the old ones expire unrefreshed.
	ttl0 := watch.PTTL(ctx, e.key(old[0])).Val()
	deadline := time.Now().Add(4 * time.Second)
	var expired bool
	for time.Now().Before(deadline) {
		e.src.Reset()
		if _, err := e.w.Refresh(ctx, "product", warmer.RunOptions{}); err != nil {
			t.Fatal(err)
		}
		if asked := e.src.Sorted(); slices.ContainsFunc(asked, func(m string) bool { return slices.Contains(old, m) }) {
			t.Fatalf("a demoted member was refreshed: asked %v", asked)
		}
		for _, m := range append([]string{"1"}, next...) {
			if n := watch.Exists(ctx, e.key(m)).Val(); n != 1 {
				t.Fatalf("%s is missing while hot", e.key(m))
			}
		}
		if ttl := watch.PTTL(ctx, e.key(old[0])).Val(); ttl > ttl0 {
			t.Fatalf("demoted %s was rewritten: pttl %s > %s", e.key(old[0]), ttl, ttl0)
		}
		if watch.Exists(ctx, e.key(old[0]), e.key(old[4])).Val() == 0 {
			expired = true
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if !expired {
		t.Fatal("demoted keys did not expire")
	}
	if got, want := promtest.Value(t, e.reg, "hearth_hotset_promotions_total", "family", "product"), 10.0; got != want {
		t.Errorf("promotions = %g, want %g", got, want)
	}
	if got, want := promtest.Value(t, e.reg, "hearth_hotset_demotions_total", "family", "product"), 5.0; got != want {
		t.Errorf("demotions = %g, want %g", got, want)
	}
	if got, want := promtest.Value(t, e.reg, "hearth_hotset_members", "family", "product"), 5.0; got != want {
		t.Errorf("hot-set size = %g, want %g", got, want)
	}
	if got, want := promtest.Value(t, e.reg, "hearth_hotset_rankings_total", "family", "product", "result", "live"), 2.0; got != want {
		t.Errorf("live rankings = %g, want %g", got, want)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.SortFunc(s, func(a, b string) int {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return x - y
	})
	return s
}

// TestHotSetHysteresisStopsFlapping: two keys swap places at the boundary
// (ranks 5 and 6 of top_n 5) at every ranking. With hysteresis both stay
// and nothing moves after the second ranking; without it, every ranking
// demotes one and promotes the other. A member that falls out entirely
// stays for demote_after rankings.
func TestHotSetHysteresisStopsFlapping(t *testing.T) {
	steady := memberRange(1000, 1003)
	run := func(t *testing.T, hysteresis string) (promotions, demotions float64) {
		e := newHotEnv(t, "top_n: 5, demote_after: 1, hysteresis: "+hysteresis)
		for i := range 6 {
			a, b := "2000", "2001"
			if i%2 == 1 {
				a, b = b, a
			}
			e.traffic(t, append(slices.Clone(steady), a, b, "3000", "3001")...)
			e.rank(t)
			if n := len(e.w.HotMembers("product")); n > 6 {
				t.Fatalf("hot set holds %d members, more than 5 × 1.2", n)
			}
		}
		return promtest.Value(t, e.reg, "hearth_hotset_promotions_total", "family", "product"),
			promtest.Value(t, e.reg, "hearth_hotset_demotions_total", "family", "product")
	}
	t.Run("with", func(t *testing.T) {
		p, d := run(t, "0.2")
		if p != 6 || d != 0 {
			t.Errorf("promotions %g, demotions %g; want 6, 0 (both boundary keys kept)", p, d)
		}
	})
	t.Run("without", func(t *testing.T) {
		p, d := run(t, "0")
		if p != 10 || d != 5 {
			t.Errorf("promotions %g, demotions %g; want 10, 5 (a flap per ranking)", p, d)
		}
	})
	t.Run("demote_after", func(t *testing.T) {
		e := newHotEnv(t, "top_n: 3, hysteresis: 0, demote_after: 3")
		e.traffic(t, "1", "2", "3")
		e.rank(t)
		for i := 1; i <= 3; i++ {
			e.traffic(t, "1", "2") // 3 is read no more
			ch := e.rank(t)
			want := []string{"1", "2", "3"}
			if i == 3 {
				want = []string{"1", "2"}
			}
			if got := e.w.HotMembers("product"); !slices.Equal(got, want) {
				t.Fatalf("after %d rankings without 3: hot set %v, want %v (demoted %v)", i, got, want, ch.Demoted)
			}
		}
	})
}

// TestHotSetBoundedUnderFlood: tens of thousands of distinct keys, each read
// a few times, never grow the hot set past top_n × (1 + hysteresis), nor the
// family's refresh past its static members plus that.
func TestHotSetBoundedUnderFlood(t *testing.T) {
	e := newHotEnv(t, "top_n: 20, hysteresis: 0.2, demote_after: 5")
	for round := range 3 {
		keys := make([]string, 0, 20_000)
		for i := range 20_000 {
			keys = append(keys, e.key(strconv.Itoa(round*20_000+i+1)))
		}
		e.trafficKeys(t, keys...)
		ch := e.rank(t)
		if got, want := ch.Ranked, 24; got != want {
			t.Errorf("round %d: ranked %d valid keys, want the limit %d", round, got, want)
		}
		if n := len(e.w.HotMembers("product")); n > 24 {
			t.Fatalf("round %d: hot set holds %d members, more than 24", round, n)
		}
	}
	e.src.Reset()
	out, err := e.w.Refresh(context.Background(), "product", warmer.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out.Members > 25 {
		t.Errorf("refresh covered %d members, more than 1 static + 24 hot", out.Members)
	}
	if got := promtest.Value(t, e.reg, "hearth_hotset_members", "family", "product"); got != 24 {
		t.Errorf("hot-set size = %g, want 24 (20 + members waiting out demote_after)", got)
	}
}

// TestHotSetSkipsBadKeys: access-log keys that match the template's name but
// not its member rules (not digits, too long), or that the ranker returns
// though they are not the family's, are skipped and counted, never loaded or
// written; the good keys around them are promoted.
func TestHotSetSkipsBadKeys(t *testing.T) {
	e := newHotEnv(t, "top_n: 3, hysteresis: 0, demote_after: 1")
	ctx := context.Background()
	bad := []string{e.key("abc"), e.key(strings.Repeat("9", 40)), e.key("1 2"), e.key("-1")}
	e.trafficKeys(t, append(bad, e.key("7"), e.key("8"), e.key("9"))...)
	ch := e.rank(t)
	if got, want := sorted(ch.Promoted), []string{"7", "8", "9"}; !slices.Equal(got, want) {
		t.Errorf("promoted %v, want %v", got, want)
	}
	if got, want := promtest.Value(t, e.reg, "hearth_hotset_skipped_keys_total", "family", "product", "reason", hotset.SkipInvalidMember), 4.0; got != want {
		t.Errorf("skipped invalid members = %g, want %g", got, want)
	}
	for _, k := range bad {
		if n := e.rdb.Exists(ctx, k).Val(); n != 0 {
			t.Errorf("bad key %q was written", k)
		}
	}
	for _, m := range e.src.Sorted() {
		if _, err := strconv.Atoi(m); err != nil {
			t.Errorf("origin asked for %q", m)
		}
	}

	// A ranker is untrusted too: a key of another family or a huge one.
	forged := forgedRanker{keys: []string{"other:1", e.key(strings.Repeat("1", hotset.MaxLogKeyBytes)), e.key("5")}}
	ch, err := e.sets.Rank(ctx, "product", forged)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ch.Skipped, map[string]int{hotset.SkipNoMatch: 1, hotset.SkipTooLong: 1}; !mapsEqual(got, want) {
		t.Errorf("skipped %v, want %v", got, want)
	}
	if got, want := e.w.HotMembers("product"), []string{"5"}; !slices.Equal(got, want) {
		t.Errorf("hot set %v, want %v", got, want)
	}
}

type forgedRanker struct{ keys []string }

func (f forgedRanker) EachTopMatching(_ context.Context, _ time.Duration, _ int, _, _ string, fn func(string) bool) (string, error) {
	for _, k := range f.keys {
		if !fn(k) {
			break
		}
	}
	return accesslog.RankingLive, nil
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestHotSetReadsStoredRanking: with a fresh stored ranking of the window the
// hot set reads it (filtered to the family's keys, in order) instead of
// ranking the log; when the stored ranking holds too few of the family's keys
// it ranks live.
func TestHotSetReadsStoredRanking(t *testing.T) {
	e := newHotEnv(t, "top_n: 3, hysteresis: 0, window: 1h")
	ctx := context.Background()
	e.log.UseRanking(time.Minute)
	e.trafficKeys(t, "other:1", e.key("11"), "other:2", e.key("12"), e.key("13"), e.key("14"))
	if _, err := e.log.Rank(ctx, time.Hour, 100); err != nil {
		t.Fatal(err)
	}
	ch := e.rank(t)
	if got, want := ch.Ranking, accesslog.RankingStored; got != want {
		t.Errorf("ranking %q, want %q", got, want)
	}
	if got, want := sorted(ch.Promoted), []string{"11", "12", "13"}; !slices.Equal(got, want) {
		t.Errorf("promoted %v, want %v", got, want)
	}
	// A stored ranking of only the 2 hottest keys overall is not enough.
	if _, err := e.log.Rank(ctx, time.Hour, 2); err != nil {
		t.Fatal(err)
	}
	if ch = e.rank(t); ch.Ranking != accesslog.RankingLive {
		t.Errorf("ranking %q from a short stored ranking, want live", ch.Ranking)
	}
	if got, want := e.w.HotMembers("product"), []string{"11", "12", "13"}; !slices.Equal(got, want) {
		t.Errorf("hot set %v, want %v", got, want)
	}
}

// TestHotSetSurvivesReload: a reload that changes the family keeps its hot
// set; one that drops members_from stops refreshing the hot members.
func TestHotSetSurvivesReload(t *testing.T) {
	e := newHotEnv(t, "top_n: 2, hysteresis: 0")
	ctx := context.Background()
	e.traffic(t, "21", "22")
	e.rank(t)

	changed := e.config(t, "top_n: 3, hysteresis: 0")
	if _, err := e.w.Apply(changed.Specs()); err != nil {
		t.Fatal(err)
	}
	if got, want := e.w.HotMembers("product"), []string{"21", "22"}; !slices.Equal(got, want) {
		t.Errorf("hot set after reload %v, want %v", got, want)
	}
	e.src.Reset()
	if _, err := e.w.Refresh(ctx, "product", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, want := e.src.Sorted(), []string{"1", "21", "22"}; !slices.Equal(got, want) {
		t.Errorf("refresh asked %v, want %v", got, want)
	}

	if _, err := e.w.Apply(e.config(t, "").Specs()); err != nil {
		t.Fatal(err)
	}
	e.src.Reset()
	if _, err := e.w.Refresh(ctx, "product", warmer.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, want := e.src.Sorted(), []string{"1"}; !slices.Equal(got, want) {
		t.Errorf("refresh without members_from asked %v, want %v", got, want)
	}
	if _, err := e.sets.Rank(ctx, "product", e.log); err == nil {
		t.Error("Rank of a family without a hot set succeeded")
	}
}
