package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/jobs"
	httpsrc "github.com/hearth-dev/hearth/sources/http"
	"github.com/hearth-dev/hearth/warmer"
)

// failingSchedule is the real scheduler whose next update fails before it
// changes anything, as the second half of a reload.
type failingSchedule struct {
	*jobs.Scheduler
	fail atomic.Bool
	// during, if set, runs inside a failing update: after the warmer's swap,
	// before its undo.
	during func()
}

func (f *failingSchedule) Apply(specs []*warmer.Spec) (warmer.Changes, error) {
	if f.fail.Load() {
		if f.during != nil {
			f.during()
		}
		return warmer.Changes{}, errors.New("injected schedule failure")
	}
	return f.Scheduler.Apply(specs)
}

// TestReloadFailingHalfWayKeepsOldConfig: when the warmer took the new
// declarations but the schedule cannot follow, the reload is rejected and the
// warmer gets the old declarations back, so both match the old config and its
// keys keep refreshing; the same file applies once the schedule can follow.
func TestReloadFailingHalfWayKeepsOldConfig(t *testing.T) {
	env := testenv.Redis(t)
	var loadsA atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/a" {
			loadsA.Add(1)
		}
		fmt.Fprintf(w, "value of %s", r.URL.Path)
	}))
	defer origin.Close()
	doc := func(keys string) []byte {
		return fmt.Appendf(nil, "sources:\n  - {name: up, type: http, base_url: %q, timeout: 1s}\nkeys:\n%s", origin.URL, keys)
	}
	oldDoc := doc(fmt.Sprintf("  - {name: a, key: \"%sa\", ttl: 10s, interval: 200ms, source: up, path: /a}\n", env.Prefix))
	newDoc := doc(fmt.Sprintf("  - {name: c, key: \"%sc\", ttl: 10s, interval: 200ms, source: up, path: /c}\n", env.Prefix))
	path := filepath.Join(t.TempDir(), "hearth.yaml")
	if err := os.WriteFile(path, oldDoc, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(path, oldDoc)
	if err != nil {
		t.Fatal(err)
	}
	src, err := httpsrc.New(httpsrc.Config{Name: "up", BaseURL: origin.URL, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	w, err := warmer.New(warmer.Options{
		Store: &warmer.RedisStore{Client: env.Client}, Sources: map[string]warmer.Source{"up": src},
		Specs: cfg.Specs(), Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	sched, err := jobs.New(jobs.Options{Refresher: w, Specs: cfg.Specs()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := sched.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sched.Close(ctx) })
	fs := &failingSchedule{Scheduler: sched}
	r := newReloader(cfg, make(chan os.Signal, 1), w, fs, reg, zerolog.Nop())

	names := func() []string {
		var out []string
		for _, s := range w.Specs() {
			out = append(out, s.Name)
		}
		return out
	}
	if err := os.WriteFile(path, newDoc, 0o600); err != nil {
		t.Fatal(err)
	}
	fs.fail.Store(true)
	r.reload()
	if got := testutil.ToFloat64(r.metrics.reloads.WithLabelValues("error")); got != 1 {
		t.Errorf("reloads{result=error} = %v, want 1", got)
	}
	if got := names(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("warmer declarations after a failed reload = %v, want the old [a]", got)
	}
	if got := sched.Jobs(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("scheduled after a failed reload = %v, want the old [a]", got)
	}
	want := `# HELP hearth_refresh_interval_seconds Configured refresh interval of a declaration.
# TYPE hearth_refresh_interval_seconds gauge
hearth_refresh_interval_seconds{family="a"} 0.2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "hearth_refresh_interval_seconds"); err != nil {
		t.Errorf("published schedule after a failed reload: %v", err)
	}
	// a keeps refreshing: its runs find it in the warmer.
	before := loadsA.Load()
	testenv.Eventually(t, 10*time.Second, "a refreshed after the failed reload", func() bool { return loadsA.Load() >= before+2 })

	fs.fail.Store(false)
	r.reload()
	if got := testutil.ToFloat64(r.metrics.reloads.WithLabelValues("ok")); got != 1 {
		t.Errorf("reloads{result=ok} = %v, want 1", got)
	}
	if got := names(); !slices.Equal(got, []string{"c"}) {
		t.Errorf("warmer declarations after the reload = %v, want [c]", got)
	}
	if got := sched.Jobs(); !slices.Equal(got, []string{"c"}) {
		t.Errorf("scheduled after the reload = %v, want [c]", got)
	}
}

// TestReloadRolledBackRunsNoNewDeclaration: a refresh that starts while a
// reload may still be rolled back (after the warmer's swap, before its undo)
// waits, then runs the old declaration: the origin never sees the path of the
// new declaration that was rolled back.
func TestReloadRolledBackRunsNoNewDeclaration(t *testing.T) {
	env := testenv.Redis(t)
	var loadsOld, loadsNew atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/a":
			loadsOld.Add(1)
		case "/a-new":
			loadsNew.Add(1)
		}
		fmt.Fprintf(w, "value of %s", r.URL.Path)
	}))
	defer origin.Close()
	doc := func(path string) []byte {
		return fmt.Appendf(nil, "sources:\n  - {name: up, type: http, base_url: %q, timeout: 1s}\nkeys:\n"+
			"  - {name: a, key: \"%sa\", ttl: 1h, source: up, path: %s}\n", origin.URL, env.Prefix, path)
	}
	path := filepath.Join(t.TempDir(), "hearth.yaml")
	if err := os.WriteFile(path, doc("/a"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(path, doc("/a"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := httpsrc.New(httpsrc.Config{Name: "up", BaseURL: origin.URL, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	w, err := warmer.New(warmer.Options{
		Store: &warmer.RedisStore{Client: env.Client}, Sources: map[string]warmer.Source{"up": src},
		Specs: cfg.Specs(), Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Not opened: nothing but the refresh below loads.
	sched, err := jobs.New(jobs.Options{Refresher: w, Specs: cfg.Specs()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	type result struct {
		out warmer.Outcome
		err error
	}
	started := make(chan result, 1)
	fs := &failingSchedule{Scheduler: sched}
	fs.fail.Store(true)
	fs.during = func() {
		go func() {
			out, err := w.Refresh(ctx, "a", warmer.RunOptions{})
			started <- result{out, err}
		}()
		// Long enough for the refresh to load, had it not waited.
		select {
		case r := <-started:
			started <- r
		case <-time.After(time.Second):
		}
	}
	r := newReloader(cfg, make(chan os.Signal, 1), w, fs, reg, zerolog.Nop())
	if err := os.WriteFile(path, doc("/a-new"), 0o600); err != nil {
		t.Fatal(err)
	}
	r.reload()
	if got := testutil.ToFloat64(r.metrics.reloads.WithLabelValues("error")); got != 1 {
		t.Fatalf("reloads{result=error} = %v, want 1", got)
	}
	res := <-started
	if res.err != nil || res.out.Written != 1 {
		t.Errorf("the refresh started during the reload = %+v, %v; want one key written", res.out, res.err)
	}
	if n := loadsNew.Load(); n != 0 {
		t.Errorf("the origin was asked %d times for /a-new, the path of a declaration that was rolled back", n)
	}
	if n := loadsOld.Load(); n != 1 {
		t.Errorf("the origin was asked %d times for /a, want 1 (the refresh, with the old declaration)", n)
	}
	if got := env.Client.Get(ctx, env.Prefix+"a").Val(); got != "value of /a" {
		t.Errorf("%sa = %q, want the old declaration's value", env.Prefix, got)
	}
}
