package readside_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/readside"
	"github.com/hearth-dev/hearth/readside/internal/rstest"
)

const (
	procs      = 4
	goroutines = 50
	nKeys      = 100
	rounds     = 3
)

// helperReport is what a stampede helper prints when it is done.
type helperReport struct {
	Fallbacks, Coalesced, LockWaits, Loads, Misses, LocalHits float64
}

// helperLocalTTL is the near cache's Local.TTL in the "stampede-local" helper.
const helperLocalTTL = 200 * time.Millisecond

// runHelper is the body of a re-executed test binary: a separate OS process
// with its own Cache, single-flight and connections.
func runHelper(kind string) error {
	addr, prefix := os.Getenv("READSIDE_ADDR"), os.Getenv("READSIDE_PREFIX")
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: goroutines + 10})
	defer rdb.Close()
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	o := origin{rdb: rdb, hash: prefix + "origin", delay: 50 * time.Millisecond}
	switch kind {
	case "stampede", "stampede-local":
		opts := readside.Options{Client: rdb, Namespace: prefix + "ns", TTL: time.Minute, Registerer: reg}
		if kind == "stampede-local" {
			opts.Local = readside.LocalOptions{Size: 1000, TTL: helperLocalTTL}
		}
		c, err := readside.New(opts)
		if err != nil {
			return err
		}
		for r := 1; r <= rounds; r++ {
			for {
				n, err := rdb.Get(ctx, prefix+"round").Int()
				if err != nil && !errors.Is(err, redis.Nil) {
					return err
				}
				if n >= r {
					break
				}
				time.Sleep(2 * time.Millisecond)
			}
			var wg sync.WaitGroup
			errs := make(chan error, goroutines)
			for g := range goroutines {
				wg.Add(1) // not wg.Go: this module builds with Go 1.24
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(g)))
					for _, i := range rng.Perm(nKeys) {
						key := prefix + "k:" + strconv.Itoa(i)
						v, err := c.GetOrLoad(ctx, key, o.loader(key))
						if err != nil || string(v) != "value of "+key {
							errs <- fmt.Errorf("get %s: %q, %v", key, v, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			if err := <-errs; err != nil {
				return err
			}
			if err := rdb.Incr(ctx, prefix+"done:"+strconv.Itoa(r)).Err(); err != nil {
				return err
			}
		}
		if err := c.Close(ctx); err != nil {
			return err
		}
		t := &testing.T{}
		rep := helperReport{
			Fallbacks: rstest.Sum(t, reg, "hearth_readside_fallbacks_total"),
			Coalesced: rstest.Sum(t, reg, "hearth_readside_coalesced_total"),
			LockWaits: rstest.Sum(t, reg, "hearth_readside_lock_wait_seconds"),
			Loads:     rstest.Sum(t, reg, "hearth_readside_loads_total"),
			Misses:    rstest.Sum(t, reg, "hearth_readside_misses_total"),
			LocalHits: rstest.Sum(t, reg, "hearth_readside_local_hits_total"),
		}
		return json.NewEncoder(os.Stdout).Encode(rep)
	case "holder":
		c, err := readside.New(readside.Options{Client: rdb, Namespace: prefix + "ns", LockTTL: time.Second})
		if err != nil {
			return err
		}
		key := prefix + "held"
		_, err = c.GetOrLoad(ctx, key, func(ctx context.Context) ([]byte, error) {
			if err := rdb.HIncrBy(ctx, o.hash, key, 1).Err(); err != nil {
				return nil, err
			}
			select {} // until kill -9
		})
		return err
	}
	return fmt.Errorf("unknown helper %q", kind)
}

func startHelper(t *testing.T, kind, addr, prefix string) (*exec.Cmd, *strings.Builder) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+kind, "READSIDE_ADDR="+addr, "READSIDE_PREFIX="+prefix)
	out := &strings.Builder{}
	cmd.Stdout = out
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, out
}

// TestStampedeAcrossProcesses: 4 OS processes × 50 goroutines read the same
// 100 cold keys (loader 50 ms); after each expiry the origin sees exactly one
// load per key, across all processes, and no fill falls back.
func TestStampedeAcrossProcesses(t *testing.T) { stampede(t, "stampede") }

// TestStampedeAcrossProcessesLocal: the same with each process's near cache
// on (Local.TTL 200 ms): still exactly one load per key per expiry, and
// most reads are answered from memory.
func TestStampedeAcrossProcessesLocal(t *testing.T) { stampede(t, "stampede-local") }

