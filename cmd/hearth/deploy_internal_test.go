package main

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/admin"
	"github.com/hearth-dev/hearth/demo"
	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/prewarm"
	"github.com/hearth-dev/hearth/rewarm"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// repo is the repository root, seen from cmd/hearth.
const repo = "../.."

// recorder is a Registerer that remembers the name of every metric registered.
type recorder struct {
	prometheus.Registerer
	names map[string]bool
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// exportedMetrics builds the real components on a fresh registry and returns
// the names of the metrics they export.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	// A fresh registry per component, as each process would have: the demo
	// builds a warmer of its own.
	fresh := func() *recorder { return &recorder{Registerer: prometheus.NewRegistry(), names: names} }
	rec := fresh()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	w, err := warmer.New(warmer.Options{Store: &store.RedisStore{Client: rdb}, Registerer: rec})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.New(jobs.Options{Refresher: w}); err != nil {
		t.Fatal(err)
	}
	fence := fence.NewFencedStore(fence.FencedStoreOptions{Client: rdb, Namespace: "t", Registerer: rec})
	if _, err := leader.NewLease(leader.LeaseOptions{Client: rdb, Namespace: "t", Duration: time.Second, Fence: fence, Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	// The admin API's (the daemon builds it with HEARTH_ADMIN_TOKEN set).
	if err := admin.New(admin.Options{Token: "-", Registerer: rec}).Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The daemon's own parts (config reloader, HTTP listener): the families
	// the binary exports, pinned by TestMetricFamiliesUnchanged.
	pinned, err := os.ReadFile(filepath.Join("testdata", "metrics.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(pinned)) {
		if name, _, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			names[name] = true
		}
	}
	// Pre-warm: the pre-warmer registers hearth_prewarm_*; the re-warm watch
	// and the access-log roll-up register theirs.
	prewarm.New(w, rec, zerolog.Nop())
	if _, err := rewarm.New(rewarm.Options{Client: rdb, Namespace: "t", Warmer: w, Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	if _, err := accesslog.NewRoller(accesslog.RollerOptions{Log: accesslog.New(nil), Client: rdb, Namespace: "t", Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	// The demo's readers export the cache-read metrics the miss alert uses.
	if _, err := demo.Run(t.Context(), demo.Options{
		Duration: time.Second, Readers: 1, Keys: 1, TTL: time.Second, ReadPause: 10 * time.Millisecond,
		Registerer: fresh(), Out: io.Discard, Logger: zerolog.Nop(),
	}); err != nil {
		t.Fatalf("demo: %v", err)
	}
	if len(names) < 10 {
		t.Fatalf("only %d metric names collected (%v): did prometheus.Desc.String change format?", len(names), names)
	}
	return names
}

// The rules and the dashboard are checked by a real Prometheus: promtool
// loads them and runs their unit tests, and a Prometheus scrapes a live
// hearth (deploy/deploy_test.go).

// known reports whether name is exported, allowing a histogram's series.
func known(exported map[string]bool, name string) bool {
	if exported[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] {
			return true
		}
	}
	return false
}

// TestRuleTestSeriesAreExported checks that every series the promtool unit
// tests of the alert rules feed in (deploy/prometheus/hearth-rules.test.yml)
// is a metric Hearth exports: those tests show that each alert fires on its
// input series and stays silent otherwise, so an alert that named a metric
// Hearth does not export would need a series here that fails this check.
func TestRuleTestSeriesAreExported(t *testing.T) {
	exported := exportedMetrics(t)
	data, err := os.ReadFile(filepath.Join(repo, "deploy/prometheus/hearth-rules.test.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		Tests []struct {
			Series []struct {
				Series string `yaml:"series"`
			} `yaml:"input_series"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(data, &tf); err != nil {
		t.Fatalf("hearth-rules.test.yml: %v", err)
	}
	n := 0
	for _, tc := range tf.Tests {
		for _, s := range tc.Series {
			name, _, _ := strings.Cut(s.Series, "{")
			if name == "up" { // Prometheus's own: the case with no Hearth at all
				continue
			}
			n++
			if !known(exported, name) {
				t.Errorf("hearth-rules.test.yml feeds %s, which is not a metric Hearth exports", name)
			}
		}
	}
	if n < 12 {
		t.Errorf("only %d input series in hearth-rules.test.yml", n)
	}
}

// yamlDocs decodes every document of a YAML file.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
	return docs
}

// dig walks nested maps and lists: dig(d, "spec", "template", 0, "name").
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// validate runs `hearth validate` in process on a config with the environment
// env, as the deployment would set it.
func validate(t *testing.T, path string, env map[string]string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"validate", "--config", path}, &stdout, &stderr); code != 0 {
		t.Errorf("hearth validate %s: exit %d\n%s%s", path, code, stdout.String(), stderr.String())
	}
}

func TestKubernetesManifests(t *testing.T) {
	dir := filepath.Join(repo, "deploy/kubernetes")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s (%v)", dir, err)
	}
	byKind := map[string]map[string]any{}
	var listed []any
	for _, f := range files {
		for _, d := range yamlDocs(t, f) {
			kind, _ := d["kind"].(string)
			if kind == "" || d["apiVersion"] == nil {
				t.Errorf("%s: a document without kind or apiVersion", f)
				continue
			}
			if kind == "Kustomization" {
				listed, _ = d["resources"].([]any)
				continue
			}
			byKind[kind] = d
			if dig(d, "metadata", "name") == nil {
				t.Errorf("%s: %s without metadata.name", f, kind)
			}
		}
	}
	var kinds []string
	for k := range byKind {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, want := range []string{"ConfigMap", "Deployment", "PodDisruptionBudget", "Secret"} {
		if byKind[want] == nil {
			t.Errorf("no %s among %v", want, kinds)
		}
	}
	if got, want := len(listed), len(files)-1; got != want {
		t.Errorf("kustomization lists %d resources, the directory holds %d", got, want)
	}

	dep := byKind["Deployment"]
	if got := dig(dep, "spec", "replicas"); got != 2 {
		t.Errorf("Deployment replicas = %v, want 2 (a leader and a standby)", got)
	}
	c := dig(dep, "spec", "template", "spec", "containers", 0)
	for _, probe := range []string{"livenessProbe", "readinessProbe"} {
		if got := dig(c, probe, "httpGet", "path"); got != "/healthz" {
			t.Errorf("%s path = %v, want /healthz (a standby must pass it)", probe, got)
		}
	}
	if got := dig(dep, "spec", "template", "spec", "securityContext", "runAsNonRoot"); got != true {
		t.Errorf("runAsNonRoot = %v, want true", got)
	}
	if got := dig(byKind["PodDisruptionBudget"], "spec", "minAvailable"); got != 1 {
		t.Errorf("PodDisruptionBudget minAvailable = %v, want 1", got)
	}
	if got := dig(c, "envFrom", 0, "secretRef", "name"); got != dig(byKind["Secret"], "metadata", "name") {
		t.Errorf("the container reads Secret %v, the manifest defines %v", got, dig(byKind["Secret"], "metadata", "name"))
	}

	// The ConfigMap's config passes `hearth validate` with the Secret's values
	// in the environment, as envFrom puts them there.
	cfg, _ := dig(byKind["ConfigMap"], "data", "config.yaml").(string)
	if cfg == "" {
		t.Fatal("ConfigMap has no data.config.yaml")
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for k, v := range dig(byKind["Secret"], "stringData").(map[string]any) {
		env[k] = fmt.Sprint(v)
	}
	validate(t, path, env)
}

func TestComposeFile(t *testing.T) {
	docs := yamlDocs(t, filepath.Join(repo, "docker-compose.yml"))
	if len(docs) != 1 {
		t.Fatalf("docker-compose.yml: %d documents", len(docs))
	}
	services, _ := docs[0]["services"].(map[string]any)
	for _, want := range []string{"redis", "postgres", "hearth-migrate", "notify-triggers", "hearth-1", "hearth-2"} {
		if services[want] == nil {
			t.Errorf("service %s missing", want)
		}
	}
	// The YAML anchor gives both instances the same command, config and env.
	for _, name := range []string{"hearth-1", "hearth-2"} {
		s := services[name]
		cmd, _ := dig(s, "command").([]any)
		if len(cmd) < 3 || cmd[0] != "run" || cmd[2] != "/etc/hearth/config.compose.yaml" {
			t.Errorf("%s command = %v, want run --config /etc/hearth/config.compose.yaml", name, cmd)
		}
		if vols, _ := dig(s, "volumes").([]any); len(vols) == 0 || !strings.HasPrefix(fmt.Sprint(vols[0]), "./deploy:/etc/hearth") {
			t.Errorf("%s volumes = %v, want ./deploy mounted at /etc/hearth", name, vols)
		}
	}
	// One image, built once: only the migrate service builds it.
	builds := 0
	for name, s := range services {
		if dig(s, "build") != nil {
			builds++
			if name != "hearth-migrate" {
				t.Errorf("%s builds the image; only hearth-migrate should", name)
			}
		}
	}
	if builds != 1 {
		t.Errorf("%d services build the image, want 1", builds)
	}
	env := map[string]string{}
	for k, v := range dig(services["hearth-1"], "environment").(map[string]any) {
		env[k] = fmt.Sprint(v)
	}
	if env["CATALOG_DSN"] == "" {
		t.Fatalf("hearth-1 sets no CATALOG_DSN: %v", env)
	}
	if tok := env["HEARTH_ADMIN_TOKEN"]; tok != "${HEARTH_ADMIN_TOKEN:-}" {
		t.Errorf("HEARTH_ADMIN_TOKEN = %q: a default token is a known password; leave it empty (admin API off)", tok)
	}
	cfg := filepath.Join(repo, "deploy/config.compose.yaml")
	validate(t, cfg, env)

	// The triggers the notify-triggers service applies are what notify-sql prints.
	sql, err := os.ReadFile(filepath.Join(repo, "deploy/compose-notify.sql"))
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"notify-sql", "product", "--table", "products", "--config", cfg}, &stdout, &stderr); code != 0 {
		t.Fatalf("notify-sql: exit %d: %s", code, stderr.String())
	}
	if !strings.HasSuffix(string(sql), stdout.String()) {
		t.Errorf("deploy/compose-notify.sql is not what notify-sql prints now:\n%s", stdout.String())
	}
}

// TestComposeHealthcheck runs the instances' healthcheck command, as compose
// would inside the container, against a port nothing listens on (exit 1, not
// 2: the subcommand and its flags are real) and against a /healthz that
// answers 200 (exit 0).
func TestComposeHealthcheck(t *testing.T) {
	docs := yamlDocs(t, filepath.Join(repo, "docker-compose.yml"))
	services, _ := docs[0]["services"].(map[string]any)
	for _, name := range []string{"hearth-1", "hearth-2"} {
		test, _ := dig(services[name], "healthcheck", "test").([]any)
		if len(test) < 3 || test[0] != "CMD" || test[1] != "/hearth" {
			t.Fatalf("%s healthcheck.test = %v, want [CMD /hearth healthcheck ...] (distroless has no shell or curl)", name, test)
		}
		args := make([]string, 0, len(test)-2)
		for _, a := range test[2:] {
			args = append(args, fmt.Sprint(a))
		}
		i := slices.Index(args, "--url")
		if i < 0 || i+1 >= len(args) {
			t.Fatalf("%s healthcheck %v: no --url", name, args)
		}
		u, err := url.Parse(args[i+1])
		if err != nil || u.Path != "/healthz" {
			t.Fatalf("%s healthcheck --url %q: want a /healthz URL", name, args[i+1])
		}

		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		stopped := l.Addr().String()
		l.Close()
		args[i+1] = "http://" + stopped + u.Path
		var stdout, stderr bytes.Buffer
		if code := run(t.Context(), args, &stdout, &stderr); code != exitFail {
			t.Errorf("%s healthcheck against a stopped port: exit %d, want 1\n%s", name, code, stderr.String())
		}

		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/healthz" {
				http.NotFound(w, r)
				return
			}
			_, _ = io.WriteString(w, `{"role":"leader","epoch":3,"ready":true}`)
		}))
		args[i+1] = srv.URL + u.Path
		stdout.Reset()
		stderr.Reset()
		if code := run(t.Context(), args, &stdout, &stderr); code != exitOK {
			t.Errorf("%s healthcheck against a healthy /healthz: exit %d, want 0\n%s", name, code, stderr.String())
		}
		srv.Close()
	}
}

// TestStaticBuild builds hearth the way the Makefile and the Dockerfile do
// (CGO_ENABLED=0, -trimpath, stripped) and checks that the binary is static,
// so that it runs on distroless/static or scratch.
func TestStaticBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "hearth")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("static build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary asks for a dynamic loader (PT_INTERP): not static")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary links %v: not static", libs)
	}
	var stdout, stderr bytes.Buffer
	v := exec.Command(bin, "version")
	v.Stdout, v.Stderr = &stdout, &stderr
	if err := v.Run(); err != nil || !strings.HasPrefix(stdout.String(), "hearth ") {
		t.Errorf("static binary: version: %v %q %q", err, stdout.String(), stderr.String())
	}
}
