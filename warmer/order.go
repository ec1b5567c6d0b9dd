package warmer

import (
	"context"
	"sync"
)

// Ordering of a plain declaration's writes. A version-checked declaration
// (Stamped) orders its writes in Redis: a write never replaces a value its
// record says is newer. A plain one has no record, and several paths load its
// members at once — the schedule, the origin's recovery (RefreshFailing), a
// re-warm, the catch-up, an admin refresh, the negative re-check — so a load
// that read an older row could land after one that read a newer row (the
// soak saw 14 keys go back a version when a recovery refresh overlapped a
// scheduled run whose writes were slow). claims keeps one load-and-write of
// each member in flight at a time: a batch waits until no other batch of its
// declaration holds any of its members, so the later load of a member begins
// after the earlier one's write returned, and lands after it.

// claims maps each member being loaded and written to the channel closed
// when that batch's write returned.
type claims struct {
	mu sync.Mutex
	by map[string]chan struct{}
}

// claim waits until no batch holds any of members, then holds them all, and
// returns the function that lets them go. It holds nothing while it waits,
// so two batches that share members never wait on each other.
func (c *claims) claim(ctx context.Context, members []string) (release func(), err error) {
	for {
		c.mu.Lock()
		var busy chan struct{}
		for _, m := range members {
			if ch, ok := c.by[m]; ok {
				busy = ch
				break
			}
		}
		if busy == nil {
			done := make(chan struct{})
			if c.by == nil {
				c.by = make(map[string]chan struct{}, len(members))
			}
			for _, m := range members {
				c.by[m] = done
			}
			c.mu.Unlock()
			var once sync.Once
			return func() {
				once.Do(func() {
					c.mu.Lock()
					for _, m := range members {
						delete(c.by, m) // held by this batch alone until now
					}
					c.mu.Unlock()
					close(done)
				})
			}, nil
		}
		c.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}
