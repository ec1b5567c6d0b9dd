package testenv

import (
	"bytes"
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// SyncBuffer is a log sink a test reads while Hearth writes to it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// PutString and PutList write a foreign value into one of Hearth's keys, as
// another client could: the string v, or a list in place of whatever the key held.
func PutString(v string) func(c *redis.Client, key string) error {
	return func(c *redis.Client, key string) error { return c.Set(context.Background(), key, v, 0).Err() }
}

// PutList: see PutString.
func PutList(c *redis.Client, key string) error {
	ctx := context.Background()
	if err := c.Del(ctx, key).Err(); err != nil {
		return err
	}
	return c.RPush(ctx, key, "x").Err()
}
