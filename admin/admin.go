// Package admin is Hearth's authenticated admin API (/admin/): refresh a
// declaration or one key now, the status of every declaration, pre-warm, and
// reload the config file.
// It sees the engine through small interfaces, and is mounted by the daemon.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/rs/zerolog"
	"golang.org/x/sync/singleflight"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/prewarm"
	"github.com/hearth-dev/hearth/warmer"
)

// ErrClosed refuses work once the admin API, or what it drives, is shutting
// down: 503.
var ErrClosed = errors.New("shutting down")

// ErrInvalid marks a request the engine refused as it stands (a pre-warm
// source that does not parse or does not answer): 422 with the message.
var ErrInvalid = errors.New("invalid request")

// NextRunner tells when a declaration runs next (the jobs.Scheduler).
type NextRunner interface {
	NextRun(name string) (time.Time, bool)
}

// Warmer is the engine as the admin API sees it (a *warmer.Warmer).
type Warmer interface {
	Spec(name string) (*warmer.Spec, bool)
	Refresh(ctx context.Context, name string, ro warmer.RunOptions) (warmer.Outcome, error)
	RefreshMembers(ctx context.Context, name string, members []string) (warmer.Outcome, error)
	Status() []warmer.Status
}

// Prewarmer runs the daemon's pre-warms (the start-up one, re-warms, the
// admin API's), one at a time, and tells their state.
type Prewarmer interface {
	// Start begins one pre-warm of the daemon's own Redis in the
	// background, or returns prewarm.ErrBusy while any pre-warm runs; its
	// report arrives on the channel.
	Start(ctx context.Context, req PrewarmRequest) (<-chan prewarm.Report, error)
	// Status is the running pre-warm's progress and the last report, shared
	// by every path.
	Status() prewarm.Status
}

// Options are what the admin API needs.
type Options struct {
	// Token is the bearer token every request must carry; it must not be empty.
	Token  string
	Warmer Warmer
	// Leading reports whether this instance may write; nil means always (no
	// leadership configured).
	Leading func() bool
	// Prewarm runs POST /admin/prewarm and answers GET. Nil: the pre-warm
	// routes answer 501.
	Prewarm    Prewarmer
	Registerer prometheus.Registerer
	Logger     zerolog.Logger
}

// API serves the authenticated /admin/ routes: refresh a declaration or one
// key now, the status of every declaration, and pre-warm.
type API struct {
	tokenHash [sha256.Size]byte
	w         Warmer
	mux       *http.ServeMux
	group     singleflight.Group
	metrics   *adminMetrics
	log       zerolog.Logger
	leading   func() bool
	prewarm   Prewarmer

	// base bounds loads and pre-warms: they outlive the request that started
	// them (other requests share them) but not the daemon.
	base   context.Context
	cancel context.CancelFunc

	mu    sync.Mutex
	sched NextRunner
	// reloadStatus, if set, adds the config reload state to /admin/status.
	reloadStatus func() any
	// reload, if set, reloads the config file (POST /admin/reload).
	reload func() (ReloadResult, error)
	closed bool
	wg     sync.WaitGroup
}

// PrewarmRequest is the body POST /admin/prewarm may carry (none: load from
// the origin as the start-up pre-warm does): copy the wanted keys from the
// Redis From (what `hearth prewarm --from` takes), loading only those it
// cannot give from the origin, or none with FromOnly.
type PrewarmRequest struct {
	From     string `json:"from"`
	FromOnly bool   `json:"from_only"`
}

// maxPrewarmBody bounds POST /admin/prewarm's body.
const maxPrewarmBody = 64 << 10

// prewarmState is the running pre-warm, whoever started it, or else the last
// one finished: GET /admin/prewarm and the answers of POST.
type prewarmState struct {
	Running  bool              `json:"running"`
	Reason   string            `json:"reason,omitempty"`
	Started  *time.Time        `json:"started,omitempty"`
	Finished *time.Time        `json:"finished,omitempty"`
	Report   *prewarm.Report   `json:"report,omitempty"`
	Progress *prewarm.Progress `json:"progress,omitempty"`
	Error    string            `json:"error,omitempty"`
}

// prewarmStateOf reads the pre-warm state.
func prewarmStateOf(st prewarm.Status) prewarmState {
	if cur := st.Current; cur.Running {
		started := cur.Started
		return prewarmState{Running: true, Reason: cur.Reason, Started: &started, Progress: &cur}
	}
	if st.Last == nil {
		return prewarmState{}
	}
	last := st.Last
	out := prewarmState{Reason: last.Reason, Report: last, Error: last.Error}
	if !last.Started.IsZero() {
		started, finished := last.Started, last.Started.Add(last.Duration)
		out.Started, out.Finished = &started, &finished
	}
	return out
}

