package main_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

// TestHotSetFollowsTrafficOnTheLeader runs two instances of the binary on one
// Redis and one access log, for a family whose members all come from traffic
// (members_from.access_log, no static members). The leader promotes the
// hottest keys and writes them; when traffic moves, it promotes the new keys
// and lets the old ones expire. The standby never ranks. A separate client
// watches Redis.
func TestHotSetFollowsTrafficOnTheLeader(t *testing.T) {
	t.Parallel()
	rd := testenv.Redis(t)
	pg := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pg.Pool.Exec(ctx, `CREATE TABLE products (id bigint PRIMARY KEY, v text NOT NULL);
		INSERT INTO products SELECT i, 'p' || i FROM generate_series(1, 1000) i`); err != nil {
		t.Fatal(err)
	}
	ns := e2e.Namespace(t, rd.Client)
	key := func(m string) string { return rd.Prefix + "product:" + m }
	write := func(listen string) string {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(fmt.Sprintf(`
redis: {addrs: [%q], namespace: %q}
http: {listen: %q}
log: {level: debug, format: json}
prewarm: {enabled: false}
sources: [{name: catalog, type: postgres, dsn: %q}]
access_log: {source: catalog, rollup_interval: 0, rank_interval: 0}
keys:
  - name: product
    key: %q
    source: catalog
    ttl: 4s
    interval: 1s
    load_timeout: 500ms
    param_pattern: "[0-9]{1,12}"
    query: "SELECT id::text, v FROM products WHERE id = ANY($1::bigint[])"
    members_from: {access_log: {top_n: 3, hysteresis: 0, demote_after: 1, window: 1h, rank_interval: 1s}}
`, rd.Addr, ns, listen, pg.DSN, rd.Prefix+"product:{id}")), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	a, b := e2e.FreeAddr(t), e2e.FreeAddr(t)
	cfgA, cfgB := write(a), write(b)
	if code, out := runHearth(t, "migrate", "up", "--config", cfgA); code != 0 {
		t.Fatalf("hearth migrate up: exit %d\n%s", code, out)
	}
	traffic := func(ms ...string) {
		t.Helper()
		if _, err := pg.Pool.Exec(ctx, "DELETE FROM "+accesslog.Table); err != nil {
			t.Fatal(err)
		}
		ks, hs := make([]string, len(ms)), make([]int64, len(ms))
		for i, m := range ms {
			ks[i], hs[i] = key(m), int64(100-i)
		}
		if _, err := pg.Pool.Exec(ctx, accesslog.RecordSQL, time.Now().Truncate(time.Minute), ks, hs); err != nil {
			t.Fatal(err)
		}
	}
	present := func(ms ...string) bool {
		for _, m := range ms {
			if v, err := rd.Client.Get(ctx, key(m)).Result(); err != nil || v != "p"+m {
				return false
			}
		}
		return true
	}
	gone := func(ms ...string) bool {
		for _, m := range ms {
			if rd.Client.Exists(ctx, key(m)).Val() != 0 {
				return false
			}
		}
		return true
	}

	traffic("11", "12", "13", "14", "15")
	leader := e2e.Start(t, []string{"run", "--config", cfgA})
	leader.WaitHTTP(t, "http://"+a+"/readyz", http.StatusOK, 20*time.Second)
	standby := e2e.Start(t, []string{"run", "--config", cfgB})
	testenv.Eventually(t, 10*time.Second, "the hot keys written", func() bool { return present("11", "12", "13") })
	if !gone("14", "15") {
		t.Fatal("keys below top_n were written")
	}

	traffic("21", "22", "23", "24")
	testenv.Eventually(t, 10*time.Second, "the new hot keys written", func() bool { return present("21", "22", "23") })
	testenv.Eventually(t, 10*time.Second, "the old hot keys expired", func() bool { return gone("11", "12", "13") })
	// Still refreshed after more than a TTL: hot keys stay.
	time.Sleep(5 * time.Second)
	if !present("21", "22", "23") {
		t.Fatalf("a hot key expired\n%s", leader.Output())
	}

	ml := e2e.Metrics(t, "http://"+a+"/metrics")
	if got := e2e.Sum(ml, "hearth_hotset_promotions_total"); got != 6 {
		t.Errorf("leader promotions = %g, want 6", got)
	}
	if got := e2e.Sum(ml, "hearth_hotset_demotions_total"); got != 3 {
		t.Errorf("leader demotions = %g, want 3", got)
	}
	if got := e2e.Sum(ml, "hearth_hotset_members"); got != 3 {
		t.Errorf("leader hot-set size = %g, want 3", got)
	}
	ms := e2e.Metrics(t, "http://"+b+"/metrics")
	if got := e2e.Sum(ms, "hearth_hotset_rankings_total"); got != 0 {
		t.Errorf("the standby ranked %g times", got)
	}
	if !strings.Contains(leader.Output(), "hot set re-ranked") {
		t.Errorf("no re-rank logged:\n%s", leader.Output())
	}
	standby.Signal(t, 15)
	leader.Signal(t, 15)
	for _, p := range []*e2e.Proc{standby, leader} {
		if code := p.Wait(t, 20*time.Second); code != 0 {
			t.Errorf("exit %d\n%s", code, p.Output())
		}
	}
}
