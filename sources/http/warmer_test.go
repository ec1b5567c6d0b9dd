package http_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/internal/origintest"
	"github.com/hearth-dev/hearth/internal/testenv"
	httpsrc "github.com/hearth-dev/hearth/sources/http"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// apiWarmer is the real warmer writing to rd through the http source "api"
// at baseURL (sending X-Api-Key: k), for the one declaration decl (a YAML
// flow mapping of keys[]); reg holds the source's and the warmer's metrics.
func apiWarmer(t *testing.T, rd *testenv.RedisEnv, baseURL, decl string) (w *warmer.Warmer, reg *prometheus.Registry) {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(`
sources: [{name: api, type: http, base_url: "`+baseURL+`", timeout: 2s, headers: {X-Api-Key: k}}]
keys: [`+decl+`]
`))
	if err != nil {
		t.Fatal(err)
	}
	reg = prometheus.NewRegistry()
	src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: baseURL, Timeout: 2 * time.Second,
		Headers: map[string]string{"X-Api-Key": "k"}, Metrics: httpsrc.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	w, err = warmer.New(warmer.Options{Store: &store.RedisStore{Client: rd.Client}, Sources: map[string]warmer.Source{"api": src},
		Specs: cfg.Specs(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return w, reg
}

// TestRefusedRedirectKeepsValue runs the real warmer against real Redis: when
// the origin starts redirecting a member to another host, the foreign answer is
// never cached (the old value stays, its TTL extended), the refusal is counted,
// and a ".." member fails alone as a bad member while the others load.
func TestRefusedRedirectKeepsValue(t *testing.T) {
	rd := testenv.Redis(t)
	far := newForeign(t)
	var redirect atomic.Bool
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/p/moving" && redirect.Load() {
			http.Redirect(w, r, far.URL+"/p/moving", http.StatusFound)
			return
		}
		_, _ = w.Write([]byte(`{"v":"origin` + r.URL.Path + `"}`))
	}))
	defer origin.Close()
	w, reg := apiWarmer(t, rd, origin.URL,
		`{name: p, key: "`+rd.Prefix+`p:{id}", source: api, ttl: 1h, path: "/p/{id}", json_pointer: /v, members: [stay, moving, ".."]}`)
	ctx := context.Background()
	get := func(m string) string { v, _ := rd.Client.Get(ctx, rd.Prefix+"p:"+m).Result(); return v }

	if out, _ := w.Refresh(ctx, "p", warmer.RunOptions{}); out.Written != 2 || out.Failed != 1 {
		t.Fatalf("first refresh: %+v, want 2 written and '..' failed", out)
	}
	if got, want := get("moving"), "origin/p/moving"; got != want {
		t.Fatalf("moving = %q, want %q", got, want)
	}
	redirect.Store(true)
	if out, _ := w.Refresh(ctx, "p", warmer.RunOptions{}); out.Written != 1 || out.Failed != 2 {
		t.Errorf("second refresh: %+v, want stay written, moving and '..' failed", out)
	}
	if got, want := get("moving"), "origin/p/moving"; got != want {
		t.Errorf("after the redirect moving = %q, want the old value %q", got, want)
	}
	if ttl := rd.Client.PTTL(ctx, rd.Prefix+"p:moving").Val(); ttl <= 0 {
		t.Errorf("old value's TTL = %s, want it kept alive", ttl)
	}
	if got := far.hits.Load(); got != 0 {
		t.Errorf("the other host got %d requests", got)
	}
	if got, want := get("stay"), "origin/p/stay"; got != want {
		t.Errorf("stay = %q, want %q", got, want)
	}
	if n, _ := rd.Client.Exists(ctx, rd.Prefix+"p:..").Result(); n != 0 {
		t.Errorf("the '..' member was written")
	}
	want := `# HELP hearth_load_failures_total Members not refreshed, by reason; their previous values are kept.
# TYPE hearth_load_failures_total counter
hearth_load_failures_total{family="p",reason="bad_member"} 2
hearth_load_failures_total{family="p",reason="origin"} 1
` + redirectsRefused(1)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "hearth_load_failures_total", "hearth_source_redirects_refused_total"); err != nil {
		t.Error(err)
	}
}

