package readside

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the read side's, all hearth_readside_* with bounded labels,
// and hearth_cache_reads_total, the counter Hearth's miss-rate alert and
// dashboard panel read (deploy/), under the name `hearth demo`'s readers
// export it.
type metrics struct {
	readHit     prometheus.Counter
	readMiss    prometheus.Counter
	hits        *prometheus.CounterVec
	hitValue    prometheus.Counter // hits{kind="value"}, resolved once: every hit counts
	hitNegative prometheus.Counter
	localHits   *prometheus.CounterVec
	misses      prometheus.Counter
	coalesced   prometheus.Counter
	lockWait    *prometheus.HistogramVec
	early       *prometheus.CounterVec
	fallbacks   *prometheus.CounterVec
	stale       *prometheus.CounterVec
	loads       *prometheus.CounterVec
	loadSeconds prometheus.Histogram
	foreign     *prometheus.CounterVec
	lockRepairs *prometheus.CounterVec
	staleReject *prometheus.CounterVec
	redisErrors *prometheus.CounterVec
	accesses    *prometheus.CounterVec
}

// newMetrics builds the metrics and registers them on reg (nil: nowhere).
// A name reg already holds (an application's own hearth_cache_reads_total,
// say, or a second Cache on one registry) is an error, and then nothing is
// left registered.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	reads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hearth_cache_reads_total",
		Help: "GetOrLoad calls by result: hit (answered from Redis or the near cache) or miss (no value in Redis, or Redis failed: the call fills). Hearth's miss-rate alert and dashboard read it.",
	}, []string{"result"})
	m := &metrics{
		readHit:  reads.WithLabelValues("hit"),
		readMiss: reads.WithLabelValues("miss"),
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_readside_hits_total",
			Help: "Reads answered from Redis, by kind: value or negative (the not-found sentinel).",
		}, []string{"kind"}),
		localHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_readside_local_hits_total",
			Help: "Reads answered from the in-process near cache without a Redis round trip, by kind: value or negative.",
		}, []string{"kind"}),
		misses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hearth_readside_misses_total",
			Help: "Reads that found no value in Redis.",
		}),
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hearth_readside_coalesced_total",
			Help: "Missed reads that waited for another caller's fill in this process.",
		}),
		lockWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hearth_readside_lock_wait_seconds",
			Help:    "Time a fill waited on another process's lock, by result: value (the holder wrote it), acquired (the lock was freed or lapsed), timeout.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"result"}),
		early: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_readside_early_refreshes_total",
			Help: "XFetch early refreshes decided, by result: started, coalesced (one already running here), locked (another process holds the lock), held_off (another process was seen holding the lock less than δ ago, not tried again), done_elsewhere (another process refreshed it meanwhile), error.",
		}, []string{"result"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_readside_fallbacks_total",
			Help: "Fills that could not wait for the lock, by reason (lock_timeout, redis_error) and action (load, stale, fail).",
		}, []string{"reason", "action"}),
		stale: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_readside_stale_served_total",
			Help: "Stale copies served, by reason: loader_error or fallback.",
		}, []string{"reason"}),
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_readside_loads_total",
			Help: "Loader runs, by result: ok, not_found, error, panic.",
		}, []string{"result"}),
		loadSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hearth_readside_load_duration_seconds",
			Help:    "Loader run time (the δ XFetch uses).",
			Buckets: prometheus.DefBuckets,
		}),
		foreign: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_readside_foreign_values_total",
			Help: "Values of the read side's own keys that were not its own and were ignored, by what: delta.",
		}, []string{"what"}),
		lockRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_readside_lock_repairs_total",
			Help: "Locks no reader would have written, deleted and taken, by reason: no_ttl, ttl_too_long (above LockTTL + 1s), foreign_format (not an owner token, or not a string).",
		}, []string{"reason"}),
		staleReject: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_readside_stale_rejected_total",
			Help: "Stale copies deleted instead of served, by reason: unframed (not readside's frame, or not a string), unknown_version, bad_checksum, too_old (older than TTL + StaleFor), future (written over a minute ahead).",
		}, []string{"reason"}),
		redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_readside_redis_errors_total",
			Help: "Redis commands that failed, by op: read, lock, store, release, repair, access.",
		}, []string{"op"}),
		accesses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_readside_access_reads_total",
			Help: "Reads counted into Hearth's access buckets, by result: sent, dropped (too long a key, too many keys, or Redis failed).",
		}, []string{"result"}),
	}
	m.hitValue, m.hitNegative = m.hits.WithLabelValues("value"), m.hits.WithLabelValues("negative")
	for _, k := range []string{"value", "negative"} {
		m.hits.WithLabelValues(k)
		m.localHits.WithLabelValues(k)
	}
	for _, r := range []string{"value", "acquired", "timeout"} {
		m.lockWait.WithLabelValues(r)
	}
	for _, r := range []string{"started", "coalesced", "locked", "held_off", "done_elsewhere", "error"} {
		m.early.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "not_found", "error", "panic"} {
		m.loads.WithLabelValues(r)
	}
	for _, r := range []string{lockNoTTL, lockTTLTooLong, lockForeignFormat} {
		m.lockRepairs.WithLabelValues(r)
	}
	for _, r := range []string{staleUnframed, staleUnknownVersion, staleBadChecksum, staleTooOld, staleFuture} {
		m.staleReject.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	cs := []prometheus.Collector{m.hits, m.localHits, m.misses, m.coalesced, m.lockWait, m.early, m.fallbacks,
		m.stale, m.loads, m.loadSeconds, m.foreign, m.lockRepairs, m.staleReject, m.redisErrors, m.accesses, reads}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("readside: Options.Registerer: %w", err)
		}
	}
	return m, nil
}
