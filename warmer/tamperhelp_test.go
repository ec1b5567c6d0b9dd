package warmer_test

import (
	"bytes"
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// syncBuffer is a log sink the test reads while Hearth writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// set, list: foreign values written into one of Hearth's keys.
func set(v string) func(c *redis.Client, key string) error {
	return func(c *redis.Client, key string) error { return c.Set(context.Background(), key, v, 0).Err() }
}

func list(c *redis.Client, key string) error {
	ctx := context.Background()
	if err := c.Del(ctx, key).Err(); err != nil {
		return err
	}
	return c.RPush(ctx, key, "x").Err()
}
