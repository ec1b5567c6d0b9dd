package readside

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds on what one flush of recorded reads holds, as the daemon's roll-up
// skips a longer key (accesslog.MaxKeyBytes) and memory must stay bounded
// while Redis is down.
const (
	maxAccessKeyBytes = 1024
	maxAccessKeys     = 100_000
)

// recorder counts sampled reads per bucket and key in memory and adds them to
// Hearth's access buckets every AccessFlush: ZINCRBY <bucket> <n> <key>, and
// EXPIRE <bucket> 86400 NX as the daemon's safety net.
type recorder struct {
	c       *Cache
	stop    chan struct{}
	stopped atomic.Bool // set by Close: no more recording

	mu     sync.Mutex
	counts map[string]map[string]int64 // bucket key → cache key → reads
	n      int
}

func newRecorder(c *Cache) *recorder {
	return &recorder{c: c, stop: make(chan struct{}), counts: map[string]map[string]int64{}}
}

func (r *recorder) record(key string) {
	if r.stopped.Load() {
		return
	}
	every := r.c.o.AccessSample
	if every > 1 && rand.IntN(every) != 0 {
		return
	}
	if len(key) > maxAccessKeyBytes || key == "" {
		r.c.m.accesses.WithLabelValues("dropped").Add(float64(every))
		return
	}
	bucket := AccessKey(r.c.o.Namespace, r.c.o.Now(), r.c.o.AccessBucket)
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.counts[bucket]
	if m == nil {
		m = map[string]int64{}
		r.counts[bucket] = m
	}
	if _, ok := m[key]; !ok {
		if r.n >= maxAccessKeys {
			r.c.m.accesses.WithLabelValues("dropped").Add(float64(every))
			return
		}
		r.n++
	}
	m[key] += int64(every)
}

func (r *recorder) loop() {
	defer r.c.wg.Done()
	t := time.NewTicker(r.c.o.AccessFlush)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), r.c.o.AccessFlush*5)
			if err := r.flush(ctx); err != nil {
				r.c.log.Warn("readside: recording reads failed; they are dropped", "err", err)
			}
			cancel()
		}
	}
}

// flush sends the counts recorded so far. Counts that fail to send are
// dropped, not retried: a ZINCRBY that did apply must not count twice.
func (r *recorder) flush(ctx context.Context) error {
	r.mu.Lock()
	counts, n := r.counts, 0
	r.counts, r.n = map[string]map[string]int64{}, 0
	r.mu.Unlock()
	if len(counts) == 0 {
		return nil
	}
	pipe := r.c.rdb.Pipeline()
	var total int64
	for bucket, m := range counts {
		for key, hits := range m {
			pipe.ZIncrBy(ctx, bucket, float64(hits), key)
			total += hits
			n++
		}
		pipe.ExpireNX(ctx, bucket, AccessExpiry)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		r.c.m.redisErrors.WithLabelValues("access").Inc()
		r.c.m.accesses.WithLabelValues("dropped").Add(float64(total))
		return fmt.Errorf("record %d reads of %d keys: %w", total, n, err)
	}
	r.c.m.accesses.WithLabelValues("sent").Add(float64(total))
	return nil
}
