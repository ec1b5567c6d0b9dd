package main_test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

var updateMetrics = flag.Bool("update-metrics", false, "rewrite testdata/metrics.txt from the running binary")

// TestMetricFamiliesUnchanged runs the binary (leader, admin API on, an HTTP
// source, a single key, a family, a traffic-driven one and a version-checked one) and compares the hearth_* metric families
// it exports, with their types, to testdata/metrics.txt, written from the binary
// before the daemon moved to its own package: metric names are an external
// contract (dashboards, alert rules). A deliberate change reruns the test with
// -update-metrics.
func TestMetricFamiliesUnchanged(t *testing.T) {
	rd := testenv.Redis(t)
	pg := testenv.Postgres(t)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "v"+r.URL.Path)
	}))
	defer upstream.Close()
	listen := e2e.FreeAddr(t)
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(`
redis: {addrs: [%q], namespace: %q}
http: {listen: %q}
leader: {lease: 2s}
sources: [{name: api, type: http, base_url: %q, timeout: 1s}, {name: db, type: postgres, dsn: %q}]
access_log: {source: db, rollup_interval: 0, rank_interval: 0}
keys:
  - {name: page, key: "%spage", source: api, ttl: 1h, path: /p}
  - {name: item, key: "%sitem:{id}", source: api, ttl: 1h, members: [a, b], path: "/i/{id}"}
  - {name: hot, key: "%shot:{id}", source: api, ttl: 1h, path: "/h/{id}", members_from: {access_log: {top_n: 10}}}
  - {name: ver, key: "%sver", source: db, ttl: 1h, query: "SELECT 'v'::text AS v, 1::bigint AS version", version_column: version}
`, rd.Addr, e2e.Namespace(t, rd.Client), listen, upstream.URL, pg.DSN, rd.Prefix, rd.Prefix, rd.Prefix, rd.Prefix)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := e2e.Start(t, []string{"run", "--config", path}, "HEARTH_ADMIN_TOKEN=tok")
	p.WaitHTTP(t, "http://"+listen+"/readyz", http.StatusOK, 20*time.Second)

	golden := filepath.Join("testdata", "metrics.txt")
	if *updateMetrics {
		time.Sleep(3 * time.Second) // a few lease renewals: every family has a series
		if err := os.WriteFile(golden, []byte(strings.Join(families(t, "http://"+listen+"/metrics"), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	data, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Split(strings.TrimSpace(string(data)), "\n")
	var got []string
	ok := func() bool {
		got = families(t, "http://"+listen+"/metrics")
		return slices.Equal(got, want)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !ok() && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if !slices.Equal(got, want) {
		var missing, extra []string
		for _, w := range want {
			if !slices.Contains(got, w) {
				missing = append(missing, w)
			}
		}
		for _, g := range got {
			if !slices.Contains(want, g) {
				extra = append(extra, g)
			}
		}
		t.Errorf("metric families changed: missing %v, new %v\n%s", missing, extra, p.Output())
	}
}

// families are the "# TYPE hearth_… type" lines of a scrape, sorted.
func families(t *testing.T, url string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "# TYPE "); ok && strings.HasPrefix(rest, "hearth_") {
			out = append(out, rest)
		}
	}
	slices.Sort(out)
	return out
}
