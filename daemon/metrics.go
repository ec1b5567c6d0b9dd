package daemon

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hearth-dev/hearth/admin"
)

// RegisterMetrics registers on reg the metrics of the daemon's own parts, the
// admin API and the config reloader, as a running daemon exports them (the
// admin API's only with HEARTH_ADMIN_TOKEN set); the engine's packages (warmer,
// jobs, accesslog) register theirs. The deploy checks (alert rules and
// dashboards name only exported metrics) list them with it.
func RegisterMetrics(reg prometheus.Registerer) {
	_ = admin.New(admin.Options{Token: "-", Registerer: reg}).Close(context.Background())
	newReloadMetrics(reg)
}
