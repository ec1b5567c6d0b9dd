package changes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/changes"
	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/migrations"
	"github.com/hearth-dev/hearth/prewarm"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/warmer"
)

// changeEnv is a warmer leading on a real Redis, loading a products table
// from a real PostgreSQL with hearth_notify() attached, and a change
// listener.
type changeEnv struct {
	t       *testing.T
	pool    *pgxpool.Pool // the test's own connections (updates)
	rdb     *redis.Client // the observer's client, not the warmer's
	prefix  string
	channel string
	rows    int
	w       *warmer.Warmer
	reg     *prometheus.Registry
	term    *leader.Term
	chg     *changes.Listeners
	// endTerm ends the listeners' term (startTerm starts a new one), as a
	// lost lease ends the leader's; runDone is closed when Run returned.
	endTerm context.CancelFunc
	runDone chan struct{}
}

// startTerm runs the listeners under a new term's context.
func (e *changeEnv) startTerm() {
	tctx, end := context.WithCancel(e.term.Context())
	done := make(chan struct{})
	e.endTerm, e.runDone = end, done
	go func() { defer close(done); _ = e.chg.Run(tctx) }()
}

// stopTerm ends the term and waits for Run to return.
func (e *changeEnv) stopTerm() {
	e.endTerm()
	<-e.runDone
}

// notifyFunctionSQL is the Up section of the migration that creates hearth_notify().
func notifyFunctionSQL(t *testing.T) string {
	t.Helper()
	b, err := fs.ReadFile(migrations.FS, "00005_change_notify.sql")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "-- +goose StatementBegin")
	end := strings.Index(s, "-- +goose StatementEnd")
	if start < 0 || end < start {
		t.Fatal("migration 00005 has no statement block")
	}
	return s[start:end]
}

// newChangeEnv sets up rows products, the trigger, the warmer (loaded once)
// and the listener. loadDSN is what the source loads through, listenDSN what
// the listener connects to (a proxy in the fault tests).
func newChangeEnv(t *testing.T, pool *pgxpool.Pool, loadDSN, listenDSN string, rows int) *changeEnv {
	t.Helper()
	return newChangeEnvWith(t, pool, loadDSN, listenDSN, rows, envOptions{})
}

// newChangeEnvSpaced is newChangeEnv with change-driven full refreshes minFull apart.
func newChangeEnvSpaced(t *testing.T, pool *pgxpool.Pool, loadDSN, listenDSN string, rows int, minFull time.Duration) *changeEnv {
	t.Helper()
	return newChangeEnvWith(t, pool, loadDSN, listenDSN, rows, envOptions{minFull: minFull})
}

// envOptions shape a changeEnv beyond its defaults.
type envOptions struct {
	minFull  time.Duration // change-driven full refreshes this far apart (300 ms)
	coalesce time.Duration // notify.coalesce (0, the default)
	batch    int           // batch_size (the default)
	// gate, when set, makes every load of the origin take this advisory lock
	// shared and count itself in the sequence origin_loads: a test holding
	// it exclusively holds the loads back.
	gate int64
}

