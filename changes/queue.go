package changes

import (
	"cmp"
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hearth-dev/hearth/warmer"
)

// queue gathers one declaration's changed members and refreshes them from
// its own goroutine, as a database's group commit: when nothing is in flight
// a change is refreshed at once (after the optional coalesce wait); what
// arrives while a refresh runs is gathered into the next one, at most batch
// members, the earliest changed first. At most one refresh of the
// declaration runs at a time. Under sustained change (the last refresh
// carried more than one member and more arrived while it ran) the next one
// gathers for the gather wait (notify.gather, config.DefaultGather unless
// set) from its first member's arrival, as PostgreSQL's commit_delay waits
// only when other commits are in flight: at 2,000 changes a second, loads
// of four members instead of two at the default 3 ms (seven at 5 ms),
// fewer origin queries and less CPU for a few milliseconds of median lag,
// while a change after a quiet spell still goes at once.
type queue struct {
	name     string
	coalesce time.Duration
	gather   time.Duration
	batch    int
	l        *listener
	pace     *pacing
	wake     chan struct{} // something was queued: recompute the deadline

	mu      sync.Mutex
	pending map[string]int64 // member → earliest change time (unix µs)
	all     bool             // a full refresh is wanted
	allTS   int64
	allAt   time.Time // when it was asked for
	// ready is when the first pending member that may be loaded at once
	// arrived (zero: none); held is the earliest time a pending member whose
	// pacing holds it back may go (zero: none).
	ready, held time.Time
	// waiting is the deadline the run loop sleeps until (zero: none) and
	// busy whether it is refreshing: the loop is woken only when what was
	// queued needs an earlier deadline, so that a flood of notifications
	// for what is already pending costs no goroutine switch each, and what
	// arrives during a refresh waits for its end.
	waiting time.Time
	busy    bool
	// last is how many members the last members refresh carried, and
	// gathering whether the pending members' first arrived while a refresh
	// ran after one of more than one: the next refresh waits for gather.
	last      int
	gathering bool
}

// newQueue is declaration name's queue. gather is how long, under sustained
// change, a members refresh waits from its first member's arrival to gather
// more (never past a full batch); an isolated change, or one of a few
// hundred a second, does not wait for it.
func newQueue(name string, coalesce, gather time.Duration, batch int, l *listener, pace *pacing) *queue {
	return &queue{name: name, coalesce: max(0, coalesce), gather: max(0, gather), batch: max(1, batch), l: l, pace: pace,
		wake: make(chan struct{}, 1), pending: map[string]int64{}}
}

func (q *queue) add(p payload, ts time.Time) {
	spec, ok := q.l.w.Spec(q.name)
	if !ok {
		return
	}
	m := q.l.m
	us := ts.UnixMicro()
	now := q.l.now()
	q.mu.Lock()
	defer q.mu.Unlock()
	defer q.signalLocked()
	switch {
	case p.All:
		m.members.WithLabelValues(q.name, "full").Inc()
		q.markAll(us, now)
	case !spec.Template.IsFamily():
		// The one key: a member like any other, paced like one.
		q.queueLocked("", us, now)
	default:
		for _, id := range p.IDs {
			if err := spec.Template.ValidateMember(id); err != nil {
				m.members.WithLabelValues(q.name, "invalid").Inc()
				continue
			}
			q.queueLocked(id, us, now)
		}
	}
}

// queueLocked queues one changed member. Call with q.mu held.
func (q *queue) queueLocked(id string, us int64, now time.Time) {
	m := q.l.m
	if q.all && !q.fullHeld(now) {
		// A full refresh about to run reads this change too.
		m.members.WithLabelValues(q.name, "coalesced").Inc()
		return
	}
	if old, dup := q.pending[id]; dup {
		m.members.WithLabelValues(q.name, "coalesced").Inc()
		q.pending[id] = min(old, us)
		return
	}
	if len(q.pending) >= MaxPendingChanges {
		m.overflows.WithLabelValues(q.name).Inc()
		if !q.all {
			q.l.log.Warn().Str("family", q.name).Int("pending", len(q.pending)).Msg("too many pending changes: one full refresh instead")
		}
		q.markAll(us, now)
		return
	}
	m.members.WithLabelValues(q.name, "queued").Inc()
	q.pending[id] = us
	if due := q.pace.members.due(id); due.After(now) {
		if q.held.IsZero() || due.Before(q.held) {
			q.held = due
		}
	} else if q.ready.IsZero() {
		q.ready = now
		q.gathering = q.busy && q.last > 1
	}
}

