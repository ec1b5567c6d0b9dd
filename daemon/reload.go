package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/jobs"
	"github.com/hearth-dev/hearth/warmer"
)

// reloadSettle is how long the config file must stay quiet before it is read:
// editors and ConfigMap updates touch it several times in a row.
const reloadSettle = 150 * time.Millisecond

// restartOnly are the refresh settings read once at start-up; every other
// refresh setting is a default that declarations inherit, applied on reload.
var restartOnly = map[string]bool{"max_concurrent_loads": true, "max_inflight_bytes": true, "spread": true, "shutdown_timeout": true}

// notifyHUP starts catching SIGHUP at once, so that a reload signal sent while
// the daemon is still starting waits for the reloader instead of killing it.
func notifyHUP() chan os.Signal {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	return ch
}

// reloader re-reads the config on SIGHUP and when its file changes, and applies
// the declarations that changed to the warmer and the scheduler, without a
// restart: leadership, connections and warm keys stay. An invalid config is
// rejected as a whole and the running one stays.
type reloader struct {
	path string
	// running is the file as it was at start-up, before command-line overrides,
	// so that only real edits count as needing a restart.
	running *config.Config
	w       *warmer.Warmer
	sched   schedule
	// changes, when set, follows the reloaded notify declarations.
	changes interface{ Apply([]*warmer.Spec) error }
	metrics *reloadMetrics
	log     zerolog.Logger
	hup     chan os.Signal
	watcher *fsnotify.Watcher
	cancel  context.CancelFunc
	done    chan struct{}

	mu      sync.Mutex
	content []byte
	// unread is set when the last reload could not read the file: content is
	// then older than the file, and the same bytes must be applied again.
	unread bool
	state  reloadState
}

// reloadState is the reload part of GET /admin/status.
type reloadState struct {
	File            string     `json:"file"`
	LastReload      *time.Time `json:"last_reload,omitempty"`
	LastReloadOK    bool       `json:"last_reload_ok"`
	LastError       string     `json:"last_error,omitempty"`
	RestartRequired []string   `json:"restart_required,omitempty"`
}

// schedule is the part of the scheduler a reload updates (*jobs.Scheduler):
// all or nothing, the old schedule staying whole on error.
type schedule interface {
	Apply(specs []*warmer.Spec) (warmer.Changes, error)
}

var _ schedule = (*jobs.Scheduler)(nil)

// newReloader builds the reloader of cfg's file; open starts watching, close stops it.
func newReloader(cfg *config.Config, hup chan os.Signal, w *warmer.Warmer, sched schedule, reg prometheus.Registerer, log zerolog.Logger) *reloader {
	return &reloader{
		path: cfg.File, running: cfg, w: w, sched: sched,
		metrics: newReloadMetrics(reg),
		log:     log.With().Str("component", "reload").Str("config", cfg.File).Logger(),
		hup:     hup, cancel: func() {}, done: make(chan struct{}),
		state: reloadState{File: cfg.File, LastReloadOK: true},
	}
}

// open remembers the file as it is now and starts watching it and SIGHUP.
func (r *reloader) open() {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	// The file was loaded a moment ago; a re-read that fails now means it is
	// changing under us, which the next event or SIGHUP reports in full.
	data, err := os.ReadFile(r.path)
	if err != nil {
		r.log.Warn().Err(err).Msg("cannot re-read the config file at start-up; the running config stays")
	} else if c, err := config.Parse(r.path, data); err != nil {
		r.log.Warn().Err(err).Msg("the config file changed during start-up and is now invalid; the running config stays")
	} else {
		r.running, r.content = c, data
	}
	r.metrics.lastSuccess.Set(1)
	r.metrics.lastSuccessTime.SetToCurrentTime()
	// Watch the directory, not the file: editors replace the file by renaming a
	// new one over it, and Kubernetes swaps a ConfigMap's ..data symlink, both of
	// which a watch on the old file would miss.
	watcher, err := fsnotify.NewWatcher()
	if err == nil {
		if err = watcher.Add(filepath.Dir(r.path)); err != nil {
			_ = watcher.Close()
		}
	}
	if err != nil {
		r.log.Warn().Err(err).Msg("cannot watch the config file; reload with SIGHUP")
	} else {
		r.watcher = watcher
	}
	go r.loop(ctx)
}

func (r *reloader) loop(ctx context.Context) {
	defer close(r.done)
	var events <-chan fsnotify.Event
	var errs <-chan error
	if r.watcher != nil {
		events, errs = r.watcher.Events, r.watcher.Errors
	}
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	defer settle.Stop()
	// missing is set when the file was found absent once: a rename over it is
	// in progress, or it was deleted. Absent again one settle later, the reload
	// is reported as failed rather than waited for forever.
	missing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.hup:
			r.log.Info().Msg("SIGHUP: reloading the config")
			r.reload()
		case _, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			settle.Reset(reloadSettle)
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			r.log.Warn().Err(err).Msg("config watch error")
		case <-settle.C:
			data, err := os.ReadFile(r.path)
			r.mu.Lock()
			// After a failed read the same bytes are applied again: the file
			// is back as it was, and the state must say so.
			same := err == nil && bytes.Equal(data, r.content) && !r.unread
			r.mu.Unlock()
			if same {
				missing = false
				continue // another file in the directory, or a touch
			}
			if errors.Is(err, fs.ErrNotExist) && !missing {
				missing = true // mid-rename: look again once it has settled
				settle.Reset(reloadSettle)
				continue
			}
			missing = false
			r.log.Info().Msg("config file changed: reloading")
			r.reload()
		}
	}
}

