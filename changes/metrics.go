package changes

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/hearth-dev/hearth/warmer"
)

// metrics are the change listeners' metrics.
type metrics struct {
	notifications *prometheus.CounterVec
	members       *prometheus.CounterVec
	refreshes     *prometheus.CounterVec
	overflows     *prometheus.CounterVec
	lag           *prometheus.HistogramVec
	wait          *prometheus.HistogramVec
	delivery      *prometheus.HistogramVec
	connected     *prometheus.GaugeVec
	reconnects    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	m := &metrics{
		notifications: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_change_notifications_total",
			Help: "Change notifications received, by channel and result (ok, malformed: not Hearth's payload, ignored).",
		}, []string{"channel", "result"}),
		members: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_change_members_total",
			Help: "Changed members named by notifications, by what became of them (queued, coalesced into a pending refresh, full: turned into a full refresh, invalid, not_declared: no key of the declaration).",
		}, []string{"family", "result"}),
		refreshes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_change_refreshes_total",
			Help: "Refreshes triggered by change notifications, by kind (members: one batched load of changed members, full: the whole declaration).",
		}, []string{"family", "kind"}),
		overflows: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_change_overflows_total",
			Help: "Times a declaration's pending changed members exceeded the bound and were replaced by one full refresh.",
		}, []string{"family"}),
		lag: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hearth_change_lag_seconds",
			Help:    "From a change (the trigger's clock_timestamp) to its refreshed value acknowledged by Redis.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"family"}),
		wait: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hearth_change_wait_seconds",
			Help:    "Per change-driven members refresh, how long its longest-waiting member waited in the queue before the refresh started (the coalesce wait, the gather wait under sustained change, a refresh in flight, a capped batch ahead).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"family"}),
		delivery: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hearth_change_delivery_seconds",
			Help:    "From a change (the trigger's clock_timestamp, before the writer's commit) to its notification's receipt: the writer's commit and PostgreSQL's delivery, the part of hearth_change_lag_seconds before Hearth's queue. Notifications without a usable timestamp are not counted.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"channel"}),
		connected: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hearth_change_listen_connected",
			Help: "1 while the source's LISTEN connection is up (on the leader), else 0.",
		}, []string{"source"}),
		reconnects: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_change_listen_reconnects_total",
			Help: "Times the source's LISTEN connection failed or dropped and was reconnected.",
		}, []string{"source"}),
	}
	return m
}

func (m *metrics) init(family, channel, source string) {
	m.notifications.WithLabelValues(channel, "ok")
	m.notifications.WithLabelValues(channel, "malformed")
	m.refreshes.WithLabelValues(family, "members")
	m.refreshes.WithLabelValues(family, "full")
	m.overflows.WithLabelValues(family)
	m.connected.WithLabelValues(source)
	m.reconnects.WithLabelValues(source)
}

// forget drops the series of the declarations, channels and sources that
// listened in old and do not in next, as a reload drops a removed
// declaration's other series.
func (m *metrics) forget(old, next []*warmer.Spec) {
	keep := map[[2]string]bool{}
	for _, s := range next {
		if s != nil && s.Notify != "" {
			keep[[2]string{"family", s.Name}], keep[[2]string{"channel", s.Notify}], keep[[2]string{"source", s.Source}] = true, true, true
		}
	}
	for _, s := range old {
		if s == nil || s.Notify == "" {
			continue
		}
		if !keep[[2]string{"family", s.Name}] {
			l := prometheus.Labels{"family": s.Name}
			m.members.DeletePartialMatch(l)
			m.refreshes.DeletePartialMatch(l)
			m.overflows.DeletePartialMatch(l)
			m.lag.DeletePartialMatch(l)
			m.wait.DeletePartialMatch(l)
		}
		if !keep[[2]string{"channel", s.Notify}] {
			m.notifications.DeletePartialMatch(prometheus.Labels{"channel": s.Notify})
			m.delivery.DeletePartialMatch(prometheus.Labels{"channel": s.Notify})
		}
		if !keep[[2]string{"source", s.Source}] {
			l := prometheus.Labels{"source": s.Source}
			m.connected.DeletePartialMatch(l)
			m.reconnects.DeletePartialMatch(l)
		}
	}
}
