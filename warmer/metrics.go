package warmer

import "github.com/prometheus/client_golang/prometheus"

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
	// behind, behindSeconds and overruns show runs that cannot keep up (behind.go).
	behind        *prometheus.CounterVec
	behindSeconds *prometheus.GaugeVec
	overruns      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_refresh_runs_total",
			Help: "Refresh runs of a declaration by result (ok, partial, error, aborted: cut short by shutdown).",
		}, []string{"family", "result"}),
		runDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hearth_refresh_duration_seconds",
			Help:    "Wall time of one refresh run of a declaration, pacing included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"family"}),
		loadDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hearth_origin_load_duration_seconds",
			Help:    "Duration of one batched load from an origin, by result.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 12),
		}, []string{"source", "result"}),
		keysWritten: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_keys_written_total",
			Help: "Keys written to Redis by kind (value, negative).",
		}, []string{"family", "kind"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_load_failures_total",
			Help: "Members not refreshed, by reason; their previous values are kept.",
		}, []string{"family", "reason"}),
		staleExtended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_stale_extensions_total",
			Help: "Values kept alive (TTL extended, value untouched) because their load failed.",
		}, []string{"family"}),
		staleness: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_staleness_seconds",
			Help: "Seconds since the declaration's last fully successful refresh (0 while healthy).",
		}, []string{"family"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_last_success_timestamp_seconds",
			Help: "Unix time of the declaration's last fully successful refresh.",
		}, []string{"family"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hearth_schedule_lag_seconds",
			Help:    "Actual minus planned start of refresh runs and their paced batches.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 17),
		}, []string{"family"}),
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_members",
			Help: "Members of a declaration at its last refresh (1 for a single key).",
		}, []string{"family"}),
		redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_redis_errors_total",
			Help: "Redis commands that failed, by operation.",
		}, []string{"op"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_loads_in_flight",
			Help: "Origin loads running now.",
		}),
		versionRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_version_repairs_total",
			Help: "Keys of version-checked declarations where the write found something wrong and repaired it, by reason (value_mismatch, value_absent, record_unconfirmed, record_malformed).",
		}, []string{"family", "reason"}),
	}
	reg.MustRegister(m.runs, m.runDuration, m.loadDuration, m.keysWritten, m.failures,
		m.staleExtended, m.staleness, m.lastSuccess, m.lag, m.members, m.redisErrors, m.inFlight, m.versionRepairs)
	reg.MustRegister(newBehindMetrics(m)...)
	return m
}
