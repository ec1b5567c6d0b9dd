package http_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/e2e"
	"github.com/hearth-dev/hearth/internal/origintest"
	"github.com/hearth-dev/hearth/internal/sourcetest"
	httpsrc "github.com/hearth-dev/hearth/sources/http"
	"github.com/hearth-dev/hearth/warmer"
)

// TestConformance runs the Source conformance suite on an httptest origin
// that answers GET /v/<member> with the member's value, or 404.
func TestConformance(t *testing.T) {
	sourcetest.Conformance(t, sourcetest.Backend{
		Name: "api",
		New: func(t *testing.T, values map[string][]byte, delay time.Duration) (warmer.Source, *warmer.Spec) {
			u := origintest.New(t, func(m string, _ int) (int, string) {
				if v, ok := values[m]; ok {
					return http.StatusOK, string(v)
				}
				return http.StatusNotFound, "no such member"
			})
			u.SetDelay(delay)
			return u.Source(t, 8), origintest.Spec(t, "p", "p:{id}", "/v/{id}")
		},
		Single: func(t *testing.T, value []byte) (warmer.Source, *warmer.Spec) {
			u := origintest.New(t, func(m string, _ int) (int, string) {
				if m == "single" && value != nil {
					return http.StatusOK, string(value)
				}
				return http.StatusNotFound, "no such key"
			})
			return u.Source(t, 8), origintest.Spec(t, "s", "single", "/v/single")
		},
		Down: func(t *testing.T) (warmer.Source, *warmer.Spec) {
			src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: "http://" + e2e.FreeAddr(t), Timeout: 2 * time.Second, Concurrency: 8})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(src.Close)
			return src, origintest.Spec(t, "p", "p:{id}", "/v/{id}")
		},
	})
}