func stampede(t *testing.T, kind string) {
	env := rstest.Redis(t)
	ctx := context.Background()
	var cmds []*exec.Cmd
	var outs []*strings.Builder
	for range procs {
		cmd, out := startHelper(t, kind, env.Addr, env.Prefix)
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	o := origin{rdb: env.Client, hash: env.Prefix + "origin"}
	for r := 1; r <= rounds; r++ {
		if err := env.Client.Set(ctx, env.Prefix+"round", r, 0).Err(); err != nil {
			t.Fatal(err)
		}
		rstest.Eventually(t, 60*time.Second, fmt.Sprintf("round %d done by %d processes", r, procs), func() bool {
			n, _ := env.Client.Get(ctx, env.Prefix+"done:"+strconv.Itoa(r)).Int()
			return n == procs
		})
		for i := range nKeys {
			key := env.Prefix + "k:" + strconv.Itoa(i)
			if got := o.loads(t, key); got != r {
				t.Errorf("round %d: key %s loaded %d times in all, want %d (one per expiry)", r, key, got, r)
			}
		}
		// Expire every key, as its TTL would.
		pipe := env.Client.Pipeline()
		for i := range nKeys {
			pipe.PExpire(ctx, env.Prefix+"k:"+strconv.Itoa(i), time.Millisecond)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		rstest.Eventually(t, 10*time.Second, "keys expired", func() bool {
			n, _ := env.Client.Exists(ctx, env.Prefix+"k:0", env.Prefix+"k:99").Result()
			return n == 0
		})
		if kind == "stampede-local" {
			// PEXPIRE is a write by someone else: the near caches see it
			// within Local.TTL (their staleness bound), a real expiry at once.
			time.Sleep(2 * helperLocalTTL)
		}
	}
	var sum helperReport
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper %d: %v", i, err)
		}
		var rep helperReport
		if err := json.NewDecoder(bufio.NewReader(strings.NewReader(outs[i].String()))).Decode(&rep); err != nil {
			t.Fatalf("helper %d report %q: %v", i, outs[i].String(), err)
		}
		sum.Fallbacks += rep.Fallbacks
		sum.Coalesced += rep.Coalesced
		sum.LockWaits += rep.LockWaits
		sum.Loads += rep.Loads
		sum.Misses += rep.Misses
		sum.LocalHits += rep.LocalHits
	}
	t.Logf("across %d processes: %+v", procs, sum)
	if got, want := sum.Loads, float64(nKeys*rounds); got != want {
		t.Errorf("loader runs counted by the processes: %v, want %v", got, want)
	}
	if sum.Fallbacks != 0 {
		t.Errorf("fallbacks: %v, want 0", sum.Fallbacks)
	}
	if kind == "stampede-local" && sum.LocalHits == 0 {
		t.Error("no local hits with the near cache on")
	}
	if sum.Coalesced == 0 || sum.LockWaits == 0 {
		t.Errorf("no coalesced waits (%v) or no lock waits (%v): the stampede did not happen", sum.Coalesced, sum.LockWaits)
	}
}

// TestKilledHolderIsReplaced: a process killed with SIGKILL while it holds a
// key's lock and loads never releases it; a waiter in another process takes
// the lock once it lapses (LockTTL) and loads the key itself.
func TestKilledHolderIsReplaced(t *testing.T) {
	env := rstest.Redis(t)
	ctx := context.Background()
	ns, key := env.Prefix+"ns", env.Prefix+"held"
	o := origin{rdb: env.Client, hash: env.Prefix + "origin"}
	holder, _ := startHelper(t, "holder", env.Addr, env.Prefix)
	rstest.Eventually(t, 30*time.Second, "holder loading", func() bool { return o.loads(t, key) == 1 })
	token, err := env.Client.Get(ctx, readside.LockKey(ns, key)).Result()
	if err != nil || len(token) != 32 {
		t.Fatalf("holder's lock: %q, %v", token, err)
	}
	reg := prometheus.NewRegistry()
	c := newCache(t, env.Client, reg, readside.Options{Namespace: ns, LockTTL: time.Second, LockWait: 5 * time.Second})
	type result struct {
		v   []byte
		err error
	}
	res := make(chan result, 1)
	go func() {
		v, err := c.GetOrLoad(ctx, key, o.loader(key))
		res <- result{v, err}
	}()
	rstest.Eventually(t, 10*time.Second, "waiter waiting", func() bool {
		return rstest.Sum(t, reg, "hearth_readside_misses_total") == 1
	})
	if err := holder.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil || string(r.v) != "value of "+key {
		t.Fatalf("waiter got %q, %v", r.v, r.err)
	}
	if got := o.loads(t, key); got != 2 {
		t.Errorf("loads: %d, want 2 (the killed holder's, then the waiter's)", got)
	}
	if got := rstest.Sum(t, reg, "hearth_readside_lock_wait_seconds", "result", "acquired"); got != 1 {
		t.Errorf("lock waits ended by acquiring: %v, want 1", got)
	}
	if got := rstest.Sum(t, reg, "hearth_readside_fallbacks_total"); got != 0 {
		t.Errorf("fallbacks: %v, want 0", got)
	}
}
