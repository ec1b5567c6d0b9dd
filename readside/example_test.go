package readside_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/readside"
)

// exampleNamespace stands for Hearth's redis.namespace ("hearth" unless
// configured): the examples take one of their own, as tests do.
func exampleNamespace() string { return "example-" + strconv.FormatInt(time.Now().UnixNano(), 36) }

// One Cache per application process, over the application's own Redis
// client, with the namespace, sampling and metrics of a production setup.
func ExampleNew() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	ns := exampleNamespace()
	reg := prometheus.NewRegistry() // in an application: prometheus.DefaultRegisterer

	c, err := readside.New(readside.Options{
		Client:       rdb,
		Namespace:    ns,              // Hearth's redis.namespace
		TTL:          5 * time.Minute, // for the keys Hearth does not warm
		StaleFor:     time.Hour,       // served while the origin fails
		AccessSample: 100,             // one read in 100 counted for Hearth's pre-warm
		Registerer:   reg,             // hearth_cache_reads_total and hearth_readside_*
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil { // check err before deferring Close: c is nil on error
		fmt.Println(err)
		return
	}
	defer c.Close(ctx)

	key := ns + ":user:1"
	defer rdb.Del(ctx, key, readside.DeltaKey(ns, key), readside.StaleKey(ns, key))
	load := func(context.Context) ([]byte, error) { return []byte("Ada"), nil }
	for range 2 {
		if _, err := c.GetOrLoad(ctx, key, load); err != nil {
			fmt.Println(err)
		}
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "hearth_cache_reads_total" {
			for _, m := range mf.GetMetric() {
				fmt.Printf("hearth_cache_reads_total{result=%q} %v\n", label(m, "result"), m.GetCounter().GetValue())
			}
		}
	}
	// Output:
	// hearth_cache_reads_total{result="hit"} 1
	// hearth_cache_reads_total{result="miss"} 1
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// GetOrLoad reads the key from Redis and, on a miss, runs the loader once
// (however many callers and processes miss together) and writes its value
// for the others. ErrNotFound from the loader is cached as Hearth's negative
// sentinel.
func ExampleCache_GetOrLoad() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	ns := exampleNamespace()
	c, err := readside.New(readside.Options{Client: rdb, Namespace: ns, TTL: time.Minute})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close(ctx)

	loads := 0
	product := func(id int) readside.Loader {
		return func(ctx context.Context) ([]byte, error) {
			loads++ // in an application: SELECT ... WHERE id = $1
			if id != 42 {
				return nil, readside.ErrNotFound
			}
			return []byte(`{"id":42}`), nil
		}
	}
	for _, id := range []int{42, 42, 7, 7} {
		key := ns + ":product:" + strconv.Itoa(id)
		defer rdb.Del(ctx, key, readside.DeltaKey(ns, key))
		v, err := c.GetOrLoad(ctx, key, product(id))
		switch {
		case errors.Is(err, readside.ErrNotFound):
			fmt.Printf("product %d: not found\n", id)
		case err != nil:
			fmt.Printf("product %d: %v\n", id, err)
		default:
			fmt.Printf("product %d: %s\n", id, v)
		}
	}
	fmt.Println("loads:", loads)
	// Output:
	// product 42: {"id":42}
	// product 42: {"id":42}
	// product 7: not found
	// product 7: not found
	// loads: 2
}

// A cache that keeps a stale copy for an hour serves it while the origin is
// down; a copy readside did not write is never served.
func ExampleCache_GetOrLoad_staleCopy() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	ns := exampleNamespace()
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
