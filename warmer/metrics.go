package warmer

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/behind"
)

type metrics struct {
	runs          *prometheus.CounterVec
	runDuration   *prometheus.HistogramVec
	loadDuration  *prometheus.HistogramVec
	keysWritten   *prometheus.CounterVec
	failures      *prometheus.CounterVec
	staleExtended *prometheus.CounterVec
	staleness     *prometheus.GaugeVec
	lastSuccess   *prometheus.GaugeVec
	lag           *prometheus.HistogramVec
	members       *prometheus.GaugeVec
	redisErrors   *prometheus.CounterVec
	inFlight      prometheus.Gauge
	// versionRepairs counts what version-checked writes found wrong.
	versionRepairs *prometheus.CounterVec
	// behind shows runs that cannot keep up.
	behind *behind.Metrics
}

func newMetrics(reg prometheus.Registerer, log zerolog.Logger, now func() time.Time) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		runs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_refresh_runs_total",
			Help: "Refresh runs of a declaration by result (ok, partial, error, aborted: cut short by shutdown).",
		}, []string{"family", "result"}),
		runDuration: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hearth_refresh_duration_seconds",
			Help:    "Wall time of one refresh run of a declaration, pacing included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"family"}),
		loadDuration: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hearth_origin_load_duration_seconds",
			Help:    "Duration of one batched load from an origin, by result.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 12),
		}, []string{"source", "result"}),
		keysWritten: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_keys_written_total",
			Help: "Keys written to Redis by kind (value, negative).",
		}, []string{"family", "kind"}),
		failures: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_load_failures_total",
			Help: "Members not refreshed, by reason; their previous values are kept.",
		}, []string{"family", "reason"}),
		staleExtended: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_stale_extensions_total",
			Help: "Values kept alive (TTL extended, value untouched) because their load failed.",
		}, []string{"family"}),
		staleness: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_staleness_seconds",
			Help: "Seconds since the declaration's last fully successful refresh (0 while healthy).",
		}, []string{"family"}),
		lastSuccess: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_last_success_timestamp_seconds",
			Help: "Unix time of the declaration's last fully successful refresh.",
		}, []string{"family"}),
		lag: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hearth_schedule_lag_seconds",
			Help:    "Actual minus planned start of refresh runs and their paced batches.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 17),
		}, []string{"family"}),
		members: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_members",
			Help: "Members of a declaration at its last refresh (1 for a single key).",
		}, []string{"family"}),
		redisErrors: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_redis_errors_total",
			Help: "Redis commands that failed, by operation.",
		}, []string{"op"}),
		inFlight: f.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_loads_in_flight",
			Help: "Origin loads running now.",
		}),
		versionRepairs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_version_repairs_total",
			Help: "Keys of version-checked declarations where the write found something wrong and repaired it, by reason (value_mismatch, value_absent, record_unconfirmed, record_malformed).",
		}, []string{"family", "reason"}),
	}
	m.behind = behind.NewMetrics(f, log, now)
	return m
}
