package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/hearth-dev/hearth/config"
)

// FuzzConfigParse: no input makes the loader panic; a rejected config is a
// *config.Error with at least one problem, an accepted one yields a spec per key.
func FuzzConfigParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.yaml")
	files = append(files, "../config.yaml")
	for _, name := range files {
		if data, err := os.ReadFile(name); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte("keys: [{name: a, key: 'a:{id}', members: ['1'], source: s, ttl: 1s}]\nsources: [{name: s, type: http, base_url: 'http://x', timeout: 1s}]"))
	f.Add([]byte("sources:\n  - name: db\n    breaker: {failures: -1, open_for: 1ns}\n    rate: .nan\n"))
	f.Add([]byte("redis: {addrs: [\"${NOPE:-127.0.0.1:6379}\"]}\n"))
	f.Add([]byte("\x00\xff: [}"))
	f.Add([]byte("refresh: {jitter: .nan, spread: .inf, load_timeout: 2562047h}\nprewarm: {rate: -.inf}\n"))
	f.Add([]byte("keys: [{name: a, key: 'hearth:{id}', members: ['1'], source: s, ttl: 2562047h, jitter: .NaN}]\nsources: [{name: s, type: http, base_url: 'http://x', timeout: 1s, headers: {'a b': \"x\\r\\ny\"}}]"))
	f.Add([]byte("refresh:\n  jitter: 0.1\n  JITTER: 0.2\nrefresh: {}\nkeys: [{ttl: 1s, ttl: 2s}]\n"))
	f.Add([]byte("a: &x {b: 1}\nc: {<<: *x, b: 2}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.Parse("fuzz.yaml", data)
		if err != nil {
			var ce *config.Error
			if !errors.As(err, &ce) || len(ce.Problems) == 0 {
				t.Fatalf("error %T %q is not a *config.Error with problems", err, err)
			}
			return
		}
		if got, want := len(cfg.Specs()), len(cfg.Keys); got != want {
			t.Fatalf("valid config: %d specs for %d keys", got, want)
		}
	})
}