// reload loads and validates the file, then applies what changed. It never
// leaves the daemon half-configured: an invalid file changes nothing.
func (r *reloader) reload() {
	// Read once: what is validated is what is remembered as applied.
	data, err := os.ReadFile(r.path)
	if err != nil {
		r.failed("unreadable", fmt.Errorf("read config: %w", err))
		return
	}
	r.mu.Lock()
	r.content, r.unread = data, false
	r.mu.Unlock()
	cfg, err := config.Parse(r.path, data)
	if err != nil {
		r.failed("invalid", err)
		return
	}
	drift := restartNeeded(r.running, cfg)
	// A new redis.namespace applies only on restart; until then Hearth's own
	// keys stay under the one in use, and declarations must keep out of it.
	if ns := r.running.Redis.Namespace; cfg.Redis.Namespace != ns {
		inUse := *cfg
		inUse.Redis.Namespace = ns
		if err := inUse.Validate(); err != nil {
			r.failed("invalid", fmt.Errorf("redis.namespace %q stays in use until a restart: %w", ns, err))
			return
		}
		cfg = &inUse
	}
	specs := cfg.Specs()
	// Warmer and schedule swap together: the warmer first, so that a newly
	// scheduled declaration finds itself there on its first run; when the
	// schedule cannot follow (it then stays the old one), the warmer's swap is
	// undone and the old config stays whole.
	sw, err := r.w.Swap(specs)
	if err != nil {
		r.failed("error", err)
		return
	}
	if _, err := r.sched.Apply(specs); err != nil {
		sw.Undo()
		r.failed("error", err)
		return
	}
	sw.Keep()
	if r.changes != nil {
		if err := r.changes.Apply(specs); err != nil {
			r.log.Warn().Err(err).Msg("change listeners not updated: they keep listening as the last config they ran with")
		}
	}
	ch := sw.Changes()
	now := time.Now()
	r.metrics.reloads.WithLabelValues("ok").Inc()
	r.metrics.lastSuccess.Set(1)
	r.metrics.lastSuccessTime.Set(float64(now.UnixNano()) / 1e9)
	r.metrics.restartRequired.Set(boolGauge(len(drift) > 0))
	r.mu.Lock()
	r.state = reloadState{File: r.path, LastReload: &now, LastReloadOK: true, RestartRequired: drift}
	r.mu.Unlock()
	r.log.Info().Strs("added", ch.Added).Strs("removed", ch.Removed).Strs("changed", ch.Changed).
		Int("declarations", len(specs)).Msg("config reloaded")
	if len(drift) > 0 {
		r.log.Warn().Strs("sections", drift).Msg("config changes that need a restart were NOT applied; restart to apply them")
	}
}

func (r *reloader) failed(result string, err error) {
	now := time.Now()
	r.metrics.reloads.WithLabelValues(result).Inc()
	r.metrics.lastSuccess.Set(0)
	r.mu.Lock()
	r.state.LastReload, r.state.LastReloadOK, r.state.LastError = &now, false, err.Error()
	if result == "unreadable" {
		r.unread = true
	}
	r.mu.Unlock()
	r.log.Error().Str("result", result).Err(err).Msg("config reload rejected; the running config stays")
}

// status is the reload state for GET /admin/status.
func (r *reloader) status() any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// close stops watching and waits for a reload in progress.
func (r *reloader) close() {
	r.cancel()
	<-r.done
	signal.Stop(r.hup)
	if r.watcher != nil {
		_ = r.watcher.Close()
	}
}

// restartNeeded names the settings that differ between the running config and
// a new one but are only read at start-up: every section but keys, and the
// engine-wide refresh bounds. Sections added later are covered as well.
func restartNeeded(old, next *config.Config) []string {
	var out []string
	a, b := reflect.ValueOf(*old), reflect.ValueOf(*next)
	for i := range a.NumField() {
		if !a.Type().Field(i).IsExported() {
			continue
		}
		name := tagName(a.Type().Field(i))
		switch name {
		case "keys", "-":
			continue
		case "refresh":
			ra, rb := a.Field(i), b.Field(i)
			for j := range ra.NumField() {
				sub := tagName(ra.Type().Field(j))
				if restartOnly[sub] && !reflect.DeepEqual(ra.Field(j).Interface(), rb.Field(j).Interface()) {
					out = append(out, "refresh."+sub)
				}
			}
			continue
		}
		if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			out = append(out, name)
		}
	}
	return out
}

func tagName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
	if name == "" {
		return strings.ToLower(f.Name)
	}
	return name
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

type reloadMetrics struct {
	reloads         *prometheus.CounterVec
	lastSuccess     prometheus.Gauge
	lastSuccessTime prometheus.Gauge
	restartRequired prometheus.Gauge
}

func newReloadMetrics(reg prometheus.Registerer) *reloadMetrics {
	m := &reloadMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_config_reloads_total",
			Help: "Config reloads by result: ok, invalid (rejected by validation), unreadable (the file could not be read: missing, deleted mid-write, no permission) or error (could not be applied).",
		}, []string{"result"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_config_last_reload_success",
			Help: "1 if the last config reload (or the start-up load) succeeded, 0 if it was rejected.",
		}),
		lastSuccessTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful config load or reload.",
		}),
		restartRequired: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_config_restart_required",
			Help: "1 if the applied config changed settings that only a restart applies.",
		}),
	}
	for _, r := range []string{"ok", "invalid", "unreadable", "error"} {
		m.reloads.WithLabelValues(r)
	}
	reg.MustRegister(m.reloads, m.lastSuccess, m.lastSuccessTime, m.restartRequired)
	return m
}