// TestPathMembersStayOneSegment runs the warmer against a real origin and
// Redis: a member that would be more than one path segment, or a dot segment,
// once a proxy in front of the origin decodes %2F (or decodes twice, or reads
// '\' as '/', or ";" as the end of a segment) is counted as bad_member and
// never requested, so the configured API key never reaches another path; the
// other members load.
func TestPathMembersStayOneSegment(t *testing.T) {
	rd := testenv.Redis(t)
	var (
		mu    sync.Mutex
		paths []string
	)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.EscapedPath())
		mu.Unlock()
		_, _ = w.Write([]byte("v:" + strings.TrimPrefix(r.URL.Path, "/v/")))
	}))
	defer up.Close()
	bad := []string{"a/../b", "../admin", "a/b", "a%2F..%2Fb", "a%252F..%252Fb", `a\..\b`, "..;x", ".;", "%2e%2e", "a%00b", "a%0aSet-Cookie"}
	good := []string{"1", "a.b", "...", "a;b", "100%", "%zz", "x?y"}
	members := append(append([]string{}, bad...), good...)
	quoted := make([]string, len(members))
	for i, m := range members {
		quoted[i] = fmt.Sprintf("%q", m)
	}
	w, reg := apiWarmer(t, rd, up.URL,
		`{name: p, key: "`+rd.Prefix+`p:{id}", source: api, ttl: 1h, path: "/v/{id}", members: [`+strings.Join(quoted, ", ")+`]}`)
	ctx := context.Background()
	out, _ := w.Refresh(ctx, "p", warmer.RunOptions{})
	if out.Written != len(good) || out.Failed != len(bad) || out.Negative != 0 {
		t.Errorf("refresh: %+v, want %d written and %d failed", out, len(good), len(bad))
	}
	for _, m := range good {
		if v, err := rd.Client.Get(ctx, rd.Prefix+"p:"+m).Result(); err != nil || !strings.HasPrefix(v, "v:") {
			t.Errorf("good member %q: %q %v", m, v, err)
		}
	}
	for _, m := range bad {
		if n, _ := rd.Client.Exists(ctx, rd.Prefix+"p:"+m).Result(); n != 0 {
			t.Errorf("bad member %q was written", m)
		}
	}
	mu.Lock()
	if len(paths) != len(good) {
		t.Errorf("the origin was asked for %q, want the %d good members only", paths, len(good))
	}
	mu.Unlock()
	want := fmt.Sprintf(`# HELP hearth_load_failures_total Members not refreshed, by reason; their previous values are kept.
# TYPE hearth_load_failures_total counter
hearth_load_failures_total{family="p",reason="bad_member"} %d
`, len(bad))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "hearth_load_failures_total"); err != nil {
		t.Error(err)
	}
}

// TestReloadedPointerNotServedFrom304 runs the warmer against a conditional
// origin (ETags, 304 when the validator matches) and real Redis: after a
// reload changes json_pointer from /v to /w, the new field is written, never
// the old pointer's value remembered for a 304; and the origin's 304s keep
// working for the new declaration.
func TestReloadedPointerNotServedFrom304(t *testing.T) {
	rd := testenv.Redis(t)
	up := origintest.New(t, func(string, int) (int, string) { return http.StatusOK, `{"v":"old-field","w":"new-field"}` })
	up.SetETags(true)
	decl := func(ptr string) []*warmer.Spec {
		cfg, err := config.Parse("test.yaml", []byte(`
sources: [{name: api, type: http, base_url: "`+up.URL+`", timeout: 2s}]
keys: [{name: p, key: "`+rd.Prefix+`p:{id}", source: api, ttl: 1h, path: "/v/{id}", json_pointer: `+ptr+`, members: ["1"]}]
`))
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Specs()
	}
	reg := prometheus.NewRegistry()
	src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: up.URL, Timeout: 2 * time.Second, Metrics: httpsrc.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	w, err := warmer.New(warmer.Options{Store: &store.RedisStore{Client: rd.Client}, Sources: map[string]warmer.Source{"api": src},
		Specs: decl("/v"), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	refresh := func(want string) {
		t.Helper()
		if out, err := w.Refresh(ctx, "p", warmer.RunOptions{}); err != nil || out.Failed != 0 {
			t.Fatalf("refresh: %+v %v", out, err)
		}
		if got := rd.Client.Get(ctx, rd.Prefix+"p:1").Val(); got != want {
			t.Errorf("p:1 = %q, want %q", got, want)
		}
	}
	refresh("old-field")
	refresh("old-field")
	if n := up.NotModified(); n != 1 {
		t.Fatalf("the origin answered %d 304s, want 1: it is not conditional, the test proves nothing", n)
	}
	if _, err := w.Apply(decl("/w")); err != nil {
		t.Fatal(err)
	}
	refresh("new-field")
	refresh("new-field")
	if n := up.NotModified(); n != 2 {
		t.Errorf("the origin answered %d 304s, want 2 (one more after the reload)", n)
	}
	if got := counterSum(t, reg, "hearth_source_not_modified_total"); got != 2 {
		t.Errorf("hearth_source_not_modified_total = %g, want 2", got)
	}
}
