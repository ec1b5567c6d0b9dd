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
//
// A scheduled run's batch is held as a span of the run's members list (its
// positions), not member by member: the run's members are distinct, so two
// spans of one list share a member exactly when their positions overlap, and
// the usual case (only the schedule loading) costs no map of the members in
// flight. Batches from anywhere else are held by name, and compared with the
// spans by name.

// place is where a batch sits in a run's members list: the batch is
// list[at:at+len(batch)], and list's members are distinct. The zero place is
// a batch from no run's list (an admin refresh, a catch-up, a re-read).
type place struct {
	list []string
	at   int
}

func (p place) known() bool { return p.list != nil }

// claims holds the batches being loaded and written: spans of runs' members
// lists, and members held by name, each with the channel closed when its
// batch's write returned.
type claims struct {
	mu    sync.Mutex
	spans []span
	by    map[string]chan struct{}
}

type span struct {
	list   []string
	lo, hi int
	done   chan struct{}
}

// claim waits until no batch holds any of members, then holds them all, and
// returns the function that lets them go. It holds nothing while it waits,
// so two batches that share members never wait on each other. p is where
// members sit in their run's list (the zero place: not in one).
func (c *claims) claim(ctx context.Context, members []string, p place) (release func(), err error) {
	if p.known() && (len(members) == 0 || p.at < 0 || p.at+len(members) > len(p.list) || &p.list[p.at] != &members[0]) {
		p = place{} // not a span of its list: held by name
	}
	for {
		c.mu.Lock()
		busy := c.holder(members, p)
		if busy == nil {
			done := make(chan struct{})
			if p.known() {
				c.spans = append(c.spans, span{list: p.list, lo: p.at, hi: p.at + len(members), done: done})
			} else {
				if c.by == nil {
					c.by = make(map[string]chan struct{}, len(members))
				}
				for _, m := range members {
					c.by[m] = done
				}
			}
			c.mu.Unlock()
			var once sync.Once
			return func() {
				once.Do(func() {
					c.mu.Lock()
					if p.known() {
						for i := range c.spans {
							if c.spans[i].done == done {
								c.spans[i] = c.spans[len(c.spans)-1]
								c.spans[len(c.spans)-1] = span{}
								c.spans = c.spans[:len(c.spans)-1]
								break
							}
						}
					} else {
						for _, m := range members {
							delete(c.by, m) // held by this batch alone until now
						}
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

// holder is the done channel of a batch holding one of members, nil if none
// does. Call with c.mu held.
func (c *claims) holder(members []string, p place) chan struct{} {
	var named map[string]struct{} // members, built only to compare by name
	for _, s := range c.spans {
		if p.known() && sameSlice(s.list, p.list) {
			if p.at < s.hi && s.lo < p.at+len(members) {
				return s.done
			}
			continue
		}
		if named == nil {
			named = make(map[string]struct{}, len(members))
			for _, m := range members {
				named[m] = struct{}{}
			}
		}
		for _, m := range s.list[s.lo:s.hi] {
			if _, ok := named[m]; ok {
				return s.done
			}
		}
	}
	if len(c.by) > 0 {
		for _, m := range members {
			if ch, ok := c.by[m]; ok {
				return ch
			}
		}
	}
	return nil
}