// newChangeEnvWith is newChangeEnv shaped by o.
func newChangeEnvWith(t *testing.T, pool *pgxpool.Pool, loadDSN, listenDSN string, rows int, o envOptions) *changeEnv {
	t.Helper()
	if o.minFull == 0 {
		o.minFull = 300 * time.Millisecond
	}
	ctx := context.Background()
	r := testenv.Redis(t)
	channel := "hearth_test_" + strconv.FormatUint(rand.Uint64()%1e12, 10)
	e := &changeEnv{t: t, pool: pool, rdb: r.Client, prefix: r.Prefix, channel: channel, rows: rows, reg: prometheus.NewRegistry()}
	for _, q := range []string{
		`CREATE TABLE products (id bigint PRIMARY KEY, name text NOT NULL, version bigint NOT NULL DEFAULT 1)`,
		`CREATE SEQUENCE origin_loads`,
		fmt.Sprintf(`INSERT INTO products (id, name) SELECT i, 'product ' || i FROM generate_series(1, %d) AS i`, rows),
		notifyFunctionSQL(t),
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	trig, err := migrations.NotifyTriggerSQL("product", "products", "id", channel)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, trig); err != nil {
		t.Fatalf("attach trigger: %v\n%s", err, trig)
	}

	ns := "hf" + strconv.FormatUint(rand.Uint64()%1e12, 36)
	testenv.CleanupPrefix(t, r.Addr, ns+":")
	members := make([]string, rows)
	for i := range members {
		members[i] = strconv.Itoa(i + 1)
	}
	cfg := config.Default()
	cfg.Redis.Namespace = ns
	cfg.Sources = []config.Source{{Name: "db", Type: "postgres", DSN: loadDSN}}
	query := `SELECT id::text, json_build_object('id', id, 'name', name, 'version', version)::text, version
FROM products WHERE id = ANY($1::bigint[])`
	if o.gate != 0 {
		query = fmt.Sprintf(`WITH gate AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(%d)::text AS g, nextval('origin_loads') AS n)
SELECT id::text, json_build_object('id', id, 'name', name, 'version', version)::text, version
FROM products, gate WHERE id = ANY($1::bigint[])`, o.gate)
	}
	cfg.Keys = []config.Key{{
		Name: "product", Key: r.Prefix + "product:{id}", Source: "db", TTL: time.Minute,
		Members: members, ParamPattern: "[0-9]{1,12}", BatchSize: o.batch,
		Query:         query,
		VersionColumn: "version",
		Notify:        &config.Notify{Channel: channel, Coalesce: o.coalesce},
	}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "db", DSN: loadDSN, MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)

	wrdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = wrdb.Close() })
	store := fence.NewFencedStore(fence.FencedStoreOptions{Client: wrdb, Namespace: ns, Registerer: e.reg})
	lease, err := leader.NewLease(leader.LeaseOptions{Client: wrdb, Namespace: ns, Duration: 10 * time.Second, Fence: store, Registerer: e.reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lease.Close(context.Background()) })
	e.term, err = lease.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.w, err = warmer.New(warmer.Options{Store: store, Gate: store.Gate(lease), Sources: map[string]warmer.Source{"db": src}, Specs: cfg.Specs(), Registerer: e.reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.w.RefreshAll(ctx); err != nil {
		t.Fatal(err)
	}
	e.chg, err = changes.New(e.w, changes.Options{
		Specs: cfg.Specs(), DSNs: map[string]string{"db": listenDSN},
		MinFullInterval: o.minFull, Registerer: e.reg, Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.startTerm()
	t.Cleanup(func() { e.stopTerm(); _ = e.chg.Close(context.Background()) })
	e.waitConnected(1)
	return e
}

func (e *changeEnv) key(id int) string { return e.prefix + "product:" + strconv.Itoa(id) }

func (e *changeEnv) exec(q string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), q, args...); err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
}

// value reads a product key: its version (0 for the sentinel), its name,
// and whether it exists.
func (e *changeEnv) value(rdb *redis.Client, id int) (version int64, name string, ok bool) {
	s, err := rdb.Get(context.Background(), e.key(id)).Result()
	if err != nil {
		return 0, "", false
	}
	if s == "" {
		return 0, "", true
	}
	var v struct {
		Name    string `json:"name"`
		Version int64  `json:"version"`
	}
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		e.t.Errorf("key %s holds %q: %v", e.key(id), s, err)
	}
	return v.Version, v.Name, true
}

