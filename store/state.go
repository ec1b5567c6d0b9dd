package store

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// MaxEpochAhead bounds how far past Redis TIME an epoch read from Hearth's own
// keys (fence, lease, epoch counter) may lie and still count as one Hearth
// issued. Epochs are Redis TIME in ms at acquisition, or the last epoch + 1 when
// the clock went back, so a legitimate epoch is never far ahead of TIME; one
// minute tolerates clock steps and skew between Cluster masters. A value
// further ahead is foreign and repaired. A fence within the bound but above
// the epoch counter is foreign too; the leader package repairs it when it
// refuses a new leader's raise (RepairRaise), so it holds writes off for
// one term, not for the minute.
const MaxEpochAhead = time.Minute

// FoundMax truncates what a foreign value is logged as.
const FoundMax = 64

// LeaseTTLFactor bounds the TTL a standby accepts on another instance's
// lease, as a multiple of its own lease duration: a Hearth holder's lease
// never has more left than that holder's lease duration, and the instances
// of one fleet run with lease durations within this factor of each other
// (docs/leadership.md). A longer TTL (SET … PX by hand) is foreign.
const LeaseTTLFactor = 2

// RenewTolerance is how far the lease's expiry (Redis TIME + PTTL, in ms) may
// move between two looks without counting as a renewal: the rounding of TIME
// and PTTL to milliseconds. A renewal moves it by the time since the last one.
const RenewTolerance = 2

// Kinds of Hearth state, the values of hearth_state_repairs_total's key label.
const (
	KindFence  = "fence"
	KindLease  = "lease"
	KindEpoch  = "epoch"
	KindMarker = "marker"
	// KindVersion: a version record beside a value (VersionKey).
	KindVersion = "version"
)

// Repairs counts and logs the foreign values Hearth found in its own keys
// and repaired. The fence store, the lease and the re-warm watch share one
// counter per registry.
type Repairs struct {
	count *prometheus.CounterVec
	log   zerolog.Logger
}

// NewRepairs registers hearth_state_repairs_total on reg, or shares the one
// already registered there.
func NewRepairs(reg prometheus.Registerer, log zerolog.Logger) *Repairs {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hearth_state_repairs_total",
		Help: "Foreign values (not an integer epoch in range, wrong format or Redis type, no TTL, a lease no Hearth instance holds, a fence above the epoch counter) found in Hearth's own keys and repaired, by kind of key (fence, lease, epoch, marker, version).",
	}, []string{"key"})
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(err)
		}
		c = are.ExistingCollector.(*prometheus.CounterVec)
	}
	for _, k := range []string{KindFence, KindLease, KindEpoch, KindMarker, KindVersion} {
		c.WithLabelValues(k)
	}
	return &Repairs{count: c, log: log}
}

// Repaired records one repair: kind is the label, key the Redis key, found
// what it held (already truncated by the script).
func (r *Repairs) Repaired(kind, key, found string) { r.RepairedWhy(kind, key, found, "") }

// RepairedWhy records one repair of a value that is well-formed but that no
// Hearth instance would have left there; why says what gave it away (its TTL,
// an epoch never issued), and is logged when not empty.
func (r *Repairs) RepairedWhy(kind, key, found, why string) {
	r.count.WithLabelValues(kind).Inc()
	if len(found) > FoundMax {
		found = found[:FoundMax]
	}
	ev := r.log.Warn().Str("state", kind).Str("key", key).Str("found", found)
	if why != "" {
		ev = ev.Str("why", why)
	}
	ev.Msg("foreign value in hearth's own key: treated as absent and repaired")
}
