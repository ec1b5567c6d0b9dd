// Package deploy_test checks the shipped Prometheus rules and Grafana
// dashboard with a real Prometheus: promtool loads the rules and runs their
// unit tests (prometheus/hearth-rules.test.yml), checks every dashboard query,
// and a Prometheus on loopback scrapes a live Hearth and sees the stale-key
// alert fire when the origin stops and resolve when it returns.
package deploy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const (
	rulesPath     = "prometheus/hearth-rules.yml"
	rulesTestPath = "prometheus/hearth-rules.test.yml"
	dashboardPath = "grafana/hearth.json"
)

// tool returns the path of a Prometheus binary (promtool, prometheus). Under
// CI=true a missing one fails the test (.ci/run installs Debian's prometheus
// package), elsewhere it skips.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		testenv.RequireServer(t, "%s not found (apt-get install prometheus): %v", name, err)
	}
	return p
}

func promtool(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(tool(t, "promtool"), args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

type rule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	return rf
}

func TestRulesLoad(t *testing.T) {
	out := promtool(t, "check", "rules", rulesPath)
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool check rules: %s", out)
	}
	var alerts []string
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: needs labels.severity, annotations.summary and annotations.description", r.Alert)
			}
		}
	}
	// The stampede, freshness and leadership alerts the README promises.
	for _, want := range []string{"HearthMissRateSpike", "HearthOriginSawtooth", "HearthLeaseWaitAboveRebuildTime",
		"HearthKeyNotRefreshed", "HearthPrewarmCoverageLow", "HearthNoLeader"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("alert %s missing", want)
		}
	}
}

// TestRulesUnitTests runs promtool's unit tests of the rules and checks that
// every shipped alert has a case where it fires and one where it stays silent.
func TestRulesUnitTests(t *testing.T) {
	out := promtool(t, "test", "rules", rulesTestPath)
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules: %s", out)
	}
	data, err := os.ReadFile(rulesTestPath)
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			Name       string `yaml:"name"`
			AlertTests []struct {
				Alert     string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(data, &tf); err != nil {
		t.Fatalf("%s: %v", rulesTestPath, err)
	}
	if !slices.Equal(tf.RuleFiles, []string{filepath.Base(rulesPath)}) {
		t.Errorf("%s tests rule files %v, want [%s]", rulesTestPath, tf.RuleFiles, filepath.Base(rulesPath))
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, c := range tf.Tests {
		for _, a := range c.AlertTests {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alert] = true
			} else {
				silent[a.Alert] = true
			}
		}
	}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if !fires[r.Alert] {
				t.Errorf("alert %s: no unit test in which it fires", r.Alert)
			}
			if !silent[r.Alert] {
				t.Errorf("alert %s: no unit test in which it stays silent", r.Alert)
			}
		}
	}
}

// TestDashboardQueries has promtool check every query of the Grafana
// dashboard, written as recording rules (Grafana's $__rate_interval and
// friends replaced by durations, as Grafana does before sending them).
func TestDashboardQueries(t *testing.T) {
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	grafana := strings.NewReplacer("$__rate_interval", "1m", "$__interval", "15s", "$__range", "1h")
	var rules []rule
	for i, p := range dash.Panels {
		for j, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q: target %d has no expr", p.Title, j)
				continue
			}
			expr := grafana.Replace(tg.Expr)
			if strings.Contains(expr, "$") {
				t.Errorf("panel %q: a Grafana variable this test does not know in %q", p.Title, tg.Expr)
			}
			rules = append(rules, rule{Record: fmt.Sprintf("dashboard:panel%d_target%d", i, j), Expr: expr})
		}
	}
	if len(rules) < 10 {
		t.Errorf("dashboard %q has %d queries, want the stampede, freshness and leadership panels", dash.Title, len(rules))
	}
	out, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	res := promtool(t, "check", "rules", path)
	if want := fmt.Sprintf("SUCCESS: %d rules found", len(rules)); !strings.Contains(res, want) {
		t.Errorf("promtool check rules on the dashboard's queries: %s (want %q)", res, want)
	}
}