func (e *changeEnv) metric(name string, labels ...string) float64 {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	want := strings.Join(labels, ",")
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var parts []string
			for _, l := range m.GetLabel() {
				parts = append(parts, l.GetName()+"="+l.GetValue())
			}
			if want != "" && strings.Join(parts, ",") != want {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				total += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				total += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				total += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return total
}

func (e *changeEnv) waitConnected(v float64) {
	e.t.Helper()
	testenv.Eventually(e.t, 20*time.Second, fmt.Sprintf("listen connection gauge %v", v), func() bool {
		return e.metric("hearth_change_listen_connected", "source=db") == v
	})
}

// waitName waits until product id's key holds name.
func (e *changeEnv) waitName(id int, name string) {
	e.t.Helper()
	testenv.Eventually(e.t, 20*time.Second, fmt.Sprintf("%s holds name %q", e.key(id), name), func() bool {
		_, got, _ := e.value(e.rdb, id)
		return got == name
	})
}

// TestChangesRefreshChangedRows: an UPDATE reaches Redis by notification
// (nothing else refreshes here), a DELETE becomes the sentinel and a
// re-INSERT the value again; foreign payloads and a flood are counted and
// never stop the refreshes.
func TestChangesRefreshChangedRows(t *testing.T) {
	pg := testenv.Postgres(t)
	e := newChangeEnv(t, pg.Pool, pg.DSN, pg.DSN, 50)

	e.exec(`UPDATE products SET name = 'renamed', version = version + 1 WHERE id = 5`)
	e.waitName(5, "renamed")
	if v, _, _ := e.value(e.rdb, 5); v != 2 {
		t.Errorf("version of product 5 = %d, want 2", v)
	}

	t.Run("delete then re-insert", func(t *testing.T) {
		e.exec(`DELETE FROM products WHERE id = 6`)
		testenv.Eventually(t, 20*time.Second, "sentinel for the deleted row", func() bool {
			v, name, ok := e.value(e.rdb, 6)
			return ok && v == 0 && name == ""
		})
		e.exec(`INSERT INTO products (id, name, version) VALUES (6, 'back', 1)`)
		e.waitName(6, "back")
	})

	t.Run("leadership lost and regained", func(t *testing.T) {
		e.stopTerm()
		e.waitConnected(0)
		e.exec(`UPDATE products SET name = 'while standing by', version = version + 1 WHERE id = 9`)
		e.startTerm()
		e.waitConnected(1)
		// Nobody listened when the row changed: the full refresh of the new
		// session brings it.
		e.waitName(9, "while standing by")
	})

	t.Run("foreign payloads", func(t *testing.T) {
		before := e.metric("hearth_change_notifications_total", "channel="+e.channel, "result=malformed")
		for _, p := range []string{`hello`, `{"hearth":2,"ids":["1"]}`, `{"hearth":1}`, `{"hearth":1,"ids":[1]}`, `{"hearth":1,"ids":["1"],"x":1}`, `{"hearth":1,"ids":["../../x"]} trailing`} {
			e.exec(`SELECT pg_notify($1, $2)`, e.channel, p)
		}
		testenv.Eventually(t, 20*time.Second, "six malformed notifications counted", func() bool {
			return e.metric("hearth_change_notifications_total", "channel="+e.channel, "result=malformed") == before+6
		})
		// An invalid member is dropped, the valid one next to it refreshed.
		e.exec(`UPDATE products SET name = 'after junk', version = version + 1 WHERE id = 7`)
		e.exec(`SELECT pg_notify($1, '{"hearth":1,"ts":0,"ids":["x y","7"]}')`, e.channel)
		e.waitName(7, "after junk")
		// The UPDATE's own trigger notification may bring the name first:
		// the hand-made payload with the invalid member is counted when it
		// is handled.
		testenv.Eventually(t, 20*time.Second, "the invalid member counted", func() bool {
			return e.metric("hearth_change_members_total", "family=product", "result=invalid") >= 1
		})
	})

	t.Run("flood", func(t *testing.T) {
		okBefore := e.metric("hearth_change_notifications_total", "channel="+e.channel, "result=ok")
		// 30,000 distinct notifications in one transaction, then 42,000
		// members in 60 payloads of 700 (the queue's bound is on what
		// gathers during one refresh; TestChangesPendingBoundWhileInFlight
		// shows what happens past it).
		e.exec(`SELECT pg_notify($1, '{"hearth":1,"ts":0,"ids":["' || i || '"]}') FROM generate_series(1, 30000) AS i`, e.channel)
		e.exec(`SELECT pg_notify($1, json_build_object('hearth', 1, 'ts', 0, 'ids',
			(SELECT json_agg(g::text) FROM generate_series(b * 700 + 1, b * 700 + 700) AS g))::text)
			FROM generate_series(0, 59) AS b`, e.channel)
		e.exec(`UPDATE products SET name = 'after flood', version = version + 1 WHERE id = 8`)
		e.waitName(8, "after flood")
		testenv.Eventually(t, 30*time.Second, "every notification of the flood handled", func() bool {
			return e.metric("hearth_change_notifications_total", "channel="+e.channel, "result=ok") >= okBefore+30061
		})
		if got := e.metric("hearth_change_members_total", "family=product", "result=not_declared"); got == 0 {
			t.Errorf("members outside the declaration were not counted as not_declared")
		}
		if n, _ := e.rdb.Exists(context.Background(), e.key(51), e.key(30000)).Result(); n != 0 {
			t.Errorf("%d keys written for members the declaration does not list", n)
		}
	})
}

// observer sweeps every key with its own client and counts versions that go
// back.
type observer struct {
	e           *changeEnv
	rdb         *redis.Client
	max         []int64
	regressions atomic.Int64
	sweeps      atomic.Int64
	increases   atomic.Int64
	missing     atomic.Int64
}

func (o *observer) run(ctx context.Context) {
	for ctx.Err() == nil {
		pipe := o.rdb.Pipeline()
		cmds := make([]*redis.StringCmd, o.e.rows)
		for i := range cmds {
			cmds[i] = pipe.Get(ctx, o.e.key(i+1))
		}
		_, _ = pipe.Exec(ctx)
		if ctx.Err() != nil {
			return
		}
		for i, c := range cmds {
			s, err := c.Result()
			if err != nil {
				o.missing.Add(1)
				continue
			}
			var v struct{ Version int64 }
			if json.Unmarshal([]byte(s), &v) != nil || v.Version == 0 {
				o.missing.Add(1)
				continue
			}
			switch {
			case v.Version < o.max[i]:
				o.regressions.Add(1)
				o.e.t.Errorf("%s went back from version %d to %d", o.e.key(i+1), o.max[i], v.Version)
			case v.Version > o.max[i]:
				if o.max[i] > 0 {
					o.increases.Add(1)
				}
				o.max[i] = v.Version
			}
		}
		o.sweeps.Add(1)
	}
}

type allKeys struct{ e *changeEnv }

func (a allKeys) EachTopKey(_ context.Context, _ time.Duration, n int, fn func(string)) error {
	for i := 1; i <= min(n, a.e.rows); i++ {
		fn(a.e.key(i))
	}
	return nil
}

// TestChangesNoVersionRegression: an updater bumps the version of 50 random
// rows a second while scheduled refreshes, change-driven refreshes, admin
// refreshes and pre-warms all write the same keys; an observer sweeping every
// key with its own client sees no version go back, and every key ends at
// its row's version.
func TestChangesNoVersionRegression(t *testing.T) {
	pg := testenv.Postgres(t)
	const rows = 200
	e := newChangeEnv(t, pg.Pool, pg.DSN, pg.DSN, rows)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	obs := &observer{e: e, rdb: redis.NewClient(&redis.Options{Addr: e.rdb.Options().Addr}), max: make([]int64, rows)}
	defer func() { _ = obs.rdb.Close() }()
	var wg sync.WaitGroup
	wg.Go(func() { obs.run(ctx) })

	work, stop := context.WithCancel(ctx)
	var updates atomic.Int64
	wg.Go(func() { // the updater: 50 rows/s
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for work.Err() == nil {
			select {
			case <-tick.C:
			case <-work.Done():
				return
			}
			id := rand.IntN(rows) + 1
			if _, err := pg.Pool.Exec(work, `UPDATE products SET version = version + 1, name = 'n' || (version + 1) WHERE id = $1`, id); err == nil {
				updates.Add(1)
			}
		}
	})
	wg.Go(func() { // the schedule, at a short interval
		for work.Err() == nil {
			_, _ = e.w.Refresh(work, "product", warmer.RunOptions{})
			sleepCtx(work, 30*time.Millisecond)
		}
	})
	wg.Go(func() { // admin refreshes of single members
		for work.Err() == nil {
			_, _ = e.w.RefreshMembers(work, "product", []string{strconv.Itoa(rand.IntN(rows) + 1)})
			sleepCtx(work, 5*time.Millisecond)
		}
	})
	wg.Go(func() { // pre-warms from an access log naming every key
		pw := prewarm.New(e.w, e.reg, zerolog.Nop())
		for work.Err() == nil {
			_, _ = pw.Run(work, prewarm.Options{AccessLog: allKeys{e}, TopN: rows, Window: time.Hour, Concurrency: 2, Reason: "test"})
			sleepCtx(work, 50*time.Millisecond)
		}
	})
	testenv.Eventually(t, 60*time.Second, "150 updates and the observer's sweeps", func() bool {
		return updates.Load() >= 150 && obs.sweeps.Load() >= 100
	})
	stop()
	// After the writers stop, every key converges to its row.
	got := map[int]int64{}
	r, err := pg.Pool.Query(ctx, `SELECT id, version FROM products`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var id, v int64
		if err := r.Scan(&id, &v); err != nil {
			t.Fatal(err)
		}
		got[int(id)] = v
	}
	r.Close()
	testenv.Eventually(t, 20*time.Second, "every key at its row's version", func() bool {
		for id, v := range got {
			if rv, _, _ := e.value(e.rdb, id); rv != v {
				return false
			}
		}
		return true
	})
	cancel()
	wg.Wait()
	if n := obs.regressions.Load(); n != 0 {
		t.Errorf("%d version regressions", n)
	}
	if obs.increases.Load() == 0 {
		t.Errorf("the observer saw no version increase: it proves nothing")
	}
	t.Logf("updates %d, sweeps %d, increases seen %d, keys missing in a sweep %d, writes refused as older %v, change refreshes %v, lag samples %v",
		updates.Load(), obs.sweeps.Load(), obs.increases.Load(), obs.missing.Load(),
		e.metric("hearth_version_refused_writes_total"), e.metric("hearth_change_refreshes_total", "family=product", "kind=members"),
		e.metric("hearth_change_lag_seconds"))
	if got := e.metric("hearth_change_refreshes_total", "family=product", "kind=members"); got == 0 {
		t.Errorf("no change-driven refresh ran")
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// TestChangesSurviveConnectionLoss: the listening backend terminated with
// pg_terminate_backend, the listener cut off while rows change, and
// PostgreSQL restarted. Each time notifications resume, and what changed
// while nobody listened is caught up by the full refresh that follows every
// reconnection (nothing else refreshes here).
func TestChangesSurviveConnectionLoss(t *testing.T) {
	srv := testenv.PrivatePostgres(t)
	proxy := testenv.NewProxy(t, fmt.Sprintf("127.0.0.1:%d", srv.Port))
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	listenDSN := fmt.Sprintf("postgres://postgres@%s/test?sslmode=disable", proxy.Addr)
	e := newChangeEnv(t, pool, srv.DSN(), listenDSN, 20)

	t.Run("pg_terminate_backend", func(t *testing.T) {
		before := e.metric("hearth_change_listen_reconnects_total", "source=db")
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'hearth-listen'`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("terminated %d listening backends (%v), want 1", n, err)
		}
		testenv.Eventually(t, 20*time.Second, "a reconnection", func() bool {
			return e.metric("hearth_change_listen_reconnects_total", "source=db") > before
		})
		e.waitConnected(1)
		e.exec(`UPDATE products SET name = 'after terminate', version = version + 1 WHERE id = 1`)
		e.waitName(1, "after terminate")
	})

	t.Run("changes while cut off are caught up", func(t *testing.T) {
		proxy.Cut(t)
		e.waitConnected(0)
		e.exec(`UPDATE products SET name = 'missed', version = version + 1 WHERE id IN (2, 3)`)
		e.exec(`DELETE FROM products WHERE id = 4`)
		// Nobody listens and nothing else refreshes: the old values stay.
		if _, name, _ := e.value(e.rdb, 2); name == "missed" {
			t.Fatalf("product 2 refreshed while the listener was cut off")
		}
		proxy.Restore(t)
		e.waitName(2, "missed")
		e.waitName(3, "missed")
		testenv.Eventually(t, 20*time.Second, "sentinel for the row deleted while cut off", func() bool {
			v, name, ok := e.value(e.rdb, 4)
			return ok && v == 0 && name == ""
		})
	})

	t.Run("postgres restarted", func(t *testing.T) {
		srv.Stop(t)
		e.waitConnected(0)
		srv.Start(t)
		e.waitConnected(1)
		testenv.Eventually(t, 20*time.Second, "an update after the restart", func() bool {
			_, err := pool.Exec(ctx, `UPDATE products SET name = 'after restart', version = version + 1 WHERE id = 5`)
			return err == nil
		})
		e.waitName(5, "after restart")
	})
}

// TestChangesFollowReload: a reload that moves a declaration to another
// notify channel restarts the listener on it (a full refresh covers what
// changed in between); the old channel is no longer heard and its series are
// gone; a reload that changes nothing the listener depends on restarts nothing.
func TestChangesFollowReload(t *testing.T) {
	pg := testenv.Postgres(t)
	e := newChangeEnv(t, pg.Pool, pg.DSN, pg.DSN, 20)
	spec, ok := e.w.Spec("product")
	if !ok {
		t.Fatal("no product declaration")
	}
	fulls := func() float64 { return e.metric("hearth_change_refreshes_total", "family=product", "kind=full") }
	testenv.Eventually(t, 20*time.Second, "the first session's full refresh", func() bool { return fulls() >= 1 })
	before := fulls()
	e.exec(`UPDATE products SET name = 'before the move', version = version + 1 WHERE id = 7`)
	e.waitName(7, "before the move")
	if got := e.metric("hearth_change_delivery_seconds", "channel="+e.channel); got != 1 {
		t.Fatalf("the channel's delivery series holds %g observations, want 1", got)
	}

	// The same declarations: nothing restarts.
	if err := e.chg.Apply([]*warmer.Spec{spec}); err != nil {
		t.Fatal(err)
	}
	moved := *spec
	moved.Notify = e.channel + "_moved"
	if err := e.chg.Apply([]*warmer.Spec{&moved}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the new session's full refresh", func() bool { return fulls() == before+1 })
	e.waitConnected(1)

	// Row 8 changes: its trigger notifies the old channel, which nobody
	// hears now. Row 9 changes and is named on the new one.
	e.exec(`UPDATE products SET name = 'old channel', version = version + 1 WHERE id = 8`)
	e.exec(`UPDATE products SET name = 'new channel', version = version + 1 WHERE id = 9`)
	e.exec(`SELECT pg_notify($1, '{"hearth":1,"ts":0,"ids":["9"]}')`, moved.Notify)
	e.waitName(9, "new channel")
	time.Sleep(300 * time.Millisecond)
	if _, name, _ := e.value(e.rdb, 8); name == "old channel" {
		t.Errorf("a notification on the channel the declaration left was still acted on")
	}
	if got := e.metric("hearth_change_notifications_total", "channel="+e.channel, "result=ok"); got != 0 {
		t.Errorf("the old channel's series still reports %g notifications", got)
	}
	if got := e.metric("hearth_change_notifications_total", "channel="+moved.Notify, "result=ok"); got != 1 {
		t.Errorf("the new channel's series reports %g notifications, want 1", got)
	}
	if got := e.metric("hearth_change_delivery_seconds", "channel="+e.channel); got != 0 {
		t.Errorf("the old channel's delivery series still holds %g observations", got)
	}
	if got := fulls(); got != before+1 {
		t.Errorf("%g full refreshes since the first session, want 1: only the move restarted the listener", got-before)
	}
}

// TestChangesReloadPaced: reloads that move the declaration between two
// channels ten times in a second each start a new session, and each new
// session asks for its opening full refresh; before, each got one at once.
// The declaration's pacing outlives the sessions: one full refresh per
// MinFullInterval (5 s here), whatever the reloads.
func TestChangesReloadPaced(t *testing.T) {
	pg := testenv.Postgres(t)
	const minFull = 5 * time.Second
	e := newChangeEnvSpaced(t, pg.Pool, pg.DSN, pg.DSN, 20, minFull)
	spec, ok := e.w.Spec("product")
	if !ok {
		t.Fatal("no product declaration")
	}
	fulls := func() float64 { return e.metric("hearth_change_refreshes_total", "family=product", "kind=full") }
	testenv.Eventually(t, 20*time.Second, "the first session's full refresh", func() bool { return fulls() == 1 })
	first := time.Now()
	moved := *spec
	moved.Notify = e.channel + "_moved"
	for i := range 10 {
		next := spec
		if i%2 == 0 {
			next = &moved
		}
		if err := e.chg.Apply([]*warmer.Spec{next}); err != nil {
			t.Fatal(err)
		}
		e.waitConnected(1)
		time.Sleep(50 * time.Millisecond)
	}
	toggled := time.Since(first)
	if toggled < minFull {
		if got := fulls(); got != 1 {
			t.Errorf("%g full refreshes within %v of the first, over 10 reloads; want 1 (the next is due %v after it)", got, toggled.Round(time.Millisecond), minFull)
		}
	}
	// The reloads' sessions asked for one: it runs once the interval has passed.
	testenv.Eventually(t, 20*time.Second, "one more full refresh after the interval", func() bool { return fulls() == 2 })
	if since := time.Since(first); since < minFull-100*time.Millisecond {
		t.Errorf("the second full refresh seen %v after the first, want >= %v", since, minFull)
	}
	time.Sleep(time.Second)
	if got := fulls(); got != 2 {
		t.Errorf("%g full refreshes, want 2", got)
	}
}

// histogram is a histogram's sample count and sum in e's registry.
func (e *changeEnv) histogram(name string) (count uint64, sum float64) {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			count += m.GetHistogram().GetSampleCount()
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	return count, sum
}

// settle waits for the session's opening full refresh and a little more, so
// that nothing is in flight when the test's changes come.
func (e *changeEnv) settle() {
	e.t.Helper()
	testenv.Eventually(e.t, 20*time.Second, "the session's full refresh", func() bool {
		return e.metric("hearth_change_refreshes_total", "family=product", "kind=full") >= 1
	})
	time.Sleep(time.Second)
}

// TestChangesIsolatedAtOnce: with notify.coalesce at its default (0) an
// isolated change is refreshed the moment it reaches the queue: no window is
// waited (the listener's own hearth_change_wait_seconds, bounded generously
// against a loaded machine; the exact zero is TestPacingIsolatedChangeAtOnce).
// With coalesce set, that wait is added.
func TestChangesIsolatedAtOnce(t *testing.T) {
	for _, tc := range []struct {
		coalesce time.Duration
		ok       func(wait float64) bool
		want     string
	}{
		{0, func(w float64) bool { return w < 0.25 }, "< 250 ms: no window"},
		{time.Second, func(w float64) bool { return w >= 1 }, ">= 1 s: the coalesce wait"},
	} {
		t.Run("coalesce="+tc.coalesce.String(), func(t *testing.T) {
			pg := testenv.Postgres(t)
			e := newChangeEnvWith(t, pg.Pool, pg.DSN, pg.DSN, 20, envOptions{coalesce: tc.coalesce})
			e.settle()
			n0, s0 := e.histogram("hearth_change_wait_seconds")
			d0, ds0 := e.histogram("hearth_change_delivery_seconds")
			sent := time.Now()
			e.exec(`UPDATE products SET name = 'isolated', version = version + 1 WHERE id = 3`)
			e.waitName(3, "isolated")
			seen := time.Since(sent)
			testenv.Eventually(t, 20*time.Second, "one wait observed", func() bool {
				n, _ := e.histogram("hearth_change_wait_seconds")
				return n == n0+1
			})
			_, s1 := e.histogram("hearth_change_wait_seconds")
			if w := s1 - s0; !tc.ok(w) {
				t.Errorf("the isolated change waited %.1f ms in the queue, want %s", w*1000, tc.want)
			}
			// The notification's delivery (trigger → receipt) is observed
			// once, and lies within what the outside reader saw.
			d1, ds1 := e.histogram("hearth_change_delivery_seconds")
			if d1 != d0+1 || ds1-ds0 < 0 || ds1-ds0 > seen.Seconds() {
				t.Errorf("hearth_change_delivery_seconds: %d observation(s) of %.2f ms, want 1 within the %v the outside reader saw", d1-d0, (ds1-ds0)*1000, seen)
			}
			t.Logf("delivery %.2f ms, queue wait %.2f ms; UPDATE to the new value read from outside %v", (ds1-ds0)*1000, (s1-s0)*1000, seen.Round(time.Microsecond))
		})
	}
}

// TestChangesGatheredWhileInFlight: the origin holds the first change's load
// back (an advisory lock the query takes); the changes that arrive meanwhile
// are gathered into exactly the next load (counted at the origin: a sequence
// the query advances), or into loads of at most batch_size members.
func TestChangesGatheredWhileInFlight(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		batch, changes, wantLoads int
	}{
		{"into the next load", 0, 4, 2},
		{"at most batch_size each", 2, 5, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg := testenv.Postgres(t)
			ctx := context.Background()
			gate := rand.Int64N(1<<31-1) + 1
			e := newChangeEnvWith(t, pg.Pool, pg.DSN, pg.DSN, 20, envOptions{batch: tc.batch, gate: gate})
			e.settle()
			loads := func() int64 {
				var n int64
				if err := pg.Pool.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM origin_loads`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			refreshes := func() float64 { return e.metric("hearth_change_refreshes_total", "family=product", "kind=members") }
			notified := func() float64 {
				return e.metric("hearth_change_notifications_total", "channel="+e.channel, "result=ok")
			}
			l0, r0, n0 := loads(), refreshes(), notified()

			hold, err := pg.Pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer hold.Release()
			if _, err := hold.Exec(ctx, `SELECT pg_advisory_lock($1)`, gate); err != nil {
				t.Fatal(err)
			}
			released := false
			release := func() {
				if !released {
					released = true
					if _, err := hold.Exec(ctx, `SELECT pg_advisory_unlock($1)`, gate); err != nil {
						t.Fatal(err)
					}
				}
			}
			defer release()
			update := func(id int) {
				e.exec(`UPDATE products SET name = 'gathered ' || id, version = version + 1 WHERE id = $1`, id)
			}
			update(1)
			testenv.Eventually(t, 20*time.Second, "the first load waiting at the origin", func() bool {
				var n int
				err := pg.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = 0 AND objid::bigint = $1`, gate).Scan(&n)
				return err == nil && n == 1
			})
			for id := 2; id <= tc.changes+1; id++ {
				update(id)
			}
			testenv.Eventually(t, 20*time.Second, "every change heard", func() bool { return notified() == n0+float64(tc.changes+1) })
			if got := refreshes() - r0; got != 1 {
				t.Fatalf("%g refreshes issued while the first was held, want that one", got)
			}
			release()
			for id := 1; id <= tc.changes+1; id++ {
				e.waitName(id, "gathered "+strconv.Itoa(id))
			}
			time.Sleep(300 * time.Millisecond)
			if got := loads() - l0; got != int64(tc.wantLoads) {
				t.Errorf("%d origin loads for 1 change and %d arriving during its load (batch_size %d), want %d", got, tc.changes, tc.batch, tc.wantLoads)
			}
			if got := refreshes() - r0; got != float64(tc.wantLoads) {
				t.Errorf("%g change-driven refreshes, want %d", got, tc.wantLoads)
			}
		})
	}
}

// TestChangesPendingBoundWhileInFlight: while the origin holds a load back,
// 12,000 distinct members are named (more than MaxPendingChanges): they are
// dropped for one full refresh, which runs when the held load ends, and no
// member is loaded alone.
func TestChangesPendingBoundWhileInFlight(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx := context.Background()
	gate := rand.Int64N(1<<31-1) + 1
	e := newChangeEnvWith(t, pg.Pool, pg.DSN, pg.DSN, 20, envOptions{gate: gate})
	e.settle()
	loads := func() int64 {
		var n int64
		if err := pg.Pool.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM origin_loads`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	members := func() float64 { return e.metric("hearth_change_refreshes_total", "family=product", "kind=members") }
	fulls := func() float64 { return e.metric("hearth_change_refreshes_total", "family=product", "kind=full") }
	notified := func() float64 {
		return e.metric("hearth_change_notifications_total", "channel="+e.channel, "result=ok")
	}
	l0, m0, f0, n0 := loads(), members(), fulls(), notified()

	hold, err := pg.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Release()
	if _, err := hold.Exec(ctx, `SELECT pg_advisory_lock($1)`, gate); err != nil {
		t.Fatal(err)
	}
	e.exec(`UPDATE products SET name = 'held', version = version + 1 WHERE id = 1`)
	testenv.Eventually(t, 20*time.Second, "the first load waiting at the origin", func() bool {
		var n int
		err := pg.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = 0 AND objid::bigint = $1`, gate).Scan(&n)
		return err == nil && n == 1
	})
	e.exec(`UPDATE products SET name = 'in the full refresh', version = version + 1 WHERE id = 2`)
	e.exec(`SELECT pg_notify($1, json_build_object('hearth', 1, 'ts', 0, 'ids',
		(SELECT json_agg(g::text) FROM generate_series(b * 600 + 1, b * 600 + 600) AS g))::text)
		FROM generate_series(0, 19) AS b`, e.channel)
	testenv.Eventually(t, 20*time.Second, "every notification heard", func() bool { return notified() == n0+22 })
	if got := e.metric("hearth_change_overflows_total", "family=product"); got != 1 {
		t.Errorf("overflows = %g, want 1", got)
	}
	if _, err := hold.Exec(ctx, `SELECT pg_advisory_unlock($1)`, gate); err != nil {
		t.Fatal(err)
	}
	e.waitName(1, "held")
	e.waitName(2, "in the full refresh")
	testenv.Eventually(t, 20*time.Second, "one full refresh", func() bool { return fulls() == f0+1 })
	time.Sleep(300 * time.Millisecond)
	if got := members() - m0; got != 1 {
		t.Errorf("%g members refreshes, want only the held one", got)
	}
	if got := loads() - l0; got != 2 {
		t.Errorf("%d origin loads, want 2 (the held one, then the full refresh's one batch of 20)", got)
	}
}
