// Package claims keeps one load-and-write of each member in flight at a
// time: a batch waits until no other batch holds any of its members, then
// holds them all until its write returned, so that a later load of a member
// begins after an earlier one's write returned and lands after it.
//
// A batch cut from a run's members list (distinct members) is held as a span
// of that list (its positions), not member by member: two spans of one list
// share a member exactly when their positions overlap, so the usual case —
// only a schedule's batches in flight — costs no map of the members held.
// Batches from anywhere else are held by name, and compared with the spans
// by name.
package claims

import (
	"context"
	"sync"
)

// Place is where a batch sits in a run's members list: the batch is
// List[At:At+len(batch)], and List's members are distinct. The zero Place is
// a batch from no run's list (an admin refresh, a catch-up, a re-read).
type Place struct {
	List []string
	At   int
}

// Known reports whether p is a place in a list.
func (p Place) Known() bool { return p.List != nil }

// Set holds the batches being loaded and written: spans of runs' members
// lists, and members held by name, each with the channel closed when its
// batch's write returned. The zero Set holds nothing.
type Set struct {
	mu    sync.Mutex
	spans []span
	by    map[string]chan struct{}
}

type span struct {
	list   []string
	lo, hi int
	done   chan struct{}
}

// Claim waits until no batch holds any of members, then holds them all, and
// returns the function that lets them go. It holds nothing while it waits,
// so two batches that share members never wait on each other. p is where
// members sit in their run's list (the zero Place: not in one).
func (c *Set) Claim(ctx context.Context, members []string, p Place) (release func(), err error) {
	if p.Known() && (len(members) == 0 || p.At < 0 || p.At+len(members) > len(p.List) || &p.List[p.At] != &members[0]) {
		p = Place{} // not a span of its list: held by name
	}
	for {
		c.mu.Lock()
		busy := c.holder(members, p)
		if busy == nil {
			done := make(chan struct{})
			if p.Known() {
				c.spans = append(c.spans, span{list: p.List, lo: p.At, hi: p.At + len(members), done: done})
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
					if p.Known() {
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
func (c *Set) holder(members []string, p Place) chan struct{} {
	var named map[string]struct{} // members, built only to compare by name
	for _, s := range c.spans {
		if p.Known() && sameSlice(s.list, p.List) {
			if p.At < s.hi && s.lo < p.At+len(members) {
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

// sameSlice reports whether a and b are the same slice (not only equal).
func sameSlice(a, b []string) bool {
	return len(a) == len(b) && len(a) > 0 && &a[0] == &b[0]
}