// New builds the admin API; Close stops it.
func New(opts Options) *API {
	base, cancel := context.WithCancel(context.Background())
	a := &API{
		tokenHash: sha256.Sum256([]byte(opts.Token)),
		w:         opts.Warmer,
		mux:       http.NewServeMux(),
		metrics:   newAdminMetrics(opts.Registerer),
		log:       opts.Logger.With().Str("component", "admin").Logger(),
		leading:   opts.Leading,
		prewarm:   opts.Prewarm,
		base:      base,
		cancel:    cancel,
	}
	a.mux.HandleFunc("POST /admin/refresh", a.refresh)
	a.mux.HandleFunc("GET /admin/status", a.status)
	a.mux.HandleFunc("POST /admin/prewarm", a.startPrewarm)
	a.mux.HandleFunc("GET /admin/prewarm", a.prewarmStatus)
	a.mux.HandleFunc("POST /admin/reload", a.reloadNow)
	return a
}

// Attach makes next runs and the config reload state (reloadStatus, if not
// nil) visible in /admin/status once jobs are scheduled, and POST
// /admin/reload call reload once the reloader runs (until then it answers
// 503). A nil API (no token) ignores it.
func (a *API) Attach(s NextRunner, reloadStatus func() any, reload func() (ReloadResult, error)) {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.sched, a.reloadStatus, a.reload = s, reloadStatus, reload
	a.mu.Unlock()
}

// ServeHTTP checks the bearer token before anything else, so that without it no
// route, declaration or state can be probed: every failure is the same 401.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !a.authorized(r) {
		a.metrics.requests.WithLabelValues(route(r), "401").Inc()
		w.Header().Set("WWW-Authenticate", `Bearer realm="hearth"`)
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
	a.mux.ServeHTTP(rec, r)
	a.metrics.requests.WithLabelValues(route(r), strconv.Itoa(rec.code)).Inc()
}

// authorized compares SHA-256 digests in constant time, so that neither the
// token's bytes nor its length leak through timing.
func (a *API) authorized(r *http.Request) bool {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	return subtle.ConstantTimeCompare(got[:], a.tokenHash[:]) == 1
}

// route is a bounded label for a request path.
func route(r *http.Request) string {
	switch r.URL.Path {
	case "/admin/refresh":
		return "refresh"
	case "/admin/status":
		return "status"
	case "/admin/prewarm":
		return "prewarm"
	case "/admin/reload":
		return "reload"
	default:
		return "other"
	}
}

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection's deadlines.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// adminAnswerSlack is how long past its load bound an admin refresh may take
// to answer.
const adminAnswerSlack = 5 * time.Second

// refreshResult is the answer to POST /admin/refresh.
type refreshResult struct {
	Declaration string `json:"declaration"`
	Member      string `json:"member,omitempty"`
	Key         string `json:"key"`
	Members     int    `json:"members"`
	Written     int    `json:"written"`
	Negative    int    `json:"negative"`
	Failed      int    `json:"failed"`
	Extended    int    `json:"extended"`
	Duration    string `json:"duration"`
	// Shared is true when this request joined a load another request started.
	Shared bool   `json:"shared"`
	Error  string `json:"error,omitempty"`
}

