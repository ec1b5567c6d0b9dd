package promtest_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hearth-dev/hearth/internal/promtest"
)

// fakeT records a fatal failure instead of ending the test.
type fakeT struct {
	testing.TB
	failed bool
}

func (f *fakeT) Helper()               {}
func (f *fakeT) Fatalf(string, ...any) { f.failed = true; panic(f) }
func (f *fakeT) Fatal(...any)          { f.failed = true; panic(f) }
func fails(f func(t testing.TB)) (ok bool) {
	ft := &fakeT{}
	defer func() {
		if r := recover(); r != nil && r != ft {
			panic(r)
		}
		ok = ft.failed
	}()
	f(ft)
	return false
}

func TestValueAndSum(t *testing.T) {
	reg := prometheus.NewRegistry()
	runs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runs_total", Help: "h"}, []string{"family", "result"})
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "leader", Help: "h"})
	hist := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "renew_seconds", Help: "h"}, []string{"result"})
	reg.MustRegister(runs, gauge, hist)
	runs.WithLabelValues("a", "ok").Add(3)
	runs.WithLabelValues("a", "error").Add(1)
	runs.WithLabelValues("b", "ok").Add(5)
	gauge.Set(1)
	hist.WithLabelValues("ok").Observe(0.1)
	hist.WithLabelValues("ok").Observe(0.2)

	if got := promtest.Value(t, reg, "runs_total", "family", "a", "result", "ok"); got != 3 {
		t.Errorf("Value(a, ok) = %g, want 3", got)
	}
	if got := promtest.Value(t, reg, "leader"); got != 1 {
		t.Errorf("Value(leader) = %g, want 1", got)
	}
	if got := promtest.Value(t, reg, "renew_seconds", "result", "ok"); got != 2 {
		t.Errorf("Value(renew ok) = %g, want the 2 observations", got)
	}
	if got := promtest.Sum(t, reg, "runs_total", "result", "ok"); got != 8 {
		t.Errorf("Sum(ok) = %g, want 8", got)
	}
	if got := promtest.Sum(t, reg, "runs_total", "family", "c"); got != 0 {
		t.Errorf("Sum(c) = %g, want 0", got)
	}
	for name, f := range map[string]func(t testing.TB){
		"no such family": func(t testing.TB) { promtest.Value(t, reg, "runs_totl", "family", "a", "result", "ok") },
		"no such label":  func(t testing.TB) { promtest.Value(t, reg, "runs_total", "family", "a", "reslt", "ok") },
		"several series": func(t testing.TB) { promtest.Value(t, reg, "runs_total", "family", "a") },
		"odd labels":     func(t testing.TB) { promtest.Sum(t, reg, "runs_total", "family") },
	} {
		if !fails(f) {
			t.Errorf("%s: Value did not fail the test", name)
		}
	}
}
