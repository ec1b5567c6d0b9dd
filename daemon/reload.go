package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/warmer"
)

// reloadSettle is how long the config file must stay quiet before it is read:
// editors and ConfigMap updates touch it several times in a row.
const reloadSettle = 150 * time.Millisecond

// restartOnly are the refresh settings read once at start-up; every other
// refresh setting is a default that declarations inherit, applied on reload.
var restartOnly = map[string]bool{"max_concurrent_loads": true, "max_inflight_bytes": true, "spread": true, "shutdown_timeout": true}

// snapshot is one config as the daemon runs it: the config, its
// declarations checked against the running warmer, and the settings that
// differ from start-up but need a restart. It is built whole before anything
// sees it and never changed afterwards, so a reload swaps one pointer and
// never needs undoing.
type snapshot struct {
	cfg   *config.Config
	decl  *warmer.Declarations
	drift []string
}

func (s *snapshot) specs() []*warmer.Spec { return s.decl.Specs() }

// reloader re-reads the config on a reload signal and when its file changes:
// it builds and validates a new snapshot, swaps it in, and hands it to its
// subscribers (the warmer first, then the scheduler and the change listeners),
// without a restart: leadership, connections and warm keys stay. An invalid
// config is rejected as a whole before the swap, and the running one stays.
type reloader struct {
	path string
	// running is the file as it was at start-up, before command-line overrides,
	// so that only real edits count as needing a restart.
	running *config.Config
	w       *warmer.Warmer
	metrics *reloadMetrics
	log     zerolog.Logger
	hup     <-chan struct{}
	watcher *fsnotify.Watcher
	cancel  context.CancelFunc
	done    chan struct{}

	// cur is the snapshot in force; subs take each new one after the swap.
	cur  atomic.Pointer[snapshot]
	subs []func(*snapshot)
	// reloading serialises reloads (file events, signals, POST /admin/reload);
	// closed, under it, refuses them once the daemon stops.
	reloading sync.Mutex
	closed    bool

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

// reloaded is what one reload changed.
type reloaded struct {
	warmer.Changes
	RestartRequired []string
}

// errReloadClosed refuses a reload once the daemon is stopping.
var errReloadClosed = errors.New("reload: shutting down")

// newReloader builds the reloader of cfg's file, running w's declarations;
// hup (nil for none) asks for a reload. open starts watching, close stops it.
func newReloader(cfg *config.Config, hup <-chan struct{}, w *warmer.Warmer, reg prometheus.Registerer, log zerolog.Logger) *reloader {
	r := &reloader{
		path: cfg.File, running: cfg, w: w,
		metrics: newReloadMetrics(reg),
		log:     log.With().Str("component", "reload").Str("config", cfg.File).Logger(),
		hup:     hup, cancel: func() {}, done: make(chan struct{}),
		state: reloadState{File: cfg.File, LastReloadOK: true},
	}
	r.cur.Store(&snapshot{cfg: cfg, decl: w.Declarations()})
	r.subscribe(func(s *snapshot) { w.Use(s.decl) })
	return r
}

// subscribe adds f to what takes every new snapshot, in the order subscribed,
// once it is in force. Validation is over by then: f cannot refuse it.
func (r *reloader) subscribe(f func(*snapshot)) { r.subs = append(r.subs, f) }

// open remembers the file as it is now and starts watching it and the reload signal.
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
			_, _ = r.reload()
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
			_, _ = r.reload()
		}
	}
}

// reload builds a snapshot of the file, swaps it in and tells the
// subscribers, and returns what changed. It never leaves the daemon
// half-configured: a file that is unreadable or invalid changes nothing, and
// once a snapshot is built nothing can fail.
func (r *reloader) reload() (reloaded, error) {
	r.reloading.Lock()
	defer r.reloading.Unlock()
	if r.closed {
		return reloaded{}, errReloadClosed
	}
	next, result, err := r.build()
	if err != nil {
		r.failed(result, err)
		return reloaded{}, err
	}
	old := r.cur.Swap(next)
	for _, sub := range r.subs {
		sub(next)
	}
	ch := warmer.Diff(old.decl, next.decl)
	now := time.Now()
	r.metrics.reloads.WithLabelValues("ok").Inc()
	r.metrics.lastSuccess.Set(1)
	r.metrics.lastSuccessTime.Set(float64(now.UnixNano()) / 1e9)
	r.metrics.restartRequired.Set(boolGauge(len(next.drift) > 0))
	r.mu.Lock()
	r.state = reloadState{File: r.path, LastReload: &now, LastReloadOK: true, RestartRequired: next.drift}
	r.mu.Unlock()
	r.log.Info().Strs("added", ch.Added).Strs("removed", ch.Removed).Strs("changed", ch.Changed).
		Int("declarations", next.decl.Len()).Msg("config reloaded")
	if len(next.drift) > 0 {
		r.log.Warn().Strs("sections", next.drift).Msg("config changes that need a restart were NOT applied; restart to apply them")
	}
	return reloaded{Changes: ch, RestartRequired: next.drift}, nil
}

// build reads the file once (what is validated is what is remembered as
// applied) and makes a snapshot of it, or says why not and under which
// result of hearth_config_reloads_total.
func (r *reloader) build() (_ *snapshot, result string, _ error) {
	data, err := os.ReadFile(r.path)
	if err != nil {
		return nil, "unreadable", fmt.Errorf("read config: %w", err)
	}
	r.mu.Lock()
	r.content, r.unread = data, false
	r.mu.Unlock()
	cfg, err := config.Parse(r.path, data)
	if err != nil {
		return nil, "invalid", err
	}
	drift := restartNeeded(r.running, cfg)
	// A new redis.namespace applies only on restart; until then Hearth's own
	// keys stay under the one in use (every snapshot keeps it), and
	// declarations must keep out of it.
	if ns := r.cur.Load().cfg.Redis.Namespace; cfg.Redis.Namespace != ns {
		inUse := *cfg
		inUse.Redis.Namespace = ns
		if err := inUse.Validate(); err != nil {
			return nil, "invalid", fmt.Errorf("redis.namespace %q stays in use until a restart: %w", ns, err)
		}
		cfg = &inUse
	}
	decl, err := r.w.Declare(cfg.Specs())
	if errors.Is(err, warmer.ErrSourceAbsent) {
		return nil, "error", fmt.Errorf("apply: %w (adding a source needs a restart)", err)
	}
	if err != nil {
		return nil, "error", fmt.Errorf("apply: %w", err)
	}
	return &snapshot{cfg: cfg, decl: decl, drift: drift}, "", nil
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

// close stops watching, waits for a reload in progress and refuses later ones.
func (r *reloader) close() {
	r.cancel()
	<-r.done
	r.reloading.Lock()
	r.closed = true
	r.reloading.Unlock()
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
	f := promauto.With(reg)
	m := &reloadMetrics{
		reloads: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_config_reloads_total",
			Help: "Config reloads by result: ok, invalid (rejected by validation), unreadable (the file could not be read: missing, deleted mid-write, no permission) or error (could not be applied).",
		}, []string{"result"}),
		lastSuccess: f.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_config_last_reload_success",
			Help: "1 if the last config reload (or the start-up load) succeeded, 0 if it was rejected.",
		}),
		lastSuccessTime: f.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful config load or reload.",
		}),
		restartRequired: f.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_config_restart_required",
			Help: "1 if the applied config changed settings that only a restart applies.",
		}),
	}
	for _, r := range []string{"ok", "invalid", "unreadable", "error"} {
		m.reloads.WithLabelValues(r)
	}
	return m
}
