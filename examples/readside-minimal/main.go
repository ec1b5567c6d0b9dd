// Command readside-minimal is the smallest use of readside: one cache, one
// key, a loader that stands for the database. It needs nothing of Hearth's
// but the readside module (a test builds it in a module of its own). Its
// keys live under -namespace and are deleted at the end.
//
//	go run ./examples/readside-minimal -addr 127.0.0.1:6379
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/readside"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "Redis address")
	db := flag.Int("db", 0, "Redis database index")
	ns := flag.String("namespace", "example-minimal", "readside's namespace (an application uses Hearth's redis.namespace)")
	flag.Parse()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: *addr, DB: *db})
	defer rdb.Close()
	c, err := readside.New(readside.Options{Client: rdb, Namespace: *ns, TTL: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)
	key := *ns + ":product:42"
	defer rdb.Del(ctx, key, readside.DeltaKey(*ns, key)) // the example's own keys

	load := func(ctx context.Context) ([]byte, error) { return []byte(`{"id":42}`), nil } // your query
	for range 2 {
		v, err := c.GetOrLoad(ctx, key, load) // the first call loads, the second reads Redis
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s = %s\n", key, v)
	}
}
