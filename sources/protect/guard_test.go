package protect_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hearth-dev/hearth/internal/origintest"
	"github.com/hearth-dev/hearth/internal/promtest"
	"github.com/hearth-dev/hearth/internal/sourcetest"
	"github.com/hearth-dev/hearth/sources/protect"
	"github.com/hearth-dev/hearth/warmer"
)

func byMember(rs []warmer.Result) map[string]warmer.Result {
	out := map[string]warmer.Result{}
	for _, r := range rs {
		out[r.Member] = r
	}
	return out
}

func TestGuardRetries(t *testing.T) {
	origintest.NoLeaks(t)
	t.Run("a 5xx member is retried alone until it answers", func(t *testing.T) {
		u := origintest.New(t, func(m string, n int) (int, string) {
			if m == "flaky" && n <= 2 {
				return http.StatusServiceUnavailable, "busy"
			}
			return http.StatusOK, "v-" + m
		})
		reg := prometheus.NewRegistry()
		g := protect.Guard(u.Source(t, 4), protect.GuardConfig{Name: "api", Retries: 2, RetryBackoff: 10 * time.Millisecond,
			RetryMaxBackoff: 20 * time.Millisecond, Metrics: protect.NewGuardMetrics(reg)})
		rs, err := g.Load(context.Background(), origintest.Spec(t, "p", "p:{id}", "/v/{id}"), []string{"ok", "flaky"})
		if err != nil {
			t.Fatal(err)
		}
		by := byMember(rs)
		if got, want := string(by["flaky"].Value), "v-flaky"; got != want || by["flaky"].Err != nil {
			t.Errorf("flaky = %q (err %v), want %q", got, by["flaky"].Err, want)
		}
		if got, want := string(by["ok"].Value), "v-ok"; got != want {
			t.Errorf("ok = %q, want %q", got, want)
		}
		if got, want := u.Count("flaky"), 3; got != want {
			t.Errorf("flaky requested %d times, want %d (1 + 2 retries)", got, want)
		}
		if got, want := u.Count("ok"), 1; got != want {
			t.Errorf("ok requested %d times, want %d: a good member must not be asked again", got, want)
		}
		if got, want := promtest.Sum(t, reg, "hearth_origin_retries_total", "source", "api"), 2.0; got != want {
			t.Errorf("hearth_origin_retries_total = %g, want %g", got, want)
		}
	})
	t.Run("retries are bounded and the last error is kept", func(t *testing.T) {
		u := origintest.New(t, func(string, int) (int, string) { return http.StatusBadGateway, "down" })
		g := protect.Guard(u.Source(t, 4), protect.GuardConfig{Name: "api", Retries: 3, RetryBackoff: time.Millisecond})
		rs, err := g.Load(context.Background(), origintest.Spec(t, "p", "p:{id}", "/v/{id}"), []string{"x"})
		if err != nil {
			t.Fatal(err)
		}
		if err := rs[0].Err; !errors.Is(err, warmer.ErrUnavailable) || !strings.Contains(err.Error(), "HTTP 502") {
			t.Errorf("err = %v, want HTTP 502 marked unavailable", err)
		}
		if got, want := u.Count("x"), 4; got != want {
			t.Errorf("requested %d times, want %d", got, want)
		}
	})
	t.Run("bad payloads and missing members are never retried", func(t *testing.T) {
		u := origintest.New(t, func(m string, _ int) (int, string) {
			switch m {
			case "gone":
				return http.StatusNotFound, ""
			case "teapot":
				return http.StatusTeapot, ""
			}
			return http.StatusOK, "<html>not json"
		})
		s := origintest.Spec(t, "p", "p:{id}", "/v/{id}")
		s.JSONPointer = "/price"
		g := protect.Guard(u.Source(t, 4), protect.GuardConfig{Name: "api", Retries: 3, RetryBackoff: time.Millisecond})
		rs, err := g.Load(context.Background(), s, []string{"garbage", "gone", "teapot"})
		if err != nil {
			t.Fatal(err)
		}
		by := byMember(rs)
		if err := by["garbage"].Err; !errors.Is(err, warmer.ErrBadPayload) {
			t.Errorf("garbage: err = %v, want ErrBadPayload", err)
		}
		if !by["gone"].Missing {
			t.Errorf("gone: %+v, want missing", by["gone"])
		}
		for _, m := range []string{"garbage", "gone", "teapot"} {
			if got := u.Count(m); got != 1 {
				t.Errorf("%s requested %d times, want 1", m, got)
			}
		}
	})
	t.Run("a slow call is cut by attempt_timeout and retried", func(t *testing.T) {
		u := origintest.New(t, func(m string, n int) (int, string) { return http.StatusOK, "v" })
		u.SetDelay(5 * time.Second)
		s := origintest.Spec(t, "one", "one", "/v/one")
		g := protect.Guard(u.Source(t, 1), protect.GuardConfig{Name: "api", Retries: 1, RetryBackoff: time.Millisecond,
			AttemptTimeout: 100 * time.Millisecond})
		go func() {
			// The second attempt answers at once.
			for u.Count("one") < 1 {
				time.Sleep(5 * time.Millisecond)
			}
			u.SetDelay(0)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		rs, err := g.Load(ctx, s, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 1 || string(rs[0].Value) != "v" || rs[0].Err != nil {
			t.Fatalf("results = %+v, want the value from the second attempt", rs)
		}
		if got, want := u.Count("one"), 2; got != want {
			t.Errorf("requested %d times, want %d", got, want)
		}
	})
	t.Run("no retry outlasts the load's deadline", func(t *testing.T) {
		u := origintest.New(t, func(string, int) (int, string) { return http.StatusInternalServerError, "" })
		g := protect.Guard(u.Source(t, 1), protect.GuardConfig{Name: "api", Retries: 5, RetryBackoff: time.Second})
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		rs, err := g.Load(ctx, origintest.Spec(t, "p", "p:{id}", "/v/{id}"), []string{"x"})
		if err != nil {
			t.Fatal(err)
		}
		if rs[0].Err == nil {
			t.Fatal("want the 500 reported")
		}
		if ctx.Err() != nil {
			t.Error("Load waited for a backoff that ends after its deadline")
		}
		if got, want := u.Count("x"), 1; got != want {
			t.Errorf("requested %d times, want %d", got, want)
		}
	})
}

func TestGuardBreaker(t *testing.T) {
	origintest.NoLeaks(t)
	var healthy atomic.Bool
	u := origintest.New(t, func(string, int) (int, string) {
		if healthy.Load() {
			return http.StatusOK, "v"
		}
		return http.StatusInternalServerError, "down"
	})
	reg := prometheus.NewRegistry()
	openFor := 300 * time.Millisecond
	g := protect.Guard(u.Source(t, 4), protect.GuardConfig{Name: "api", BreakerFailures: 3, BreakerOpenFor: openFor,
		Metrics: protect.NewGuardMetrics(reg)})
	s := origintest.Spec(t, "p", "p:{id}", "/v/{id}")
	load := func() ([]warmer.Result, error) {
		return g.Load(context.Background(), s, []string{"a", "b"})
	}

	for i := range 3 {
		if _, err := load(); err != nil {
			t.Fatalf("load %d: %v (the breaker opened too early)", i, err)
		}
	}
	if got, want := promtest.Sum(t, reg, "hearth_origin_breaker_state", "source", "api"), 2.0; got != want {
		t.Fatalf("breaker state = %g after 3 failed calls, want 2 (open)", got)
	}
	before := u.Total()
	_, err := load()
	if !errors.Is(err, warmer.ErrBreakerOpen) {
		t.Fatalf("load with the breaker open: err = %v, want ErrBreakerOpen", err)
	}
	if got := u.Total(); got != before {
		t.Errorf("the origin was called %d times with the breaker open", got-before)
	}
	if got := promtest.Sum(t, reg, "hearth_origin_rejected_total", "source", "api", "reason", "breaker_open"); got < 1 {
		t.Errorf("hearth_origin_rejected_total{reason=breaker_open} = %g, want >= 1", got)
	}

	healthy.Store(true)
	deadline := time.Now().Add(10 * openFor)
	for {
		rs, err := load()
		if err == nil {
			if got := string(byMember(rs)["a"].Value); got != "v" {
				t.Fatalf("after the breaker closed: a = %q", got)
			}
			break
		}
		if !errors.Is(err, warmer.ErrBreakerOpen) || time.Now().After(deadline) {
			t.Fatalf("the breaker did not let a trial call through after open_for: %v", err)
		}
		time.Sleep(openFor / 10)
	}
	if got, want := promtest.Sum(t, reg, "hearth_origin_breaker_state", "source", "api"), 0.0; got != want {
		t.Errorf("breaker state = %g after a good trial call, want 0 (closed)", got)
	}

	t.Run("one failing member in many does not open it", func(t *testing.T) {
		u := origintest.New(t, func(m string, _ int) (int, string) {
			if m == "bad" {
				return http.StatusInternalServerError, ""
			}
			return http.StatusOK, "v"
		})
		g := protect.Guard(u.Source(t, 4), protect.GuardConfig{Name: "api2", BreakerFailures: 1, BreakerOpenFor: time.Minute})
		for range 3 {
			if _, err := g.Load(context.Background(), s, []string{"a", "b", "c", "bad"}); err != nil {
				t.Fatalf("err = %v: one 5xx member in four opened the breaker", err)
			}
		}
		if _, err := g.Load(context.Background(), s, []string{"bad", "a"}); err != nil {
			t.Fatal(err)
		}
		if _, err := g.Load(context.Background(), s, []string{"a"}); !errors.Is(err, warmer.ErrBreakerOpen) {
			t.Errorf("err = %v: half the members failing must count as a failed call", err)
		}
	})
	t.Run("a cancelled load is not held against the origin", func(t *testing.T) {
		u := origintest.New(t, func(string, int) (int, string) { return http.StatusOK, "v" })
		u.SetDelay(5 * time.Second)
		g := protect.Guard(u.Source(t, 1), protect.GuardConfig{Name: "api3", BreakerFailures: 1, BreakerOpenFor: time.Minute})
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			for u.Total() < 1 {
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
		}()
		one := origintest.Spec(t, "one", "one", "/v/one")
		if rs, err := g.Load(ctx, one, nil); err == nil && (len(rs) != 1 || !errors.Is(rs[0].Err, context.Canceled)) {
			t.Fatalf("results = %+v, want the cancellation reported", rs)
		}
		u.SetDelay(0)
		if _, err := g.Load(context.Background(), one, nil); err != nil {
			t.Errorf("err = %v: a cancelled call opened the breaker", err)
		}
	})
}

func TestGuardBoundsCalls(t *testing.T) {
	origintest.NoLeaks(t)
	t.Run("max_in_flight", func(t *testing.T) {
		u := origintest.New(t, func(string, int) (int, string) { return http.StatusOK, "v" })
		u.SetDelay(50 * time.Millisecond)
		g := protect.Guard(u.Source(t, 1), protect.GuardConfig{Name: "api", MaxInFlight: 2})
		s := origintest.Spec(t, "p", "p:{id}", "/v/{id}")
		var wg sync.WaitGroup
		for i := range 12 {
			wg.Go(func() {
				if _, err := g.Load(context.Background(), s, []string{string(rune('a' + i))}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if got, want := u.Peak(), 2; got != want {
			t.Errorf("peak requests in flight = %d, want %d", got, want)
		}
	})
	t.Run("rate", func(t *testing.T) {
		u := origintest.New(t, func(string, int) (int, string) { return http.StatusOK, "v" })
		reg := prometheus.NewRegistry()
		g := protect.Guard(u.Source(t, 1), protect.GuardConfig{Name: "api", Rate: 1, Burst: 1, Metrics: protect.NewGuardMetrics(reg)})
		s := origintest.Spec(t, "one", "one", "/v/one")
		if _, err := g.Load(context.Background(), s, nil); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := g.Load(ctx, s, nil)
		if !errors.Is(err, warmer.ErrOverloaded) {
			t.Fatalf("second call within a second at rate 1: err = %v, want ErrOverloaded", err)
		}
		if got, want := u.Count("one"), 1; got != want {
			t.Errorf("origin called %d times, want %d", got, want)
		}
		if got := promtest.Sum(t, reg, "hearth_origin_rejected_total", "reason", "rate_limited"); got != 1 {
			t.Errorf("rejected{reason=rate_limited} = %g, want 1", got)
		}
	})
}

func TestGuardForwardsMemberListing(t *testing.T) {
	u := origintest.New(t, func(string, int) (int, string) { return http.StatusOK, "v" })
	g := protect.Guard(u.Source(t, 1), protect.GuardConfig{Name: "api"})
	if _, ok := g.(warmer.MemberLister); ok {
		t.Error("a guarded http source claims to list members")
	}
}

func TestRetryable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{warmer.ErrUnavailable, true},
		{context.DeadlineExceeded, true},
		{context.Canceled, false},
		{warmer.ErrBadPayload, false},
		{warmer.ErrTooLarge, false},
		{warmer.ErrBreakerOpen, false},
		{warmer.ErrOrigin, false},
		{errors.New("syntax error at or near"), false},
	} {
		if got := protect.Retryable(c.err); got != c.want {
			t.Errorf("Retryable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// A guarded source gets ready for no more loads than max_in_flight lets run,
// and not at all while its breaker is open: opening connections to an origin
// that is failing is what the breaker is there to stop.
func TestGuardPrepare(t *testing.T) {
	f := sourcetest.New("db")
	g := protect.Guard(f, protect.GuardConfig{Name: "db", MaxInFlight: 2, BreakerFailures: 1, BreakerOpenFor: time.Minute})
	p, ok := g.(warmer.Preparer)
	if !ok {
		t.Fatal("a guarded source is not a warmer.Preparer")
	}
	p.Prepare(context.Background(), nil, 5)
	if got, _ := f.Prepared(); !slices.Equal(got, []int{2}) {
		t.Errorf("Prepare for 5 loads with max_in_flight 2 reached the source as %v, want [2]", got)
	}
	f.Fail(fmt.Errorf("origin down: %w", warmer.ErrUnavailable))
	if _, err := g.Load(context.Background(), &warmer.Spec{Name: "one"}, nil); err == nil {
		t.Fatal("a failing origin's load succeeded")
	}
	if _, err := g.Load(context.Background(), &warmer.Spec{Name: "one"}, nil); !errors.Is(err, warmer.ErrBreakerOpen) {
		t.Fatalf("err = %v, want the breaker open", err)
	}
	p.Prepare(context.Background(), nil, 5)
	if got, _ := f.Prepared(); len(got) != 1 {
		t.Errorf("Prepare reached the source with the breaker open: %v", got)
	}
}
