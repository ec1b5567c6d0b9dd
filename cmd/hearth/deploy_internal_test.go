package main

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	"github.com/hearth-dev/hearth/daemon"
	"github.com/hearth-dev/hearth/demo"
	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/warmer"
)

// repo is the repository root, seen from cmd/hearth.
const repo = "../.."

// notYetMerged are metrics that a colleague's branch exports under these exact
// names. They are accepted until that branch is merged; then build its
// component in exportedMetrics and take them off this list.
var notYetMerged = []string{}

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
	w, err := warmer.New(warmer.Options{Store: &warmer.RedisStore{Client: rdb}, Registerer: rec})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.New(jobs.Options{Refresher: w}); err != nil {
		t.Fatal(err)
	}
	fence := warmer.NewFencedStore(warmer.FencedStoreOptions{Client: rdb, Namespace: "t", Registerer: rec})
	if _, err := warmer.NewLease(warmer.LeaseOptions{Client: rdb, Namespace: "t", Duration: time.Second, Fence: fence, Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	daemon.RegisterMetrics(rec)
	// Pre-warm: the warmer above registers hearth_prewarm_*; the re-warm watch
	// and the access-log roll-up register theirs.
	if _, err := warmer.NewRewarmer(warmer.RewarmOptions{Client: rdb, Namespace: "t", Warmer: w, Registerer: rec}); err != nil {
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
	for _, n := range notYetMerged {
		names[n] = true
	}
	return names
}

// promqlKeywords are identifiers in PromQL that are not metric names.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "offset": true, "bool": true, "inf": true, "nan": true, "atan2": true,
}

// promqlAggregations may be followed by by/without before their parentheses.
var promqlAggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true, "count": true,
	"count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true,
}

// metricNames extracts the metric names a PromQL expression selects. It skips
// strings, label matchers {…}, ranges and subqueries […], numbers and
// durations, function and aggregation calls name(…), label lists after
// by/without/on/ignoring/group_left/group_right, keywords, and $variables.
func metricNames(expr string) ([]string, error) {
	var out []string
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	// skipString returns the index after the string literal that starts at i.
	skipString := func(i int) (int, error) {
		q := expr[i]
		for j := i + 1; j < len(expr); j++ {
			switch {
			case expr[j] == '\\' && q != '`':
				j++
			case expr[j] == q:
				return j + 1, nil
			}
		}
		return 0, fmt.Errorf("unterminated string in %q", expr)
	}
	// skipTo returns the index after the bracket that closes the one at i.
	skipTo := func(i int, open, close byte) (int, error) {
		depth := 0
		for ; i < len(expr); i++ {
			switch c := expr[i]; c {
			case '"', '\'', '`':
				j, err := skipString(i)
				if err != nil {
					return 0, err
				}
				i = j - 1
			case open:
				depth++
			case close:
				depth--
				if depth == 0 {
					return i + 1, nil
				}
			}
		}
		return 0, fmt.Errorf("unbalanced %c in %q", open, expr)
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j, err := skipString(i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '{':
			j, err := skipTo(i, '{', '}')
			if err != nil {
				return nil, err
			}
			i = j
		case c == '[':
			j, err := skipTo(i, '[', ']')
			if err != nil {
				return nil, err
			}
			i = j
		case c == '$':
			i++
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '{' || expr[i] == '}') {
				i++
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdent(expr[j]) {
				j++
			}
			word := expr[i:j]
			k := j
			for k < len(expr) && (expr[k] == ' ' || expr[k] == '\n' || expr[k] == '\t') {
				k++
			}
			lower := strings.ToLower(word)
			switch {
			case promqlKeywords[lower] && k < len(expr) && expr[k] == '(' && lower != "atan2":
				// by (le, family) and friends: a label list.
				end, err := skipTo(k, '(', ')')
				if err != nil {
					return nil, err
				}
				j = end
			case promqlKeywords[lower], promqlAggregations[lower]:
			case k < len(expr) && expr[k] == '(':
				// A function or an aggregation: its arguments are scanned on.
			default:
				out = append(out, word)
			}
			i = j
		default:
			i++
		}
	}
	return out, nil
}

