package protect_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/origintest"
	"github.com/hearth-dev/hearth/internal/sourcetest"
	"github.com/hearth-dev/hearth/sources/protect"
	"github.com/hearth-dev/hearth/warmer"
)

// TestConformance runs the Source conformance suite on the origin protection
// (retries, breaker, call bounds) around the fake source: what the guard adds
// keeps the contract of what it wraps.
func TestConformance(t *testing.T) {
	guard := func(f *sourcetest.Fake) warmer.Source {
		return protect.Guard(f, protect.GuardConfig{Name: "guarded", MaxInFlight: 4, Rate: 1000, Burst: 100,
			AttemptTimeout: 5 * time.Second, Retries: 2, RetryBackoff: 10 * time.Millisecond, RetryMaxBackoff: 50 * time.Millisecond,
			BreakerFailures: 5, BreakerOpenFor: time.Second})
	}
	sourcetest.Conformance(t, sourcetest.Backend{
		Name: "guarded",
		New: func(t *testing.T, values map[string][]byte, delay time.Duration) (warmer.Source, *warmer.Spec) {
			f := sourcetest.New("guarded")
			f.SetAll(values)
			f.SetDelay(delay)
			return guard(f), origintest.Spec(t, "p", "p:{id}", "/v/{id}")
		},
		Single: func(t *testing.T, value []byte) (warmer.Source, *warmer.Spec) {
			f := sourcetest.New("guarded")
			f.Set("", value)
			return guard(f), origintest.Spec(t, "s", "s", "/v/s")
		},
		Down: func(t *testing.T) (warmer.Source, *warmer.Spec) {
			f := sourcetest.New("guarded")
			down := fmt.Errorf("%w: dial tcp 127.0.0.1:1: connection refused", warmer.ErrUnavailable)
			f.Fail(down)
			f.FailPing(down)
			return guard(f), origintest.Spec(t, "p", "p:{id}", "/v/{id}")
		},
	})
}
