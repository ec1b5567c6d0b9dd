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
	"sync"
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
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// reloadRig is a reloader over a real warmer and an opened scheduler, with a
// listener that records every snapshot it is given.
type reloadRig struct {
	path  string
	doc   func(keys string) []byte
	w     *warmer.Warmer
	sched *jobs.Scheduler
	r     *reloader
	reg   *prometheus.Registry
	env   *testenv.RedisEnv

	mu    sync.Mutex
	heard [][]string
	// loads counts the origin's requests by path; hold, when set, blocks them.
	loads sync.Map
	hold  atomic.Pointer[chan struct{}]
}

func newReloadRig(t *testing.T, keys string) *reloadRig {
	t.Helper()
	g := &reloadRig{env: testenv.Redis(t)}
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := g.loads.LoadOrStore(r.URL.Path, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if h := g.hold.Load(); h != nil {
			<-*h
		}
		fmt.Fprintf(w, "value of %s", r.URL.Path)
	}))
	t.Cleanup(origin.Close)
	g.doc = func(keys string) []byte {
		return fmt.Appendf(nil, "sources:\n  - {name: up, type: http, base_url: %q, timeout: 5s}\nkeys:\n%s",
			origin.URL, strings.ReplaceAll(keys, "PREFIX", g.env.Prefix))
	}
	g.path = filepath.Join(t.TempDir(), "hearth.yaml")
	g.write(t, keys)
	cfg, err := config.Parse(g.path, g.doc(keys))
	if err != nil {
		t.Fatal(err)
	}
	src, err := httpsrc.New(httpsrc.Config{Name: "up", BaseURL: origin.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	g.reg = prometheus.NewRegistry()
	g.w, err = warmer.New(warmer.Options{
		Store: &store.RedisStore{Client: g.env.Client}, Sources: map[string]warmer.Source{"up": src},
		Specs: cfg.Specs(), Registerer: g.reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	g.sched, err = jobs.New(jobs.Options{Refresher: g.w, Specs: cfg.Specs()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := g.sched.Open(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.sched.Close(ctx) })
	g.r = newReloader(cfg, nil, g.w, g.reg, zerolog.Nop())
	g.r.subscribe(func(s *snapshot) { g.sched.Apply(s.specs()) })
	g.r.subscribe(func(s *snapshot) {
		var names []string
		for _, spec := range s.specs() {
			names = append(names, spec.Name)
		}
		g.mu.Lock()
		g.heard = append(g.heard, names)
		g.mu.Unlock()
	})
	return g
}

func (g *reloadRig) write(t *testing.T, keys string) {
	t.Helper()
	if err := os.WriteFile(g.path, g.doc(keys), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (g *reloadRig) loadsOf(path string) int64 {
	n, ok := g.loads.Load(path)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

// seen is what the warmer, the scheduler and the listener run: each sorted.
func (g *reloadRig) seen() (warm, sched, heard []string) {
	for _, s := range g.w.Specs() {
		warm = append(warm, s.Name)
	}
	sched = g.sched.Jobs()
	slices.Sort(sched)
	g.mu.Lock()
	if len(g.heard) > 0 {
		heard = g.heard[len(g.heard)-1]
	}
	g.mu.Unlock()
	return warm, sched, heard
}

const twoKeys = `  - {name: a, key: "PREFIXa", ttl: 10s, interval: 200ms, source: up, path: /a}
  - {name: b, key: "PREFIXb", ttl: 1h, source: up, path: /b}
`

// TestReloadRejectedChangesNothing: a file that does not validate, or that
// the running daemon cannot take (a declaration on a source added since
// start-up), is rejected before the swap: the warmer, the schedule and the
// change listeners keep the running declarations, which keep refreshing.
func TestReloadRejectedChangesNothing(t *testing.T) {
	g := newReloadRig(t, twoKeys)
	for _, tc := range []struct {
		name, result, keys string
	}{
		{"invalid", "invalid", twoKeys + "  - {name: c, key: \"PREFIXc\", ttl: sixty, source: up, path: /c}\n"},
		{"new source", "error", twoKeys + "  - {name: c, key: \"PREFIXc\", ttl: 1h, source: other, path: /c}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := g.doc(tc.keys)
			if tc.result == "error" { // the source is new: only a restart opens it
				doc = []byte(strings.Replace(string(doc), "sources:\n", "sources:\n  - {name: other, type: http, base_url: \"http://127.0.0.1:1\", timeout: 1s}\n", 1))
			}
			if err := os.WriteFile(g.path, doc, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := g.r.reload()
			if err == nil {
				t.Fatal("reload accepted the file")
			}
			var ce *config.Error
			if tc.result == "invalid" && (!errors.As(err, &ce) || !strings.Contains(err.Error(), "keys[c].ttl")) {
				t.Errorf("reload error = %v, want a *config.Error naming keys[c].ttl", err)
			}
			if tc.result == "error" && !errors.Is(err, warmer.ErrSourceAbsent) {
				t.Errorf("reload error = %v, want ErrSourceAbsent", err)
			}
			if got := testutil.ToFloat64(g.r.metrics.reloads.WithLabelValues(tc.result)); got != 1 {
				t.Errorf("reloads{result=%s} = %v, want 1", tc.result, got)
			}
			warm, sched, heard := g.seen()
			if want := []string{"a", "b"}; !slices.Equal(warm, want) || !slices.Equal(sched, want) || heard != nil {
				t.Errorf("after a rejected reload: warmer %v, schedule %v, listeners %v; want %v, %v and no call", warm, sched, heard, want, want)
			}
			before := g.loadsOf("/a")
			testenv.Eventually(t, 10*time.Second, "a refreshed after the rejected reload", func() bool { return g.loadsOf("/a") >= before+2 })
		})
	}
	want := `# HELP hearth_refresh_interval_seconds Configured refresh interval of a declaration.
# TYPE hearth_refresh_interval_seconds gauge
hearth_refresh_interval_seconds{family="a"} 0.2
hearth_refresh_interval_seconds{family="b"} 1800
`
	if err := testutil.GatherAndCompare(g.reg, strings.NewReader(want), "hearth_refresh_interval_seconds"); err != nil {
		t.Errorf("published schedule after the rejected reloads: %v", err)
	}
}

// TestReloadReachesEveryone: a reload that adds, removes and changes
// declarations is what the warmer, the schedule and the change listeners all
// run afterwards, and its answer names each change.
func TestReloadReachesEveryone(t *testing.T) {
	g := newReloadRig(t, twoKeys)
	g.write(t, `  - {name: a, key: "PREFIXa", ttl: 10s, interval: 300ms, source: up, path: /a}
  - {name: c, key: "PREFIXc", ttl: 1h, source: up, path: /c}
`)
	res, err := g.r.reload()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(res.Added, res.Removed, res.Changed), "[c] [b] [a]"; got != want {
		t.Errorf("added, removed, changed = %s, want %s", got, want)
	}
	warm, sched, heard := g.seen()
	if want := []string{"a", "c"}; !slices.Equal(warm, want) || !slices.Equal(sched, want) || !slices.Equal(heard, want) {
		t.Errorf("after the reload: warmer %v, schedule %v, listeners %v; want %v each", warm, sched, heard, want)
	}
	if spec, _ := g.w.Spec("a"); spec.Interval != 300*time.Millisecond {
		t.Errorf("a's interval in the warmer = %s, want the new 300ms", spec.Interval)
	}
	// c is new: scheduled at once, it loads from the origin.
	testenv.Eventually(t, 10*time.Second, "added c loaded", func() bool { return g.loadsOf("/c") >= 1 })
	if _, err := g.w.Refresh(context.Background(), "b", warmer.RunOptions{}); !errors.Is(err, warmer.ErrUnknownSpec) {
		t.Errorf("refresh of removed b: %v, want ErrUnknownSpec", err)
	}
	if got := testutil.ToFloat64(g.r.metrics.reloads.WithLabelValues("ok")); got != 1 {
		t.Errorf("reloads{result=ok} = %v, want 1", got)
	}

	// Reloads from every trigger at once are taken one at a time: each sees
	// the one before, and all but the first find nothing to change.
	var wg sync.WaitGroup
	var changed atomic.Int64
	for range 8 {
		wg.Go(func() {
			res, err := g.r.reload()
			if err != nil {
				t.Error(err)
			}
			if !res.Empty() {
				changed.Add(1)
			}
		})
	}
	wg.Wait()
	if n := changed.Load(); n != 0 {
		t.Errorf("%d of 8 reloads of the same file changed something, want none", n)
	}
}

// TestReloadRemovesInFlight: a refresh of a declaration running when a reload
// removes it finishes with the declaration it started with, harmlessly; the
// next one is refused, and the schedule no longer runs it.
func TestReloadRemovesInFlight(t *testing.T) {
	g := newReloadRig(t, `  - {name: a, key: "PREFIXa", ttl: 1h, source: up, path: /a}
  - {name: b, key: "PREFIXb", ttl: 1h, source: up, path: /b}
`)
	release := make(chan struct{})
	g.hold.Store(&release)
	ctx := context.Background()
	type result struct {
		out warmer.Outcome
		err error
	}
	done := make(chan result, 1)
	before := g.loadsOf("/a")
	go func() {
		out, err := g.w.Refresh(ctx, "a", warmer.RunOptions{})
		done <- result{out, err}
	}()
	testenv.Eventually(t, 10*time.Second, "the refresh of a reached the origin", func() bool { return g.loadsOf("/a") > before })
	g.write(t, `  - {name: b, key: "PREFIXb", ttl: 1h, source: up, path: /b}
`)
	if _, err := g.r.reload(); err != nil {
		t.Fatal(err)
	}
	g.hold.Store(nil)
	close(release)
	select {
	case res := <-done:
		if res.err != nil || res.out.Written != 1 {
			t.Errorf("the refresh in flight = %+v, %v; want it finished, one key written", res.out, res.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the refresh in flight never finished")
	}
	if _, err := g.w.Refresh(ctx, "a", warmer.RunOptions{}); !errors.Is(err, warmer.ErrUnknownSpec) {
		t.Errorf("refresh of removed a: %v, want ErrUnknownSpec", err)
	}
	if _, ok := g.sched.NextRun("a"); ok {
		t.Error("removed a is still scheduled")
	}
}
