// Package promtest reads metric values from a registry in tests.
//
// prometheus/testutil reads a value from a collector (ToFloat64), counts the
// series of a family (GatherAndCount) or compares a family's exposition text
// (GatherAndCompare); it has no way to read one labelled series out of a
// registry whose collectors the test does not hold (the warmer, the lease and
// the read side register theirs privately), which is what these tests need.
package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value returns the value of the one series of family name whose labels
// include every given name/value pair: a counter's or gauge's value, a
// histogram's or summary's sample count. It fails the test unless exactly one
// series matches, so that a misspelt name or label cannot pass as zero.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, n := gather(t, g, name, labels)
	if n != 1 {
		t.Fatalf("%d series %s%v, want exactly one", n, name, labels)
	}
	return v
}

// Sum is Value summed over every matching series, 0 when none matches (a
// labelled family has no series before its first observation).
func Sum(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, _ := gather(t, g, name, labels)
	return v
}

func gather(t testing.TB, g prometheus.Gatherer, name string, labels []string) (sum float64, n int) {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("labels of %s must be name/value pairs: %v", name, labels)
	}
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i < len(labels); i += 2 {
				if !hasLabel(m, labels[i], labels[i+1]) {
					continue series
				}
			}
			n++
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Untyped != nil:
				sum += m.GetUntyped().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			case m.Summary != nil:
				sum += float64(m.GetSummary().GetSampleCount())
			}
		}
	}
	return sum, n
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}