func TestMetricNames(t *testing.T) {
	for _, c := range []struct{ expr, want string }{
		{`sum by (le, family) (rate(hearth_a_bucket{x="y}(z"}[5m] offset 1h))`, "hearth_a_bucket"},
		{`time() - max by (family) (a) > on (family) group_left b / 2 + 30`, "a b"},
		{`(sum(x) or vector(0)) < 1 and absent(y)`, "x y"},
		{`quantile_over_time(0.99, rec:name:rate30s[30m]) > 10 * z`, "rec:name:rate30s z"},
		{`rate(m[$__rate_interval]) * 1e3 + $var`, "m"},
	} {
		got, err := metricNames(c.expr)
		if err != nil || strings.Join(got, " ") != c.want {
			t.Errorf("metricNames(%q) = %v, %v; want %s", c.expr, got, err, c.want)
		}
	}
}

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

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record      string            `yaml:"record"`
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func TestAlertRules(t *testing.T) {
	exported := exportedMetrics(t)
	data, err := os.ReadFile(filepath.Join(repo, "deploy/prometheus/hearth-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("hearth-rules.yml: %v", err)
	}
	recorded := map[string]bool{}
	var alerts []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			id := r.Alert + r.Record
			if (r.Alert == "") == (r.Record == "") || strings.TrimSpace(r.Expr) == "" {
				t.Errorf("group %s: rule %q needs exactly one of alert/record and an expr", g.Name, id)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for: %v", id, err)
				}
			}
			if r.Alert != "" {
				alerts = append(alerts, r.Alert)
				if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
					t.Errorf("alert %s: needs labels.severity, annotations.summary and annotations.description", r.Alert)
				}
			}
			names, err := metricNames(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", id, err)
				continue
			}
			if len(names) == 0 {
				t.Errorf("%s: no metric in %q", id, r.Expr)
			}
			for _, n := range names {
				if !known(exported, n) && !recorded[n] {
					t.Errorf("%s: %s is not a metric Hearth exports (nor a rule of this file)", id, n)
				}
			}
		}
	}
	// The list: miss rate, sawtooth, lease wait, stale key, pre-warm
	// coverage, no leader.
	for _, want := range []string{"HearthMissRateSpike", "HearthOriginSawtooth", "HearthLeaseWaitAboveRebuildTime",
		"HearthKeyNotRefreshed", "HearthPrewarmCoverageLow", "HearthNoLeader"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("alert %s missing", want)
		}
	}

	t.Run("dashboard", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(repo, "deploy/grafana/hearth.json"))
		if err != nil {
			t.Fatal(err)
		}
		var dash struct {
			Title  string `json:"title"`
			Panels []struct {
				Title   string `json:"title"`
				Type    string `json:"type"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(data, &dash); err != nil {
			t.Fatalf("hearth.json: %v", err)
		}
		exprs := 0
		for _, p := range dash.Panels {
			for _, tg := range p.Targets {
				exprs++
				names, err := metricNames(tg.Expr)
				if err != nil {
					t.Errorf("panel %q: %v", p.Title, err)
				}
				for _, n := range names {
					if !known(exported, n) && !recorded[n] {
						t.Errorf("panel %q: %s is not a metric Hearth exports", p.Title, n)
					}
				}
			}
		}
		if exprs < 10 {
			t.Errorf("dashboard %q has %d queries, want the stampede, freshness and leadership panels", dash.Title, exprs)
		}
	})
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
	for _, want := range []string{"redis", "postgres", "hearth-1", "hearth-2"} {
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
	env := map[string]string{}
	for k, v := range dig(services["hearth-1"], "environment").(map[string]any) {
		env[k] = fmt.Sprint(v)
	}
	if env["CATALOG_DSN"] == "" {
		t.Fatalf("hearth-1 sets no CATALOG_DSN: %v", env)
	}
	validate(t, filepath.Join(repo, "deploy/config.compose.yaml"), env)
}

// TestStaticBuild builds hearth the way the Makefile and the Dockerfile do
// (CGO_ENABLED=0, -trimpath, stripped) and checks that the binary is static,
// so that it runs on distroless/static or scratch, embedded demo included.
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