// TestAlertFiresWhenOriginStops runs a real Prometheus on loopback that
// scrapes a live `hearth run` every second, with the shipped
// HearthKeyNotRefreshed rule (its margin cut from 30s to 3s and its `for`
// to 2s, so the test takes seconds, not minutes). The origin, an HTTP
// server behind a proxy, is cut: the alert goes pending, then firing; the
// origin comes back: the alert resolves.
func TestAlertFiresWhenOriginStops(t *testing.T) {
	prom := tool(t, "prometheus")
	rd := testenv.Redis(t)
	var calls atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		fmt.Fprintf(w, "value at %d", time.Now().UnixNano())
	}))
	t.Cleanup(origin.Close)
	proxy := testenv.NewProxy(t, strings.TrimPrefix(origin.URL, "http://"))

	dir := t.TempDir()
	listen := e2e.FreeAddr(t)
	cfg := fmt.Sprintf(`redis:
  addrs: [%q]
  namespace: %s
log:
  level: info
  format: json
refresh:
  load_timeout: 500ms
leader:
  lease: 1s
  retry_period: 200ms
sources:
  - name: api
    type: http
    base_url: http://%s
    timeout: 300ms
    retries: 0
    breaker: {failures: 0}
keys:
  - name: product
    key: "%sproduct"
    source: api
    path: /product
    ttl: 5s
    interval: 1s
`, rd.Addr, e2e.Namespace(t, rd.Client), proxy.Addr, rd.Prefix)
	cfgPath := filepath.Join(dir, "hearth.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	hearth := e2e.Start(t, []string{"run", "--config", cfgPath, "--listen", listen})
	hearth.WaitHTTP(t, "http://"+listen+"/readyz", http.StatusOK, 30*time.Second)

	// The shipped rule, shortened.
	var alert rule
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "HearthKeyNotRefreshed" {
				alert = r
			}
		}
	}
	if !strings.Contains(alert.Expr, "/ 2 + 30") {
		t.Fatalf("HearthKeyNotRefreshed's expr changed (%q): update the shortening here", alert.Expr)
	}
	alert.Expr = strings.Replace(alert.Expr, "/ 2 + 30", "/ 2 + 3", 1)
	alert.For = "2s"
	rules, _ := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "test", "interval": "1s", "rules": []rule{alert}}}})
	if err := os.WriteFile(filepath.Join(dir, "rules.yml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "rules", filepath.Join(dir, "rules.yml"))
	promAddr := e2e.FreeAddr(t)
	promCfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [rules.yml]
scrape_configs:
  - job_name: hearth
    static_configs:
      - targets: [%q]
`, listen)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(promCfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var promOut bytes.Buffer
	cmd := exec.Command(prom, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+promAddr)
	cmd.Stdout, cmd.Stderr = &promOut, &promOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus output:\n%s", promOut.String())
		}
	})
	e2e.WaitHTTP(t, "http://"+promAddr+"/-/ready", http.StatusOK, 30*time.Second)

	state := func() string {
		resp, err := http.Get("http://" + promAddr + "/api/v1/alerts")
		if err != nil {
			return "error: " + err.Error()
		}
		defer resp.Body.Close()
		var body struct {
			Data struct {
				Alerts []struct {
					Labels map[string]string `json:"labels"`
					State  string            `json:"state"`
				} `json:"alerts"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return "error: " + err.Error()
		}
		for _, a := range body.Data.Alerts {
			if a.Labels["alertname"] == "HearthKeyNotRefreshed" && a.Labels["family"] == "product" {
				return a.State
			}
		}
		return "inactive"
	}
	query := func(q string) string {
		resp, err := http.Get("http://" + promAddr + "/api/v1/query?query=" + strings.ReplaceAll(q, " ", "%20"))
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return b.String()
	}
	// Healthy: the rule's series are scraped and it stays inactive.
	testenv.Eventually(t, 20*time.Second, "prometheus sees hearth's last success", func() bool {
		return strings.Contains(query("hearth_last_success_timestamp_seconds"), `"family":"product"`)
	})
	for range 5 {
		if s := state(); s != "inactive" {
			t.Fatalf("alert %s while the origin is healthy", s)
		}
		time.Sleep(time.Second)
	}

	proxy.Cut(t)
	cut := time.Now()
	seen := map[string]time.Duration{}
	testenv.Eventually(t, 30*time.Second, "the alert firing after the origin stopped", func() bool {
		s := state()
		if _, ok := seen[s]; !ok {
			seen[s] = time.Since(cut)
		}
		return s == "firing"
	})
	if _, ok := seen["pending"]; !ok {
		t.Errorf("the alert went firing without being seen pending (states seen: %v)", seen)
	}
	t.Logf("origin cut: pending after %s, firing after %s", seen["pending"].Round(time.Second), seen["firing"].Round(time.Second))

	before := calls.Load()
	proxy.Restore(t)
	back := time.Now()
	testenv.Eventually(t, 30*time.Second, "the alert resolved after the origin returned", func() bool { return state() == "inactive" })
	t.Logf("origin back: resolved after %s", time.Since(back).Round(time.Second))
	if calls.Load() == before {
		t.Error("the alert resolved but hearth never called the origin again")
	}
	if hearth.Exited() {
		t.Error("hearth exited during the test")
	}
}
