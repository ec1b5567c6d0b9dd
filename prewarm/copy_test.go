package prewarm_test

import (
	"context"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/prewarm"
)

// TestCopyScanPatternEscaped: the source SCAN's MATCH pattern takes a
// template's literal parts literally: a prefix holding glob characters
// matches only itself.
func TestCopyScanPatternEscaped(t *testing.T) {
	env := testenv.Redis(t)
	ctx := context.Background()
	p := env.Prefix
	for _, k := range []string{p + "g[1]*?:5", p + "g1x:5", p + "gX*?:5", p + `g\[1]*?:5`} {
		if err := env.Client.Set(ctx, k, "v", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	it := env.Client.Scan(ctx, 0, prewarm.GlobEscape(p+"g[1]*?:")+"*", 1000).Iterator()
	for it.Next(ctx) {
		got = append(got, it.Val())
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != p+"g[1]*?:5" {
		t.Errorf("escaped pattern matched %q, want only %q", got, p+"g[1]*?:5")
	}
}
