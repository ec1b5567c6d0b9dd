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

// Per call, an option overrides the Cache's TTL (and its stale copy's
// lifetime, and its fallback) for the value that call writes.
func ExampleWithTTL() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	ns := exampleNamespace()
	c, err := readside.New(readside.Options{Client: rdb, Namespace: ns, TTL: time.Minute, Jitter: -1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close(ctx)

	key := ns + ":session:9"
	defer rdb.Del(ctx, key, readside.DeltaKey(ns, key))
	load := func(context.Context) ([]byte, error) { return []byte("token"), nil }
	if _, err := c.GetOrLoad(ctx, key, load, readside.WithTTL(10*time.Second)); err != nil {
		fmt.Println(err)
		return
	}
	ttl := rdb.PTTL(ctx, key).Val()
	fmt.Println("written with a TTL of 10s:", ttl > 9*time.Second && ttl <= 10*time.Second)
	// Output:
	// written with a TTL of 10s: true
}

// When another process holds a key's lock for all of LockWait without
// writing the value, the fallback decides: load anyway (the default), serve
// the stale copy, or fail with ErrLockWait.
func ExampleWithFallback() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	ns := exampleNamespace()
	c, err := readside.New(readside.Options{Client: rdb, Namespace: ns, LockWait: 100 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close(ctx)

	key := ns + ":report:daily"
	lock := readside.LockKey(ns, key)
	defer rdb.Del(ctx, key, lock, readside.DeltaKey(ns, key))
	// Another process's owner token (32 hex digits): a holder that never writes.
	rdb.Set(ctx, lock, "0123456789abcdef0123456789abcdef", 5*time.Second)
	load := func(context.Context) ([]byte, error) { return []byte("report"), nil }

	_, err = c.GetOrLoad(ctx, key, load, readside.WithFallback(readside.FallbackFail))
	fmt.Println("fail:", errors.Is(err, readside.ErrLockWait))
	v, err := c.GetOrLoad(ctx, key, load, readside.WithFallback(readside.FallbackLoad))
	fmt.Printf("load: %s %v\n", v, err)
	// Output:
	// fail: true
	// load: report <nil>
}

// A near cache in front of Redis serves hot reads from memory, each copy at
// most Local.TTL after Redis gave it: a change made in Redis by another
// process (or by Hearth) is seen here within that bound.
func ExampleLocalOptions() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	ns := exampleNamespace()
	c, err := readside.New(readside.Options{Client: rdb, Namespace: ns,
		Local: readside.LocalOptions{Size: 10_000, TTL: time.Minute}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close(ctx)

	key := ns + ":config:flags"
	defer rdb.Del(ctx, key, readside.DeltaKey(ns, key))
	load := func(context.Context) ([]byte, error) { return []byte("v1"), nil }
	v, _ := c.GetOrLoad(ctx, key, load)
	fmt.Printf("first read: %s\n", v)
	rdb.Set(ctx, key, "v2", time.Minute) // another process rewrites it
	v, _ = c.GetOrLoad(ctx, key, load)
	fmt.Printf("within Local.TTL: %s\n", v)
	// Output:
	// first read: v1
	// within Local.TTL: v1
}

// Close waits for the early refreshes running and sends the reads recorded
// so far to Hearth's access buckets, which its pre-warm ranks keys from.
func ExampleCache_Close() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	ns := exampleNamespace()
	now := time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC)
	c, err := readside.New(readside.Options{Client: rdb, Namespace: ns, AccessSample: 1,
		AccessFlush: time.Hour, Now: func() time.Time { return now }})
	if err != nil {
		fmt.Println(err)
		return
	}
	key := ns + ":product:42"
	bucket := readside.AccessKey(ns, now, readside.DefaultAccessBucket)
	defer rdb.Del(ctx, key, readside.DeltaKey(ns, key), bucket)
	for range 3 {
		_, _ = c.GetOrLoad(ctx, key, func(context.Context) ([]byte, error) { return []byte("p"), nil })
	}
	if err := c.Close(ctx); err != nil {
		fmt.Println(err)
	}
	fmt.Println("reads counted:", rdb.ZScore(ctx, bucket, key).Val())
	// Output:
	// reads counted: 3
}

// The keys readside keeps beside an application's key carry its hash tag, so
// that they share its Redis Cluster slot; other languages can compute them
// (docs/readside.md).
func ExampleLockKey() {
	fmt.Println(readside.LockKey("hearth", "product:42"))
	fmt.Println(readside.DeltaKey("hearth", "product:42"))
	fmt.Println(readside.StaleKey("hearth", "product:42"))
	// Output:
	// hearth:rs:lock:{ayu}:product:42
	// hearth:rs:delta:{ayu}:product:42
	// hearth:rs:stale:{ayu}:product:42
}

// A read at 10:30:45 counts in the access bucket of that minute, named after
// its start in unix seconds.
func ExampleAccessKey() {
	t := time.Date(2026, 12, 1, 10, 30, 45, 0, time.UTC)
	fmt.Println(readside.AccessKey("hearth", t, readside.DefaultAccessBucket))
	fmt.Println(time.Unix(readside.BucketStart(t, readside.DefaultAccessBucket), 0).UTC().Format(time.TimeOnly))
	// Output:
	// hearth:access:1796121000
	// 10:30:00
}

// HashSlot is CLUSTER KEYSLOT; SlotTag is a hash tag for a slot.
func ExampleHashSlot() {
	fmt.Println(readside.HashSlot("product:42"))
	fmt.Println(readside.HashSlot("{user:1}:cart") == readside.HashSlot("user:1"))
	tag := readside.SlotTag(readside.HashSlot("product:42"))
	fmt.Println(readside.HashSlot("{"+tag+"}:fence") == readside.HashSlot("product:42"))
	// Output:
	// 12456
	// true
	// true
}
