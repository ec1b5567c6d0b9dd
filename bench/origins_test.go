package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hearth-dev/hearth/internal/testenv"
	"github.com/hearth-dev/hearth/keytmpl"
	httpsrc "github.com/hearth-dev/hearth/sources/http"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/warmer"
)

// heapPeak samples the live heap while f runs and returns the peak above the
// heap before it (after a GC), and the bytes f allocated.
func heapPeak(f func()) (peak, allocated uint64) {
	runtime.GC()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() uint64 { metrics.Read(sample); return sample[0].Value.Uint64() }
	base := read()
	var (
		top  atomic.Uint64
		stop = make(chan struct{})
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		t := time.NewTicker(200 * time.Microsecond)
		defer t.Stop()
		for {
			if h := read(); h > top.Load() {
				top.Store(h)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	close(stop)
	<-done
	if h := read(); h > top.Load() {
		top.Store(h)
	}
	if top.Load() > base {
		peak = top.Load() - base
	}
	return peak, after.TotalAlloc - before.TotalAlloc
}

// sixMBDocument is a 6 MB JSON body: 40,000 catalogue entries, the pointed value
// in the middle of them.
func sixMBDocument() []byte {
	var b bytes.Buffer
	b.WriteString(`{"meta":{"v":1},"items":[`)
	for i := 0; b.Len() < 6<<20; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sku":"SKU-%06d","name":"product %d with a long enough name","price":{"eur":%d.99,"tags":["a","b","c"]},"stock":[1,2,3,4,5,6,7,8]}`, i, i, i%1000)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// BenchmarkPointer6MB loads a 6 MB body with a JSON pointer, 8 requests in
// flight, and prints the heap it peaked at and what it allocated per load of 8,
// for the streaming pointer Hearth uses and for the whole-document decode it
// replaced (ReadAll, then encoding/json into any, then walk).
func BenchmarkPointer6MB(b *testing.B) {
	const inFlight = 8
	doc := sixMBDocument()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(doc)
	}))
	defer srv.Close()
	const ptr = "/items/20000/price"
	want := `{"eur":0.99,"tags":["a","b","c"]}`
	tp, err := keytmpl.Parse("doc:{id}")
	if err != nil {
		b.Fatal(err)
	}
	spec := &warmer.Spec{Name: "doc", Template: tp, Path: "/doc/{id}", JSONPointer: ptr}
	members := make([]string, inFlight)
	for i := range members {
		members[i] = strconv.Itoa(i)
	}
	src, err := httpsrc.New(httpsrc.Config{Name: "api", BaseURL: srv.URL, Timeout: time.Minute, Concurrency: inFlight})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()

	run := map[string]func(b *testing.B){
		"streaming": func(b *testing.B) {
			rs, err := src.Load(context.Background(), spec, members)
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range rs {
				if r.Err != nil || string(r.Value) != want {
					b.Fatalf("streaming pointer: %q %v", r.Value, r.Err)
				}
			}
		},
		"whole-decode": func(b *testing.B) {
			var wg sync.WaitGroup
			errs := make([]error, inFlight)
			for i := range inFlight {
				wg.Go(func() { errs[i] = wholeDecodeLoad(srv.URL+"/doc/"+members[i], ptr, httpsrc.DefaultMaxBodyBytes) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
		},
	}
	for _, name := range []string{"streaming", "whole-decode"} {
		b.Run(name, func(b *testing.B) {
			var peak, alloc uint64
			for range b.N {
				p, a := heapPeak(func() { run[name](b) })
				peak, alloc = max(peak, p), alloc+a
			}
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MB")
			b.ReportMetric(float64(alloc)/float64(b.N)/(1<<20), "alloc-MB/op")
		})
	}
}

// wholeDecodeLoad is the pointer load as it was: the body read whole, decoded
// whole into any, then walked.
func wholeDecodeLoad(u, ptr string, maxBody int64) error {
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var node any
	if err := dec.Decode(&node); err != nil {
		return err
	}
	for _, tok := range strings.Split(ptr[1:], "/") {
		switch n := node.(type) {
		case map[string]any:
			node = n[tok]
		case []any:
			i, _ := strconv.Atoi(tok)
			node = n[i]
		}
	}
	_, err = json.Marshal(node)
	return err
}

// BenchmarkPostgresOversize loads a batch of 6 good rows and six 50 MB values
// and prints the heap it peaked at: with max_value_bytes 1 MiB enforced in the
// query (the oversize values are never sent) and with no bound in the query
// (every value fetched, as before, and refused only after arriving).
func BenchmarkPostgresOversize(b *testing.B) {
	pg := testenv.Postgres(b)
	ctx := context.Background()
	// repeat() compresses well: 300 MB of values, little disk.
	if _, err := pg.Pool.Exec(ctx, `
		CREATE TABLE blobs (id text PRIMARY KEY, body bytea NOT NULL);
		INSERT INTO blobs SELECT 'ok' || i, ('value ' || i)::bytea FROM generate_series(1, 6) i;
		INSERT INTO blobs SELECT 'big' || i, decode(repeat('ab', 50 << 20), 'hex') FROM generate_series(1, 6) i;`); err != nil {
		b.Fatal(err)
	}
	src, err := postgres.New(postgres.Config{Name: "db", DSN: pg.DSN, MaxConns: 2})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	tp, err := keytmpl.Parse("blob:{id}")
	if err != nil {
		b.Fatal(err)
	}
	members := []string{"ok1", "big1", "ok2", "big2", "ok3", "big3", "ok4", "big4", "ok5", "big5", "ok6", "big6"}
	for _, c := range []struct {
		name  string
		bound int
	}{{"bounded-1MiB", 1 << 20}, {"unbounded", 0}} {
		b.Run(c.name, func(b *testing.B) {
			spec := &warmer.Spec{Name: "blob", Template: tp, Query: "SELECT id, body FROM blobs WHERE id = ANY($1)", MaxValueBytes: c.bound}
			if _, err := src.Load(ctx, spec, []string{"ok1"}); err != nil {
				b.Fatal(err)
			}
			var peak, alloc uint64
			for range b.N {
				p, a := heapPeak(func() {
					rs, err := src.Load(ctx, spec, members)
					if err != nil || len(rs) != len(members) {
						b.Fatalf("load: %d results, %v", len(rs), err)
					}
					tooLarge := 0
					for _, r := range rs {
						if errors.Is(r.Err, warmer.ErrTooLarge) {
							tooLarge++
						}
					}
					if c.bound > 0 && tooLarge != 6 {
						b.Fatalf("%d members too large, want 6", tooLarge)
					}
					runtime.KeepAlive(rs)
				})
				peak, alloc = max(peak, p), alloc+a
			}
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MB")
			b.ReportMetric(float64(alloc)/float64(b.N)/(1<<20), "alloc-MB/op")
		})
	}
}
