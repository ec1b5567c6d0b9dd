package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/storetest"
	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/store"
)

// The RedisStore passes the suite the tests' in-memory store passes, so that
// what the engine's tests prove on the fake holds on Redis.
func TestRedisStoreConformance(t *testing.T) {
	env := testenv.Redis(t)
	storetest.Run(t, &store.RedisStore{Client: env.Client}, env.Prefix,
		func(t *testing.T, key string) ([]byte, time.Duration, bool) {
			ctx := context.Background()
			v, err := env.Client.Get(ctx, key).Bytes()
			if err != nil {
				return nil, 0, false
			}
			ttl, err := env.Client.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			return v, max(ttl, 0), true
		})
}
