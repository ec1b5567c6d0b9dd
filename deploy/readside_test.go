package deploy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/readside"
)

// TestReadsideFeedsTheMissRatio: an application that reads through readside
// gets the shipped miss-ratio rule and dashboard panel with no code of its
// own. The series readside exports after real reads (10 misses, 30 hits) are
// fed, names and labels as exported, to promtool's unit test of
// hearth:cache_miss_ratio:rate1m and of the "Cache miss ratio" panel's query:
// both must give 10/40.
func TestReadsideFeedsTheMissRatio(t *testing.T) {
	env := testenv.Redis(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	ns := strings.TrimSuffix(env.Prefix, ":") // no brace, and cleaned up with the prefix
	c, err := readside.New(readside.Options{Client: env.Client, Namespace: ns, TTL: time.Minute, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for i := range 10 {
		key := env.Prefix + "k" + strconv.Itoa(i)
		for range 4 { // a miss, then three hits
			if _, err := c.GetOrLoad(ctx, key, func(context.Context) ([]byte, error) { return []byte("v"), nil }); err != nil {
				t.Fatal(err)
			}
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var series []map[string]string
	for _, mf := range mfs {
		if mf.GetName() != "hearth_cache_reads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := int(m.GetCounter().GetValue())
			// Scraped every 15s: 0 before the reads, their count after.
			series = append(series, map[string]string{
				"series": mf.GetName() + "{" + strings.Join(labels, ",") + "}",
				"values": fmt.Sprintf("0 %d %d %d %d", v, v, v, v),
			})
		}
	}
	if len(series) == 0 {
		t.Fatal("readside exports no hearth_cache_reads_total")
	}
	panel := dashboardQuery(t, "Cache miss ratio")
	rules, err := filepath.Abs(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{{"labels": "{}", "value": 0.25}}
	test := map[string]any{
		"rule_files":          []string{rules},
		"evaluation_interval": "15s",
		"tests": []any{map[string]any{
			"interval":     "15s",
			"input_series": series,
			"promql_expr_test": []any{
				map[string]any{"expr": "hearth:cache_miss_ratio:rate1m", "eval_time": "1m",
					"exp_samples": []map[string]any{{"labels": "hearth:cache_miss_ratio:rate1m", "value": 0.25}}},
				map[string]any{"expr": panel, "eval_time": "1m", "exp_samples": want},
			},
		}},
	}
	out, err := yaml.Marshal(test)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "readside.test.yml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	if res := promtool(t, "test", "rules", path); !strings.Contains(res, "SUCCESS") {
		t.Errorf("promtool test rules with readside's series: %s\n%s", res, out)
	}
}

// dashboardQuery returns the one query of the dashboard panel titled title,
// with Grafana's $__rate_interval as 1m.
func dashboardQuery(t *testing.T, title string) string {
	t.Helper()
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := yaml.Unmarshal(data, &dash); err != nil { // JSON is YAML
		t.Fatal(err)
	}
	for _, p := range dash.Panels {
		if p.Title == title && len(p.Targets) == 1 {
			return strings.ReplaceAll(p.Targets[0].Expr, "$__rate_interval", "1m")
		}
	}
	t.Fatalf("%s: no panel %q with one query", dashboardPath, title)
	return ""
}
