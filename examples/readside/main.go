// Command readside shows the read side at work against a real Redis: three
// application instances (each its own client and cache, as separate processes
// would be) read 20 products through readside.GetOrLoad while the keys expire
// and once after a FLUSHDB of their keys, and the origin counts its loads.
//
//	go run ./examples/readside -addr 127.0.0.1:6379 -db 15
//	go run ./examples/readside -local 500ms   # with a near cache in each instance
//
// It writes, in Redis database -db, only keys under -prefix, readside's own
// keys beside them and the access buckets of -namespace (by default
// "example-readside", not Hearth's "hearth", so that a Hearth running on the
// same Redis never pre-warms the example's keys), and deletes them all at
// the end. For the smallest use of readside, see examples/readside-minimal.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/readside"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "readside example:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("readside", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:6379", "Redis address")
	db := fs.Int("db", 0, "Redis database index")
	ns := fs.String("namespace", "example-readside", "namespace of readside's own keys and access buckets (an application uses Hearth's redis.namespace)")
	prefix := fs.String("prefix", "example:readside:", "prefix of the example's cache keys")
	local := fs.Duration("local", 0, "Local.TTL of an in-process near cache in each instance (0: none)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx := context.Background()
	started := time.Now()

	// The origin: a product table behind a 50 ms query; product 13 does not exist.
	var loads atomic.Int64
	load := func(id int) readside.Loader {
		return func(ctx context.Context) ([]byte, error) {
			loads.Add(1)
			time.Sleep(50 * time.Millisecond)
			if id == 13 {
				return nil, readside.ErrNotFound
			}
			return []byte(`{"id":` + strconv.Itoa(id) + `,"name":"product ` + strconv.Itoa(id) + `"}`), nil
		}
	}

	var near readside.LocalOptions // off unless -local
	if *local > 0 {
		near = readside.LocalOptions{Size: 100, TTL: *local}
	}
	reg := prometheus.NewRegistry()
	var caches []*readside.Cache
	for range 3 {
		rdb := redis.NewClient(&redis.Options{Addr: *addr, DB: *db})
		defer rdb.Close()
		if err := rdb.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("connect to redis %s: %w", *addr, err)
		}
		c, err := readside.New(readside.Options{
			Client: rdb, Namespace: *ns, TTL: 2 * time.Second, StaleFor: time.Minute,
			AccessSample: 1, // count every read in Hearth's access buckets
			Local:        near,
			Registerer:   prometheus.WrapRegistererWith(prometheus.Labels{"instance": strconv.Itoa(len(caches))}, reg),
			Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			return err
		}
		caches = append(caches, c)
	}
	admin := redis.NewClient(&redis.Options{Addr: *addr, DB: *db})
	defer admin.Close()
	defer cleanup(admin, *prefix, *ns)
	defer deleteBuckets(admin, *ns, started)

	read := func(phase string) error {
		before := loads.Load()
		var wg sync.WaitGroup
		var errs atomic.Int64
		for _, c := range caches {
			for range 30 { // 30 readers per instance
				wg.Go(func() {
					for id := range 20 {
						_, err := c.GetOrLoad(ctx, *prefix+"product:"+strconv.Itoa(id), load(id))
						if err != nil && !errors.Is(err, readside.ErrNotFound) {
							errs.Add(1)
						}
					}
				})
			}
		}
		wg.Wait()
		fmt.Fprintf(out, "%-42s 1800 reads of 20 keys by 90 readers in 3 instances: %d origin loads, %d errors\n",
			phase, loads.Load()-before, errs.Load())
		return nil
	}
	if err := read("cold:"); err != nil {
		return err
	}
	if err := read("warm:"); err != nil {
		return err
	}
	if *local > 0 {
		// The near caches hold copies younger than -local: a deletion by
		// someone else is seen at most Local.TTL late.
		if err := cleanup(admin, *prefix, ""); err != nil {
			return err
		}
		if err := read("deleted, within -local (from memory):"); err != nil {
			return err
		}
		time.Sleep(*local)
		if err := read("deleted, -local later (seen):"); err != nil {
			return err
		}
	}
	time.Sleep(2200 * time.Millisecond)
	if err := read("after the 2 s TTL expired:"); err != nil {
		return err
	}
	if err := cleanup(admin, *prefix, ""); err != nil {
		return err
	}
	if err := read("after deleting every key (a FLUSHDB):"); err != nil {
		return err
	}
	for _, c := range caches {
		if err := c.Close(ctx); err != nil {
			return err
		}
	}
	// The run may cross a bucket's boundary: count every bucket since it
	// started.
	var n float64
	w := readside.DefaultAccessBucket
	for at := started; at.Before(time.Now().Add(w)); at = at.Add(w) {
		c, _ := admin.ZScore(ctx, readside.AccessKey(*ns, at, w), *prefix+"product:0").Result()
		n += c
	}
	fmt.Fprintf(out, "reads of %sproduct:0 recorded for Hearth in %s and the buckets after it: %.0f (deleted at exit)\n", *prefix, readside.AccessKey(*ns, started, w), n)
	mfs, err := reg.Gather()
	if err != nil {
		return err
	}
	for _, mf := range mfs {
		var sum float64
		for _, m := range mf.GetMetric() {
			if m.Counter != nil {
				sum += m.GetCounter().GetValue()
			}
		}
		if mf.GetType().String() == "COUNTER" && sum > 0 {
			fmt.Fprintf(out, "  %-40s %6.0f (all instances and labels)\n", mf.GetName(), sum)
		}
	}
	return nil
}

// cleanup deletes the example's keys and, with ns, its own keys beside them.
func cleanup(rdb *redis.Client, prefix, ns string) error {
	ctx := context.Background()
	var keys []string
	for id := range 20 {
		k := prefix + "product:" + strconv.Itoa(id)
		keys = append(keys, k)
		if ns != "" {
			keys = append(keys, readside.DeltaKey(ns, k), readside.StaleKey(ns, k), readside.LockKey(ns, k))
		}
	}
	for _, k := range keys { // one by one: in a Cluster they are in different slots
		if err := rdb.Del(ctx, k).Err(); err != nil {
			return fmt.Errorf("delete %s: %w", k, err)
		}
	}
	return nil
}

// deleteBuckets deletes the access buckets the example's reads went to since
// started: a Hearth on this Redis and namespace would pre-warm those keys.
func deleteBuckets(rdb *redis.Client, ns string, started time.Time) error {
	ctx := context.Background()
	w := readside.DefaultAccessBucket
	for t := started; t.Before(time.Now().Add(w)); t = t.Add(w) {
		if err := rdb.Del(ctx, readside.AccessKey(ns, t, w)).Err(); err != nil {
			return fmt.Errorf("delete access bucket: %w", err)
		}
	}
	return nil
}
