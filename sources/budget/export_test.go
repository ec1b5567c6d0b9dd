package budget

import "github.com/prometheus/client_golang/prometheus"

// InflightGauge is the in-flight gauge, for tests.
func (b *Budget) InflightGauge() prometheus.Gauge { return b.inflight }
