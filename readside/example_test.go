package readside_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/readside"
)

// A cache that keeps a stale copy for an hour serves it while the origin is
// down; a copy readside did not write is never served.
func ExampleCache_GetOrLoad_staleCopy() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	ns := "example-" + strconv.FormatInt(time.Now().UnixNano(), 36) // the application's own: "hearth"
	key := ns + ":product:42"
	defer rdb.Del(ctx, key, readside.DeltaKey(ns, key), readside.StaleKey(ns, key), readside.LockKey(ns, key))

	c, err := readside.New(readside.Options{Client: rdb, Namespace: ns, TTL: time.Minute, StaleFor: time.Hour})
	if err != nil {
		panic(err)
	}
	defer c.Close(ctx)

	v, err := c.GetOrLoad(ctx, key, func(context.Context) ([]byte, error) { return []byte(`{"id":42}`), nil })
	fmt.Printf("loaded %s, %v\n", v, err)

	rdb.Del(ctx, key) // the value expires while the origin is down
	errDown := errors.New("origin down")
	down := func(context.Context) ([]byte, error) { return nil, errDown }
	v, err = c.GetOrLoad(ctx, key, down)
	fmt.Printf("stale %s, %v\n", v, err)

	rdb.Set(ctx, readside.StaleKey(ns, key), "planted", 0) // not readside's frame
	v, err = c.GetOrLoad(ctx, key, down)
	fmt.Printf("planted: %q, the loader's error: %v\n", v, errors.Is(err, errDown))
	// Output:
	// loaded {"id":42}, <nil>
	// stale {"id":42}, <nil>
	// planted: "", the loader's error: true
}
