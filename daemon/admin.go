package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/admin"
	"github.com/hearth-dev/hearth/warmer"
)

// adminTokenEnv names the environment variable that holds the admin API's bearer
// token. Unset or empty, the admin routes do not exist (404).
const adminTokenEnv = "HEARTH_ADMIN_TOKEN"

// openAdmin mounts the admin API on the daemon's listener when HEARTH_ADMIN_TOKEN
// is set, and returns nil (the routes do not exist) when it is not. leading
// tells whether this instance may write now; pw runs the admin's pre-warms.
func openAdmin(srv *server, w *warmer.Warmer, leading func() bool,
	pw admin.Prewarmer, reg prometheus.Registerer, log zerolog.Logger) *admin.API {
	token := os.Getenv(adminTokenEnv)
	if token == "" {
		return nil
	}
	a := admin.New(admin.Options{Token: token, Warmer: w, Leading: leading, Prewarm: pw, Registerer: reg, Logger: log})
	srv.mux.Handle("/admin/", a)
	if host, _, err := net.SplitHostPort(srv.Addr()); err == nil {
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			log.Warn().Str("addr", srv.Addr()).Msg("admin API reachable beyond loopback: restrict who can reach http.listen")
		}
	}
	log.Info().Msg("admin API enabled")
	return a
}

// adminReload is POST /admin/reload: a reload now, as a file change or
// SIGHUP would start.
func (r *reloader) adminReload() (admin.ReloadResult, error) {
	r.log.Info().Msg("POST /admin/reload: reloading the config")
	res, err := r.reload()
	if errors.Is(err, errReloadClosed) {
		return admin.ReloadResult{}, fmt.Errorf("%w: %w", admin.ErrClosed, err)
	}
	return admin.ReloadResult{
		Added: res.Added, Removed: res.Removed, Changed: res.Changed, RestartRequired: res.RestartRequired,
	}, err
}
