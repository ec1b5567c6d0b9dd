package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/testenv"
)

// TestExampleStaysInItsDB runs the example in database 9 under a namespace
// and prefix of its own: it records reads for Hearth, and leaves nothing
// behind, in its database or in database 0.
func TestExampleStaysInItsDB(t *testing.T) {
	env := testenv.Redis(t) // a prefix in DB 0, deleted at cleanup
	ctx := context.Background()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ns, prefix := "t-example-"+hex.EncodeToString(b), env.Prefix+"example:"
	db9 := redis.NewClient(&redis.Options{Addr: env.Addr, DB: 9})
	defer db9.Close()
	t.Cleanup(func() {
		for _, c := range []*redis.Client{env.Client, db9} {
			if keys := c.Keys(ctx, ns+":*").Val(); len(keys) > 0 {
				c.Del(ctx, keys...)
			}
		}
		db9.Del(ctx, db9.Keys(ctx, prefix+"*").Val()...)
	})
	// A value under the example's first key in DB 0: an example that read or
	// cleaned DB 0 would serve or delete it.
	planted := prefix + "product:0"
	if err := env.Client.Set(ctx, planted, "db 0's", 0).Err(); err != nil {
		t.Fatal(err)
	}

	var out strings.Builder
	if err := run([]string{"-addr", env.Addr, "-db", "9", "-namespace", ns, "-prefix", prefix}, &out); err != nil {
		t.Fatalf("example: %v\n%s", err, out.String())
	}
	t.Log(out.String())
	if !strings.Contains(out.String(), "recorded for Hearth in "+ns+":access:") || strings.Contains(out.String(), ": 0 (deleted") {
		t.Errorf("the example recorded no reads for Hearth:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "hearth_cache_reads_total") {
		t.Errorf("the example's metrics lack hearth_cache_reads_total:\n%s", out.String())
	}
	if got := env.Client.Get(ctx, planted).Val(); got != "db 0's" {
		t.Errorf("DB 0's %s holds %q after the example ran in DB 9", planted, got)
	}
	for name, c := range map[string]*redis.Client{"DB 0": env.Client, "DB 9": db9} {
		if keys := c.Keys(ctx, ns+":*").Val(); len(keys) > 0 {
			t.Errorf("%s: the example left %v", name, keys)
		}
	}
	if keys := db9.Keys(ctx, prefix+"*").Val(); len(keys) > 0 {
		t.Errorf("DB 9: the example left %v", keys)
	}
}