// fullHeld reports whether a wanted full refresh must wait for its pacing
// longer than the coalesce wait. Call with q.mu held.
func (q *queue) fullHeld(now time.Time) bool {
	return q.pace.full.due("").After(now.Add(q.coalesce))
}

// markAll asks for one full refresh; us is the earliest change it stands for
// (0: none, nothing to measure). When it can run soon it replaces the
// pending members; when its pacing holds it back they are still loaded
// meanwhile. Call with q.mu held.
func (q *queue) markAll(us int64, now time.Time) {
	if !q.all {
		q.allAt = now
	}
	if !q.fullHeld(now) {
		for _, t := range q.pending {
			us = earliest(us, t)
		}
		clear(q.pending)
		q.ready, q.held = time.Time{}, time.Time{}
	}
	if q.all {
		us = earliest(us, q.allTS)
	}
	q.all, q.allTS = true, us
}

// earliest is the earlier of two change times, 0 meaning none.
func earliest(a, b int64) int64 {
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
}

// full queues a full refresh (on every new LISTEN session): it catches up
// what changed while nobody listened, and measures no change.
func (q *queue) full() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.markAll(0, q.l.now())
	q.signalLocked()
}

// signalLocked wakes the run loop if it sleeps past the deadline now due (a
// busy loop recomputes it when its refresh ends). Call with q.mu held.
func (q *queue) signalLocked() {
	if q.busy {
		return
	}
	if at, ok := q.deadline(); !ok || (!q.waiting.IsZero() && !at.Before(q.waiting)) {
		return
	}
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// deadline is when the queue should refresh next (ok false: nothing
// pending). Call with q.mu held.
func (q *queue) deadline() (at time.Time, ok bool) {
	consider := func(t time.Time) {
		if !ok || t.Before(at) {
			at, ok = t, true
		}
	}
	if q.all {
		due := q.allAt.Add(q.coalesce)
		if d := q.pace.full.due(""); d.After(due) {
			due = d
		}
		consider(due)
	}
	if !q.ready.IsZero() {
		wait := q.coalesce
		if q.gathering && len(q.pending) < q.batch {
			wait = max(wait, q.gather)
		}
		consider(q.ready.Add(wait))
	}
	if !q.held.IsZero() {
		consider(q.held)
	}
	return at, ok
}

// run refreshes what the queue gathers, each at its deadline, until ctx ends.
// A deadline already passed (the first change after an idle spell, what
// gathered during the last refresh) is refreshed without a timer.
func (q *queue) run(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		q.mu.Lock()
		at, ok := q.deadline()
		q.waiting, q.busy = time.Time{}, false
		wait := time.Duration(0)
		if ok {
			wait = at.Sub(q.l.now())
		}
		if ok && wait <= 0 {
			q.busy = true
			q.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
			q.fire(ctx)
			continue
		}
		if ok {
			q.waiting = at
			t.Reset(wait)
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-q.wake:
			t.Stop()
			continue
		case <-t.C:
		}
		q.mu.Lock()
		q.waiting, q.busy = time.Time{}, true
		q.mu.Unlock()
		q.fire(ctx)
	}
}

