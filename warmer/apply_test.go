package warmer_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/internal/testenv"
	httpsrc "github.com/hearth-dev/hearth/sources/http"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// applyRedis is the shared Redis with a key prefix of the test's own.
func applyRedis(t *testing.T) (redis.UniversalClient, string) {
	t.Helper()
	env := testenv.Redis(t)
	return env.Client, env.Prefix
}

// specs parses a keys: section against one http source named "up".
func specs(t *testing.T, upstream, keys string) []*warmer.Spec {
	t.Helper()
	doc := fmt.Sprintf("sources:\n  - {name: up, type: http, base_url: %q, timeout: 1s}\nkeys:\n%s", upstream, keys)
	cfg, err := config.Parse("test.yaml", []byte(doc))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg.Specs()
}

func TestApply(t *testing.T) {
	rdb, p := applyRedis(t)
	var calls atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		fmt.Fprintf(w, "value of %s", r.URL.Path)
	}))
	defer origin.Close()
	src, err := httpsrc.New(httpsrc.Config{Name: "up", BaseURL: origin.URL, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	first := specs(t, origin.URL, fmt.Sprintf(`
  - {name: a, key: "%[1]sa", ttl: 1h, source: up, path: /a}
  - {name: b, key: "%[1]sb:{id}", ttl: 1h, source: up, path: "/b/{id}", members: ["1", "2"]}
`, p))
	reg := prometheus.NewRegistry()
	w, err := warmer.New(warmer.Options{
		Store: &store.RedisStore{Client: rdb}, Sources: map[string]warmer.Source{"up": src},
		Specs: first, Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := w.RefreshAll(ctx); err != nil {
		t.Fatal(err)
	}
	lastA := status(t, w, "a").LastOK

	t.Run("add, remove, change", func(t *testing.T) {
		ch, err := w.Apply(specs(t, origin.URL, fmt.Sprintf(`
  - {name: a, key: "%[1]sa", ttl: 2h, source: up, path: /a}
  - {name: c, key: "%[1]sc", ttl: 1h, source: up, path: /c}
`, p)))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := fmt.Sprint(ch.Added, ch.Removed, ch.Changed), "[c] [b] [a]"; got != want {
			t.Errorf("added, removed, changed = %s, want %s", got, want)
		}
		if got, want := names(w.Status()), "a,c"; got != want {
			t.Errorf("declarations = %s, want %s", got, want)
		}
		if got := status(t, w, "a").LastOK; !got.Equal(lastA) {
			t.Errorf("a's last success = %v after the reload, want it kept (%v)", got, lastA)
		}
		if _, err := w.Refresh(ctx, "b", warmer.RunOptions{}); !errors.Is(err, warmer.ErrUnknownSpec) {
			t.Errorf("refresh of removed b: err = %v, want ErrUnknownSpec", err)
		}
		if n := rdb.Exists(ctx, p+"b:1", p+"b:2").Val(); n != 2 {
			t.Errorf("%d of b's 2 keys left in Redis, want both (a reload never deletes warm keys)", n)
		}
		if _, err := w.Refresh(ctx, "c", warmer.RunOptions{}); err != nil {
			t.Fatalf("refresh of added c: %v", err)
		}
		if got, want := rdb.Get(ctx, p+"c").Val(), "value of /c"; got != want {
			t.Errorf("c = %q, want %q", got, want)
		}
		if _, err := w.Refresh(ctx, "a", warmer.RunOptions{}); err != nil {
			t.Fatal(err)
		}
		if ttl := rdb.PTTL(ctx, p+"a").Val(); ttl <= time.Hour+30*time.Minute {
			t.Errorf("a's TTL after the reload = %s, want the new ttl 2h ± jitter", ttl)
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(ttlAC), "hearth_key_ttl_seconds"); err != nil {
			t.Errorf("a's new ttl, c's ttl: %v", err)
		}
		// a and c: removed b has none, or the stale-key alert would fire for it.
		if n, err := testutil.GatherAndCount(reg, "hearth_last_success_timestamp_seconds"); err != nil || n != 2 {
			t.Errorf("last-success series = %d (%v), want 2 (a, c)", n, err)
		}
	})

	t.Run("unchanged", func(t *testing.T) {
		ch, err := w.Apply(w.Specs())
		if err != nil || !ch.Empty() {
			t.Errorf("Apply(same) = %+v, %v; want no change", ch, err)
		}
	})

	t.Run("unknown source rejected whole", func(t *testing.T) {
		bad := append(w.Specs(), &warmer.Spec{Name: "d", Source: "nope"})
		if _, err := w.Apply(bad); !errors.Is(err, warmer.ErrSourceAbsent) || !strings.Contains(err.Error(), `"d"`) {
			t.Errorf("err = %v, want ErrSourceAbsent naming d", err)
		}
		if got, want := names(w.Status()), "a,c"; got != want {
			t.Errorf("declarations after a rejected apply = %s, want %s unchanged", got, want)
		}
	})

	t.Run("declared is not in force until used", func(t *testing.T) {
		lastC := status(t, w, "c").LastOK
		if lastC.IsZero() {
			t.Fatal("c has no last success to keep")
		}
		if _, err := w.Declare(append(w.Specs(), w.Specs()[0])); err == nil || !strings.Contains(err.Error(), `"a" twice`) {
			t.Errorf("Declare with a twice = %v, want an error naming a", err)
		}
		d, err := w.Declare(specs(t, origin.URL, fmt.Sprintf(`
  - {name: a, key: "%[1]sa", ttl: 3h, source: up, path: /a}
  - {name: c, key: "%[1]sc", ttl: 1h, source: up, path: /c}
  - {name: d, key: "%[1]sd", ttl: 1h, source: up, path: /d}
`, p)))
		if err != nil {
			t.Fatal(err)
		}
		// Checked, not in force: the warmer and its metrics are as they were.
		if got, want := names(w.Status()), "a,c"; got != want {
			t.Errorf("declarations before Use = %s, want %s", got, want)
		}
		if _, err := w.Refresh(ctx, "d", warmer.RunOptions{}); !errors.Is(err, warmer.ErrUnknownSpec) {
			t.Errorf("refresh of d before Use: err = %v, want ErrUnknownSpec", err)
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(ttlAC), "hearth_key_ttl_seconds"); err != nil {
			t.Errorf("ttl before Use: %v", err)
		}
		ch := w.Use(d)
		if got, want := fmt.Sprint(ch.Added, ch.Removed, ch.Changed), "[d] [] [a]"; got != want {
			t.Errorf("added, removed, changed = %s, want %s", got, want)
		}
		if got, want := names(w.Status()), "a,c,d"; got != want {
			t.Errorf("declarations after Use = %s, want %s", got, want)
		}
		if got := status(t, w, "c").LastOK; !got.Equal(lastC) {
			t.Errorf("c's last success = %v after Use, want it kept (%v)", got, lastC)
		}
		if _, err := w.Refresh(ctx, "d", warmer.RunOptions{}); err != nil {
			t.Errorf("refresh of d after Use: %v", err)
		}
		// Back to a (2h) and c for the next subtests.
		if _, err := w.Apply(specs(t, origin.URL, fmt.Sprintf(`
  - {name: a, key: "%[1]sa", ttl: 2h, source: up, path: /a}
  - {name: c, key: "%[1]sc", ttl: 1h, source: up, path: /c}
`, p))); err != nil {
			t.Fatal(err)
		}
		if err := testutil.GatherAndCompare(reg, strings.NewReader(ttlAC), "hearth_key_ttl_seconds"); err != nil {
			t.Errorf("ttl after removing d: %v", err)
		}
	})

	t.Run("concurrent with refreshes", func(t *testing.T) {
		one := specs(t, origin.URL, fmt.Sprintf("  - {name: a, key: \"%sa\", ttl: 1h, source: up, path: /a}\n", p))
		two := w.Specs()
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					_ = w.RefreshAll(ctx)
					_ = w.Status()
				}
			})
		}
		for i := range 50 {
			set := one
			if i%2 == 1 {
				set = two
			}
			if _, err := w.Apply(set); err != nil {
				t.Error(err)
			}
		}
		close(stop)
		wg.Wait()
	})
}

func status(t *testing.T, w *warmer.Warmer, name string) warmer.Status {
	t.Helper()
	for _, s := range w.Status() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no status for %s", name)
	return warmer.Status{}
}

func names(ss []warmer.Status) string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Name)
	}
	return strings.Join(out, ",")
}

// ttlAC is hearth_key_ttl_seconds once a has ttl 2h and c 1h.
const ttlAC = `# HELP hearth_key_ttl_seconds Configured TTL (before jitter) of the keys of a declaration.
# TYPE hearth_key_ttl_seconds gauge
hearth_key_ttl_seconds{family="a"} 7200
hearth_key_ttl_seconds{family="c"} 3600
`