// refresh loads one declaration (or one member of a family) now. Concurrent
// requests for the same target share one load.
func (a *API) refresh(w http.ResponseWriter, r *http.Request) {
	name, member := r.URL.Query().Get("declaration"), r.URL.Query().Get("member")
	if name == "" {
		writeError(w, http.StatusBadRequest, "declaration: required (POST /admin/refresh?declaration=NAME[&member=M])")
		return
	}
	spec, ok := a.w.Spec(name)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("declaration %q: not declared", name))
		return
	}
	key := spec.Template.String()
	switch {
	case !spec.Template.IsFamily() && member != "":
		writeError(w, http.StatusBadRequest, fmt.Sprintf("declaration %q is a single key: member is not allowed", name))
		return
	case member != "":
		if err := spec.Template.ValidateMember(member); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("member of %q: %v", name, err))
			return
		}
		key = spec.Template.Key(member)
	}
	if a.leading != nil && !a.leading() {
		writeError(w, http.StatusServiceUnavailable, "not the leader: refresh on the leading instance")
		return
	}

	// The load may outlast the listener's read and write timeouts (a family's
	// run, bounded by its interval): this request's bounds are the load's. The
	// read deadline matters too: past it the server cancels the request.
	deadline := time.Now().Add(max(spec.Interval, spec.LoadTimeout) + adminAnswerSlack)
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(deadline)
	_ = rc.SetWriteDeadline(deadline)

	// NUL cannot appear in a declaration name or a valid member.
	flight := name + "\x00" + member
	if spec.Template.IsFamily() && member == "" {
		flight = name + "\x00*"
	}
	ch := a.group.DoChan(flight, func() (any, error) { return a.load(spec, member) })
	// Counted once joined: a test (or an operator) that sees N waiting knows all
	// N share the load in flight.
	a.metrics.waiting.Inc()
	defer a.metrics.waiting.Dec()
	select {
	case res := <-ch:
		out := refreshResult{Declaration: name, Member: member, Key: key, Shared: res.Shared}
		if o, ok := res.Val.(warmer.Outcome); ok {
			out.Members, out.Written, out.Negative = o.Members, o.Written, o.Negative
			out.Failed, out.Extended, out.Duration = o.Failed, o.Extended, o.Duration.Round(time.Microsecond).String()
		}
		code := http.StatusOK
		if res.Err != nil {
			out.Error = res.Err.Error()
			code = http.StatusBadGateway
			if errors.Is(res.Err, ErrClosed) {
				code = http.StatusServiceUnavailable
			}
		}
		writeJSON(w, code, out)
	case <-r.Context().Done():
		// The client left; the load goes on for the others.
	}
}

// load runs one refresh for the single-flight group. It holds the admin API open
// until it ends, never panics out (a panic in singleflight's DoChan would
// crash the daemon and leave the other waiters hanging), and is bounded by the
// declaration's interval: no manual refresh outlives a scheduled one.
func (a *API) load(spec *warmer.Spec, member string) (val any, err error) {
	if !a.enter() {
		return nil, ErrClosed
	}
	defer a.leave()
	defer func() {
		if p := recover(); p != nil {
			a.log.Error().Str("family", spec.Name).Interface("panic", p).Msg("admin refresh panicked")
			val, err = nil, fmt.Errorf("refresh %s: panic: %v", spec.Name, p)
		}
	}()
	ctx, cancel := context.WithTimeout(a.base, max(spec.Interval, spec.LoadTimeout))
	defer cancel()
	var o warmer.Outcome
	if spec.Template.IsFamily() && member == "" {
		o, err = a.w.Refresh(ctx, spec.Name, warmer.RunOptions{})
	} else {
		o, err = a.w.RefreshMembers(ctx, spec.Name, []string{member})
		o.Members = 1
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	a.metrics.loads.WithLabelValues(result).Inc()
	a.log.Info().Str("family", spec.Name).Bool("one_member", member != "").Int("written", o.Written).
		Int("failed", o.Failed).AnErr("error", err).Msg("admin refresh")
	return o, err
}

// declStatus is one declaration in GET /admin/status.
type declStatus struct {
	warmer.Status
	NextRun *time.Time `json:"next_run,omitempty"`
}

func (a *API) status(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	sched := a.sched
	a.mu.Unlock()
	out := struct {
		Leader       *bool        `json:"leader,omitempty"`
		Declarations []declStatus `json:"declarations"`
		Config       any          `json:"config,omitempty"`
	}{Declarations: []declStatus{}}
	if a.leading != nil {
		l := a.leading()
		out.Leader = &l
	}
	for _, s := range a.w.Status() {
		d := declStatus{Status: s}
		if sched != nil {
			if t, ok := sched.NextRun(s.Name); ok {
				d.NextRun = &t
			}
		}
		out.Declarations = append(out.Declarations, d)
	}
	a.mu.Lock()
	reloadStatus := a.reloadStatus
	a.mu.Unlock()
	if reloadStatus != nil {
		out.Config = reloadStatus()
	}
	writeJSON(w, http.StatusOK, out)
}

// startPrewarm starts a pre-warm in the background (it can take minutes) and
// answers 202 with its state, or 409 with the running one's while any pre-warm
// runs, whoever started it; GET /admin/prewarm follows it.
func (a *API) startPrewarm(w http.ResponseWriter, r *http.Request) {
	if a.prewarm == nil {
		writeError(w, http.StatusNotImplemented, "pre-warm not configured")
		return
	}
	var req PrewarmRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxPrewarmBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, "body: "+err.Error()+` (want {"from": "redis://…", "from_only": true} or none)`)
		return
	}
	if req.FromOnly && req.From == "" {
		writeError(w, http.StatusUnprocessableEntity, "from_only: needs from, the Redis to copy from")
		return
	}
	if a.leading != nil && !a.leading() {
		writeError(w, http.StatusServiceUnavailable, "not the leader: pre-warm on the leading instance")
		return
	}
	if !a.enter() {
		writeError(w, http.StatusServiceUnavailable, ErrClosed.Error())
		return
	}
	done, err := a.prewarm.Start(a.base, req)
	if err != nil {
		a.leave()
		code := http.StatusInternalServerError
		switch {
		case errors.Is(err, prewarm.ErrBusy):
			code = http.StatusConflict
		case errors.Is(err, ErrInvalid):
			writeError(w, http.StatusUnprocessableEntity, err.Error())
			return
		}
		st := prewarmStateOf(a.prewarm.Status())
		st.Error = err.Error()
		writeJSON(w, code, st)
		return
	}
	t0 := time.Now()
	go func() {
		defer a.leave()
		rep := <-done
		a.log.Info().Dur("took_ms", time.Since(t0)).Float64("coverage", rep.Coverage).Str("error", rep.Error).
			Msg("admin pre-warm finished")
	}()
	writeJSON(w, http.StatusAccepted, prewarmStateOf(a.prewarm.Status()))
}