// fire runs the refresh that is due: the full refresh if its pacing allows,
// else up to batch of the pending members that theirs allows.
func (q *queue) fire(ctx context.Context) {
	now := q.l.now()
	q.mu.Lock()
	p := q.pace
	if q.all && !p.full.due("").After(now) {
		p.full.take("", now)
		allTS := q.allTS
		// The members pending now changed before the full refresh reads.
		q.all, q.allTS = false, 0
		clear(q.pending)
		q.ready, q.held = time.Time{}, time.Time{}
		q.mu.Unlock()
		q.refreshFull(ctx, allTS)
		return
	}
	if q.ready.IsZero() && (q.held.IsZero() || q.held.After(now)) {
		q.mu.Unlock()
		return // woken early: nothing is due yet
	}
	due := make([]string, 0, min(len(q.pending), 4*q.batch))
	q.held = time.Time{}
	for id := range q.pending {
		if d := p.members.due(id); d.After(now) {
			if q.held.IsZero() || d.Before(q.held) {
				q.held = d
			}
			continue
		}
		due = append(due, id)
	}
	ready := q.ready
	q.ready, q.gathering = time.Time{}, false
	if len(due) > q.batch {
		// The cap: the earliest changed go now, the rest at once after
		// (their wait is over: ready stays as it was).
		slices.SortFunc(due, func(a, b string) int {
			return cmp.Or(cmp.Compare(q.pending[a], q.pending[b]), cmp.Compare(a, b))
		})
		due = due[:q.batch]
		q.ready = ready
	}
	q.mu.Unlock()
	if len(due) == 0 {
		return
	}

	// Only members the declaration keeps warm are loaded, and only they
	// spend a token: the pacing state stays as small as what is loaded.
	hot, ok := q.l.w.Hot(q.name, due)
	q.mu.Lock()
	pending := make(map[string]int64, len(hot))
	if ok {
		for _, id := range hot {
			if ts, ok := q.pending[id]; ok {
				pending[id] = ts
				p.members.take(id, now)
			}
		}
	}
	for _, id := range due {
		delete(q.pending, id)
	}
	p.members.sweep(now)
	q.last = len(due)
	q.mu.Unlock()
	if n := len(due) - len(pending); n > 0 {
		q.l.m.members.WithLabelValues(q.name, "not_declared").Add(float64(n))
	}
	if len(pending) > 0 && !ready.IsZero() {
		q.l.m.wait.WithLabelValues(q.name).Observe(max(0, q.l.now().Sub(ready)).Seconds())
	}
	q.refreshMembers(ctx, pending)
}

func (q *queue) refreshFull(ctx context.Context, allTS int64) {
	if ctx.Err() != nil {
		return
	}
	m, log := q.l.m, q.l.log
	m.refreshes.WithLabelValues(q.name, "full").Inc()
	out, err := q.l.w.Refresh(ctx, q.name, warmer.RunOptions{})
	if err != nil {
		log.Warn().Str("family", q.name).Err(err).Int("failed", out.Failed).Msg("change-driven full refresh incomplete")
		return
	}
	if allTS != 0 {
		m.lag.WithLabelValues(q.name).Observe(q.since(allTS))
	}
}

// refreshMembers loads one batch (at most q.batch members, fire's cap).
func (q *queue) refreshMembers(ctx context.Context, pending map[string]int64) {
	if len(pending) == 0 || ctx.Err() != nil {
		return
	}
	m, log := q.l.m, q.l.log
	batch := make([]string, 0, len(pending))
	for id := range pending {
		batch = append(batch, id)
	}
	sort.Strings(batch)
	m.refreshes.WithLabelValues(q.name, "members").Inc()
	out, err := q.l.w.RefreshMembers(ctx, q.name, batch)
	if err != nil && out.Written+out.Negative == 0 {
		log.Warn().Str("family", q.name).Int("members", len(batch)).Err(err).Msg("change-driven refresh failed; the schedule retries")
		return
	}
	for _, id := range batch {
		m.lag.WithLabelValues(q.name).Observe(q.since(pending[id]))
	}
}

// since is the seconds from a change (unix µs) to now.
func (q *queue) since(us int64) float64 {
	return max(0, q.l.now().Sub(time.UnixMicro(us)).Seconds())
}