func (a *API) prewarmStatus(w http.ResponseWriter, _ *http.Request) {
	if a.prewarm == nil {
		writeError(w, http.StatusNotImplemented, "pre-warm not configured")
		return
	}
	writeJSON(w, http.StatusOK, prewarmStateOf(a.prewarm.Status()))
}

// ReloadResult is what a reload changed, by declaration name, and the
// sections it left for a restart: the answer of POST /admin/reload.
type ReloadResult struct {
	Added           []string `json:"added"`
	Removed         []string `json:"removed"`
	Changed         []string `json:"changed"`
	RestartRequired []string `json:"restart_required"`
}

// reloadRejected is the answer of POST /admin/reload when the file was not
// applied: the error as `hearth validate` prints it, and each problem on its
// own (file:line: field: what is wrong).
type reloadRejected struct {
	Error    string   `json:"error"`
	Problems []string `json:"problems"`
}

// reloadNow reloads the config file: 200 with what changed, 422 with why the
// file was rejected (the running config stays), 503 while shutting down.
func (a *API) reloadNow(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	reload := a.reload
	a.mu.Unlock()
	if reload == nil {
		writeError(w, http.StatusServiceUnavailable, "reload not running yet")
		return
	}
	res, err := reload()
	switch {
	case errors.Is(err, ErrClosed):
		writeError(w, http.StatusServiceUnavailable, err.Error())
	case err != nil:
		out := reloadRejected{Error: err.Error(), Problems: []string{err.Error()}}
		var ce *config.Error
		if errors.As(err, &ce) {
			out.Problems = strings.Split(ce.Error(), "\n")
		}
		writeJSON(w, http.StatusUnprocessableEntity, out)
	default:
		for _, l := range []*[]string{&res.Added, &res.Removed, &res.Changed, &res.RestartRequired} {
			if *l == nil {
				*l = []string{}
			}
		}
		writeJSON(w, http.StatusOK, res)
	}
}

// enter registers a load, unless the admin API is closing.
func (a *API) enter() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	a.wg.Add(1)
	return true
}

func (a *API) leave() { a.wg.Done() }

// Close refuses new loads and waits for those running until ctx ends, then
// cancels them and waits for them to return. A nil API does nothing.
func (a *API) Close(ctx context.Context) error {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	done := make(chan struct{})
	go func() {
		a.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		a.cancel()
		return nil
	case <-ctx.Done():
		a.cancel()
		<-done
		return fmt.Errorf("admin: abandoned running loads: %w", context.Cause(ctx))
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

type adminMetrics struct {
	requests *prometheus.CounterVec
	loads    *prometheus.CounterVec
	waiting  prometheus.Gauge
}

func newAdminMetrics(reg prometheus.Registerer) *adminMetrics {
	f := promauto.With(reg)
	m := &adminMetrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_admin_requests_total",
			Help: "Admin API requests by route and HTTP status code.",
		}, []string{"route", "code"}),
		loads: f.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_admin_refresh_loads_total",
			Help: "Refreshes the admin API ran, by result; concurrent requests for the same target share one.",
		}, []string{"result"}),
		waiting: f.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_admin_refresh_waiting",
			Help: "Admin refresh requests waiting for a load in flight.",
		}),
	}
	return m
}
